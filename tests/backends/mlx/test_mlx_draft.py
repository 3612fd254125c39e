"""The MLX draft model on the real default model (kept tiny: mlx[cpu] is slow here):
early-exit drafting is lossless, the draft cache equals a fresh prefill after a
correction, and CARD's worker on its own MLX stream is lossless under random delays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.prompts import OWN_PROMPTS

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

pytestmark = [pytest.mark.slow, pytest.mark.mlx]

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def mlx_model(default_model_dir: Path):  # type: ignore[no-untyped-def]
    import draftwise

    return draftwise.load(default_model_dir, backend="mlx", dtype="float32")


def greedy(model, prompt, drafter, **kw):  # type: ignore[no-untyped-def]
    import draftwise

    last = None
    for r in draftwise.stream_generate(model, prompt, drafter=drafter, max_tokens=MAX_TOKENS, **kw):
        last = r
    return last


def test_mlx_draft_lossless_and_cache_consistent(mlx_model):  # type: ignore[no-untyped-def]
    from draftwise.backends.mlx.draft import MLXDraftLM, early_exit
    from draftwise.core.drafters.candidate_cache import CandidateCache
    from draftwise.core.drafters.draft_model import DraftModelDrafter
    from draftwise.drafting.draft_models import build_draft_lm

    lm = build_draft_lm(mlx_model.drafting, layers=4)
    assert lm.model.layers[0] is mlx_model.backend.model.layers[0]  # shared, not copied
    plain = greedy(mlx_model, OWN_PROMPTS[0], "none").token_ids
    d = DraftModelDrafter(lm, beam=2, topk=2, depth=3)
    assert greedy(mlx_model, OWN_PROMPTS[0], d).token_ids == plain

    cache = CandidateCache(beam=2, topk=2, max_depth=2)
    ctx = np.asarray(mlx_model.encode_prompt(OWN_PROMPTS[2]))[:40]
    cache.sync(lm, ctx)
    while cache.grow(lm):
        pass
    snap = cache.snapshot()
    leaf = int(np.flatnonzero(snap.depth == 2)[0])
    path = [int(snap.tokens[snap.parents[leaf]]), int(snap.tokens[leaf])]
    assert cache.sync(lm, np.concatenate([ctx, path]))  # a hit two tokens deep
    fresh = MLXDraftLM(early_exit(mlx_model.backend.model, 4, lm.context_limit))
    fresh.prefill(np.concatenate([ctx, path])[:-1])
    n = lm.cache_len
    for a, b in zip(lm.model.cache_arrays(), fresh.model.cache_arrays(), strict=True):
        assert np.allclose(np.array(a[:, :, :n]), np.array(b[:, :, :n]), atol=1e-4)


def test_mlx_card_worker_stream_lossless_with_random_delays(mlx_model):  # type: ignore[no-untyped-def]
    """CARD on MLX: the worker thread drafts on its own CPU stream while the target
    decodes; greedy and T=0.8 (same seed) equal ``none`` on every run, with random delays
    injected before the worker's draft forwards; close() joins the worker."""
    import random
    import threading
    import time

    prompt = OWN_PROMPTS[0]
    plain = greedy(mlx_model, prompt, "none").token_ids
    hot = greedy(mlx_model, prompt, "none", temp=0.8, seed=5).token_ids
    before = threading.active_count()
    spec = "card:layers=6,beam=3,topk=2,depth=4"
    card = mlx_model.drafter(spec)
    assert "mlx cpu stream" in card.layout
    rng = random.Random(7)
    card._worker.on_forward = lambda: time.sleep(rng.choice([0.0, 0.001, 0.02, 0.08]))
    for _ in range(2):  # timing changes what is drafted, never what is emitted
        assert greedy(mlx_model, prompt, spec).token_ids == plain
        assert greedy(mlx_model, prompt, spec, temp=0.8, seed=5).token_ids == hot
    assert card.stats()["forwards"] > 0 and card.worker_alive
    card.close()
    assert not card.worker_alive and threading.active_count() == before
    # a new worker (new thread, new stream) rebuilds the draft cache in its own thread
    assert greedy(mlx_model, prompt, spec).token_ids == plain
    card.close()
    assert threading.active_count() == before
