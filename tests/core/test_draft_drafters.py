"""Draft-model drafting (sequential and CARD's worker thread) on fake models: lossless at
T = 0 and, with the same seed, at T = 0.8, whatever the worker's timing; draft cache kept
in step with the target; the worker stops on close, errors and garbage collection."""

from __future__ import annotations

import gc
import random
import threading
import time

import numpy as np
import pytest

from draftwise.core.decode import Decoder
from draftwise.core.drafters.base import NoDrafter
from draftwise.core.drafters.card import CardDrafter
from draftwise.core.drafters.draft_model import DraftModelDrafter
from draftwise.core.sampling import SamplingParams
from draftwise.errors import DraftwiseError
from tests.core.fake_draft import FakeDraftLM
from tests.fakes import FakeBackend

V = 8
PROMPT = np.array([1, 2, 3, 4, 5, 6], np.int64)


class SlowTarget(FakeBackend):
    """A target whose verify takes a while (a real forward releases the GIL like this)."""

    delay = 0.0

    def verify(self, root, tree, need_logits):  # type: ignore[no-untyped-def]
        if self.delay:
            time.sleep(self.delay)
        return super().verify(root, tree, need_logits)


def target(delay: float = 0.0) -> FakeBackend:
    be = SlowTarget(vocab_size=V, sharpness=3.0, seed=0)
    be.delay = delay
    return be


def similar_draft(noise: float = 0.5, seed: int = 3) -> FakeDraftLM:
    """A draft whose table is the target's plus noise: often right, sometimes wrong."""
    lm = FakeDraftLM(vocab_size=V, seed=seed)
    rng = np.random.default_rng(seed)
    logits = target().table.astype(np.float64) + rng.standard_normal((V, V, V)) * noise
    lm.table = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return lm


def run(drafter, params, n=40, seed=None, budget=8, prompt=PROMPT, delay=0.0):  # type: ignore[no-untyped-def]
    be = target(delay)
    dec = Decoder(be)
    steps = list(dec.steps(prompt, drafter, params, n, seed=seed, budget=budget))
    return [t for s in steps for t in s.tokens], steps, dec


GREEDY = SamplingParams()
HOT = SamplingParams(temperature=0.8)


@pytest.mark.parametrize("make", [
    lambda: DraftModelDrafter.chain(similar_draft(), n=4),
    lambda: DraftModelDrafter(similar_draft(), beam=3, topk=2, depth=4),
    lambda: DraftModelDrafter(similar_draft(noise=3.0), beam=2, topk=3, depth=3),
])
def test_sequential_lossless_greedy_and_seeded(make):  # type: ignore[no-untyped-def]
    plain, plain_steps, _ = run(NoDrafter(), GREEDY)
    out, steps, _ = run(make(), GREEDY)
    assert out == plain
    assert len(steps) < len(plain_steps)
    hot_plain, _, _ = run(NoDrafter(), HOT, seed=7)
    hot, _, _ = run(make(), HOT, seed=7)
    assert hot == hot_plain


def test_draft_cache_in_step_after_rejections_and_early_stop():
    lm = similar_draft(noise=2.0)
    d = DraftModelDrafter(lm, beam=2, topk=2, depth=4)
    be = target()
    dec = Decoder(be)
    gen = dec.steps(PROMPT, d, GREEDY, 30)
    seq = PROMPT.tolist()
    for _ in range(5):
        seq += next(gen).tokens
        d.propose(np.asarray(seq), 8)  # what the loop does next: lm caches seq[:-1]
        assert lm.cached == seq[:-1]
    gen.close()  # early stop: the target rewinds; the draft follows on the next prompt
    other = np.array([1, 2, 7, 7], np.int64)
    out, _, _ = run(d, GREEDY, prompt=other)
    plain, _, _ = run(NoDrafter(), GREEDY, prompt=other)
    assert out == plain and lm.cached[:3] == [1, 2, 7]


def jitter(rng: random.Random):  # type: ignore[no-untyped-def]
    def sleep() -> None:
        time.sleep(rng.choice([0.0, 0.0, 0.0005, 0.002, 0.01]))
    return sleep


def test_card_lossless_with_random_worker_delays():
    plain, _, _ = run(NoDrafter(), GREEDY)
    hot_plain, _, _ = run(NoDrafter(), HOT, seed=11)
    rng = random.Random(0)
    total_drafted = 0
    for trial in range(12):
        noise = [0.3, 1.0, 4.0][trial % 3]
        with CardDrafter(similar_draft(noise, seed=trial), beam=3, topk=2, depth=5,
                         on_forward=jitter(rng)) as card:
            out, steps, _ = run(card, GREEDY, delay=0.002)
            assert out == plain, f"trial {trial}"
            total_drafted += sum(s.drafted for s in steps)
            hot, _, _ = run(card, HOT, seed=11, delay=rng.choice([0.0, 0.002]))
            assert hot == hot_plain, f"trial {trial}"
    assert total_drafted > 0  # the worker's trees were used


def test_card_worker_stops_on_close_error_and_gc():
    before = threading.active_count()
    card = CardDrafter(similar_draft(), beam=2, topk=2, depth=4)
    run(card, GREEDY, n=10)
    assert card.worker_alive
    card.close()
    assert not card.worker_alive and threading.active_count() == before
    run(card, GREEDY, n=5)  # usable again: a new worker
    del card
    gc.collect()
    time.sleep(0.05)
    assert threading.active_count() == before

    class Broken(FakeDraftLM):
        def expand(self, *a, **k):  # type: ignore[no-untyped-def]
            raise RuntimeError("device lost")

    card = CardDrafter(Broken(vocab_size=V), beam=2, topk=2, depth=4)
    with pytest.raises(DraftwiseError, match="device lost"):
        for _ in range(200):
            run(card, GREEDY, n=3)
            time.sleep(0.005)
    assert not card.worker_alive
    card.lm.expand = FakeDraftLM.expand.__get__(card.lm)  # the device is back
    card.reset()  # clears the error: the next generation starts a new worker
    out, _, _ = run(card, GREEDY, n=5)
    assert card.worker_alive
    card.close()
    assert threading.active_count() == before


def test_card_reset_and_cancel_midway():
    card = CardDrafter(similar_draft(), beam=2, topk=2, depth=4,
                       on_forward=jitter(random.Random(1)))
    try:
        be = target()
        dec = Decoder(be)
        gen = dec.steps(PROMPT, card, GREEDY, 40)
        for _ in range(3):
            next(gen)
        gen.close()  # a cancel: the target rewinds, the worker keeps its cache until told
        card.reset()
        plain, _, _ = run(NoDrafter(), GREEDY)
        out, _, _ = run(card, GREEDY)
        assert out == plain
    finally:
        card.close()


@pytest.mark.parametrize("opts", [{"verify": "chain"}, {"correct": False}])
def test_card_chain_and_no_correction_ablation_stay_lossless(opts):  # type: ignore[no-untyped-def]
    plain, _, _ = run(NoDrafter(), GREEDY)
    rng = random.Random(5)
    drafted = 0
    for trial in range(4):
        with CardDrafter(similar_draft(0.5, seed=trial), beam=3, topk=2, depth=5,
                         on_forward=jitter(rng), **opts) as card:
            out, steps, _ = run(card, GREEDY, delay=0.002)
            assert out == plain
            drafted += sum(s.drafted for s in steps)
            if opts.get("verify") == "chain":
                assert all(s.drafted <= 8 for s in steps)
    assert drafted > 0
    with pytest.raises(DraftwiseError, match="card verify must be one of tree, chain"):
        CardDrafter(similar_draft(), verify="wide")
