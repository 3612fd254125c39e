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


def first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def check_identical(model, prompt, drafters=("cacheback",)):
    plain, _ = greedy_ids(model, prompt, "none")
    lasts = {}
    for name in drafters:
        model.drafter(name).reset()  # each prompt starts from a fresh drafter
        spec, lasts[name] = greedy_ids(model, prompt, name)
        assert spec == plain, f"{name}: first difference at token {first_difference(spec, plain)}"
    return lasts


@pytest.mark.parametrize("prompt", OWN_PROMPTS)
def test_identical_own_prompts(torch_model, prompt):
    check_identical(torch_model, prompt, ("cacheback", "ssd", "cacheback+ssd", "auto"))


def test_identical_specbench(torch_model):
    rows = one_per_category(bench_prompts(), CATEGORIES)
    mats = {}
    for row in rows:
        lasts = check_identical(torch_model, row["turns"][0], ("cacheback", "auto"))
        mats[row["category"]] = lasts["cacheback"].mean_accepted
    print("cacheback mean accepted per category:", mats)
    assert mats["summarization"] > 1.5 or mats["rag"] > 1.5
