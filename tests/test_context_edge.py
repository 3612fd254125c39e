"""The context edge is lossless too: on the real default model, with the context limit set
small, every drafter emits exactly plain decoding's tokens up to the limit (prompt and
output together never hold more than ``context_limit`` tokens), and sizes no generation
could use are refused in one line before anything is allocated."""

from __future__ import annotations

import tracemalloc

import pytest

from tests.prompts import OWN_PROMPTS

pytestmark = [pytest.mark.slow, pytest.mark.torch]
pytest.importorskip("torch")

LIMIT = 256
DRAFTERS = ("cacheback:budget=64", "auto", "redrafter")


@pytest.fixture(scope="module")
def edge_model(default_model_dir):
    import draftwise
    from draftwise.core.costmodel import CostModel

    model = draftwise.load(default_model_dir)  # the default mode
    model.backend.context_limit = LIMIT  # the cache is larger; the limit is what counts
    # a flat curve: auto drafts the widest trees it may, right up to the edge
    model.assets.use_cost_profile(CostModel(rows=[1, 64], ms=[1.0, 1.0]))
    return model


def prompt_ids(model, n: int) -> list[int]:
    """``n`` token ids of text the drafters guess well (repeated), so trees run deep."""
    text = " ".join(OWN_PROMPTS) * 20
    ids = model.tokenizer.encode(text)
    assert len(ids) >= n
    return list(ids[:n])


def generate_ids(model, ids, drafter, max_tokens):
    import draftwise

    last = None
    for r in draftwise.stream_generate(
        model, ids, drafter=drafter, max_tokens=max_tokens, chat_template=False
    ):
        last = r
    return list(last.token_ids), last.finish_reason


@pytest.mark.parametrize(
    "left, max_tokens, want",
    [(1, 16, 1), (16, 16, 16), (100, 200, 100)],
    ids=["limit-1", "limit-16", "limit-100"],
)
def test_every_drafter_stops_where_plain_decoding_does(edge_model, left, max_tokens, want):
    ids = prompt_ids(edge_model, LIMIT - left)
    plain, finish = generate_ids(edge_model, ids, "none", max_tokens)
    eos = set(edge_model.tokenizer.eos_token_ids)
    assert len(plain) == want or (plain and plain[-1] in eos), (len(plain), finish)
    assert len(ids) + len(plain) <= LIMIT
    for name in DRAFTERS:
        edge_model.drafter(name).reset()
        got, got_finish = generate_ids(edge_model, ids, name, max_tokens)
        assert got == plain, f"{name}: {len(got)} tokens against none's {len(plain)}"
        assert got_finish == finish, name
    assert edge_model.backend.cache_len <= LIMIT


def test_sizes_no_generation_could_use_fail_in_one_line_without_allocating(edge_model):
    import draftwise
    from draftwise.errors import DraftwiseError

    tracemalloc.start()
    try:
        with pytest.raises(DraftwiseError, match=r"max_tokens must be at most 16777216, got 1000000000000") as e:
            draftwise.generate(edge_model, "Say hello.", max_tokens=10**12)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "\n" not in str(e.value)
    assert peak < 2**20  # no array of max_tokens entries (that would be 7 TiB)
    with pytest.raises(DraftwiseError, match="draft budget must be at most"):
        draftwise.generate(edge_model, "Say hello.", max_tokens=4, budget=10**9)
    with pytest.raises(DraftwiseError, match="max_tokens must be >= 1"):
        draftwise.generate(edge_model, "Say hello.", max_tokens=0)
