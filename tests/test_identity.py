"""Lossless on the real default model: speculative greedy output equals plain greedy
decoding of the same backend, token for token (float32)."""

from __future__ import annotations

import pytest

from tests.prompts import OWN_PROMPTS, bench_prompts, one_per_category

pytestmark = [pytest.mark.slow, pytest.mark.torch]
torch = pytest.importorskip("torch")

CATEGORIES = ["writing", "coding", "extraction", "reasoning", "humanities",
              "translation", "summarization", "qa", "math_reasoning", "rag"]
MAX_TOKENS = 128


def greedy_ids(model, prompt, drafter, **kw):
    import draftwise

    last = None
    for r in draftwise.stream_generate(model, prompt, drafter=drafter, max_tokens=MAX_TOKENS, **kw):
        last = r
    return last.token_ids, last


def check_identical(model, prompt):
    plain, _ = greedy_ids(model, prompt, "none")
    model.drafter("cacheback").reset()  # each prompt starts from an empty table
    spec, last = greedy_ids(model, prompt, "cacheback")
    assert spec == plain, f"first difference at token {next(i for i, (a, b) in enumerate(zip(spec, plain)) if a != b) if len(spec) == len(plain) else min(len(spec), len(plain))}"
    return last


@pytest.mark.parametrize("prompt", OWN_PROMPTS)
def test_identical_own_prompts(torch_model, prompt):
    check_identical(torch_model, prompt)


def test_identical_specbench(torch_model):
    rows = one_per_category(bench_prompts(), CATEGORIES)
    mats = {}
    for row in rows:
        last = check_identical(torch_model, row["turns"][0])
        mats[row["category"]] = last.mean_accepted
    print("mean accepted per category:", mats)
    assert mats["summarization"] > 1.5 or mats["rag"] > 1.5
