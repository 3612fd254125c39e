"""The torch draft model on the real default model: early exit shares the target's weights,
the draft cache stays equal to a fresh prefill after hits, misses and rewinds, and
draft-model drafting (chain, tree, CARD) is lossless against plain decoding."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.prompts import OWN_PROMPTS

pytestmark = [pytest.mark.slow, pytest.mark.torch]
torch = pytest.importorskip("torch")

from draftwise.backends.cuda.draft import TorchDraftLM, early_exit  # noqa: E402
from draftwise.core.drafters.candidate_cache import CandidateCache  # noqa: E402
from draftwise.core.drafters.card import CardDrafter  # noqa: E402
from draftwise.core.drafters.draft_model import DraftModelDrafter  # noqa: E402

MAX_TOKENS = 32


def draft_lm(model, layers: int) -> TorchDraftLM:  # type: ignore[no-untyped-def]
    be = model.backend
    return TorchDraftLM(early_exit(be.model, layers, be.context_limit + 256), be.vocab_size)


def test_early_exit_shares_weights_and_full_depth_is_the_target(torch_model):  # type: ignore[no-untyped-def]
    be = torch_model.backend
    n = be.model.cfg.n_layers
    lm = draft_lm(torch_model, n)
    assert lm.model.layers[3].wqkv.data_ptr() == be.model.layers[3].wqkv.data_ptr()
    assert lm.model.lm_head.data_ptr() == be.model.lm_head.data_ptr()
    assert lm.model.cache.data_ptr() != be.model.cache.data_ptr()
    assert draft_lm(torch_model, 4).model.cache.shape[0] == 4
    ids = np.asarray(torch_model.encode_prompt(OWN_PROMPTS[0]))
    lm.prefill(ids[:-1])
    top, _ = lm.expand(ids[-1:], np.array([0]), np.ones((1, 1), bool), 3)
    from draftwise.core.decode import Decoder
    from draftwise.core.drafters.base import NoDrafter
    from draftwise.core.sampling import SamplingParams

    dec = Decoder(be)
    step = next(dec.steps(ids, NoDrafter(), SamplingParams(), 1))
    assert top[0, 0] == step.tokens[0]


def test_draft_cache_equals_fresh_prefill_after_corrections(torch_model):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    lm = draft_lm(torch_model, 3)
    cache = CandidateCache(beam=3, topk=2, max_depth=4)
    ctx = np.asarray(torch_model.encode_prompt(OWN_PROMPTS[1]))
    cache.sync(lm, ctx)
    outcomes = []
    for it in range(8):
        while cache.grow(lm):
            pass
        snap = cache.snapshot()
        kind = it % 3
        if kind == 0:  # a hit: accept an existing path
            node, path = int(rng.integers(1, snap.tokens.size)), []
            while node > 0:
                path.append(int(snap.tokens[node]))
                node = int(snap.parents[node])
            ctx = np.concatenate([ctx, path[::-1]])
        elif kind == 1:  # a miss: a token the tree does not have after the root
            kids = set(snap.tokens[snap.parents == 0].tolist())
            ctx = np.append(ctx, next(t for t in range(100, 200) if t not in kids))
        else:  # a rewind (early stop, edited chat): the context is cut back
            ctx = ctx[: ctx.size - 3]
        outcomes.append(cache.sync(lm, ctx))
        fresh = TorchDraftLM(early_exit(torch_model.backend.model, 3, lm.context_limit))
        fresh.prefill(ctx[:-1])
        assert lm.cache_len == ctx.size - 1
        n = lm.cache_len
        got, want = lm.model.cache[:, :, :, :n], fresh.model.cache[:, :, :, :n]
        assert torch.allclose(got, want, atol=1e-4)
    assert True in outcomes and False in outcomes


def greedy(model, prompt, drafter, **kw):  # type: ignore[no-untyped-def]
    import draftwise

    last = None
    for r in draftwise.stream_generate(model, prompt, drafter=drafter, max_tokens=MAX_TOKENS, **kw):
        last = r
    return last


@pytest.mark.parametrize("prompt", OWN_PROMPTS[:2])
def test_draft_model_and_card_identical_to_plain(torch_model, prompt):  # type: ignore[no-untyped-def]
    plain = greedy(torch_model, prompt, "none").token_ids
    hot_plain = greedy(torch_model, prompt, "none", temp=0.8, seed=5).token_ids
    lm = draft_lm(torch_model, 6)
    for d in (DraftModelDrafter.chain(lm, 4), DraftModelDrafter(lm, beam=3, topk=3, depth=4)):
        d.reset()
        assert greedy(torch_model, prompt, d).token_ids == plain
    before = threading.active_count()
    with CardDrafter(draft_lm(torch_model, 6), beam=4, topk=3, depth=5,
                     thread_init=lambda: torch.set_num_threads(1)) as card:
        r = greedy(torch_model, prompt, card)
        assert r.token_ids == plain
        assert greedy(torch_model, prompt, card, temp=0.8, seed=5).token_ids == hot_plain
        assert card.stats()["forwards"] > 0
    assert threading.active_count() == before


def test_registry_specs_session_cancel_and_close(torch_model, default_model_dir):  # type: ignore[no-untyped-def]
    """``draft``/``card`` built from specs (early exit and --draft-model), lossless; a
    cancelled CARD generation leaves both caches usable; closing the session stops the
    worker thread."""
    import random
    import time

    from draftwise import Session
    from draftwise.session import CancelToken

    prompt = OWN_PROMPTS[2]
    plain = greedy(torch_model, prompt, "none").token_ids
    for spec in ("draft:layers=8,beam=1,topk=1,depth=3", "draft:layers=12,head=8192",
                 f"draft:model={default_model_dir},beam=2,topk=2,depth=3"):
        assert greedy(torch_model, prompt, spec).token_ids == plain, spec
    before = threading.active_count()
    rng = random.Random(3)
    spec = "card:layers=6,beam=3,topk=2,depth=4"
    card = torch_model.drafter(spec)
    card._worker.on_forward = lambda: time.sleep(rng.choice([0.0, 0.001, 0.02, 0.08]))
    session = Session(torch_model, drafter=spec)
    token = CancelToken()
    for i, _ in enumerate(session.stream(prompt, max_tokens=MAX_TOKENS, cancel=token)):
        if i == 3:
            token.cancel()
    assert torch_model.decoder.cached  # the target kept a consistent prefix
    for _ in range(3):  # random worker delays change what is drafted, never the output
        assert [t for r in session.stream(prompt, max_tokens=MAX_TOKENS) for t in r.tokens] == plain
    assert card.worker_alive
    session.close()
    assert not card.worker_alive and threading.active_count() == before
