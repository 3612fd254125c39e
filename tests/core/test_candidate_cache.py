"""CARD's candidate cache: construction equals a brute-force top-K by path score, and
correction keeps exactly the descendants of the accepted path."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from draftwise.core.drafters.candidate_cache import CandidateCache, Snapshot
from draftwise.errors import DraftwiseError
from tests.core.fake_draft import FakeDraftLM

CONTEXT = np.array([3, 1, 4, 1, 5], np.int64)


def grown(lm, beam, topk, depth, context=CONTEXT):  # type: ignore[no-untyped-def]
    cache = CandidateCache(beam, topk, depth)
    cache.sync(lm, context)
    while cache.grow(lm):
        pass
    return cache


def paths(snap: Snapshot) -> dict[tuple[int, ...], int]:
    """Token path from the root (excluded) of every node -> node index."""
    out: dict[tuple[int, ...], int] = {(): 0}
    for i in range(1, snap.tokens.size):
        out[paths_of(snap, i)] = i
    return out


def paths_of(snap: Snapshot, i: int) -> tuple[int, ...]:
    toks = []
    while i > 0:
        toks.append(int(snap.tokens[i]))
        i = int(snap.parents[i])
    return tuple(toks[::-1])


def brute_force_layers(lm: FakeDraftLM, context, beam, topk, depth):  # type: ignore[no-untyped-def]
    """Equations 1-9 of seed 002 by enumeration: per layer, the primary set C(l), and
    every secondary candidate with its path log-score."""
    ctx = [int(t) for t in context]
    primary = [((), 0.0)]
    layers, secondary = [], {}
    for _ in range(depth):
        layers.append(sorted(p for p, _ in primary))
        pool = []
        for path, score in primary:
            lp = lm.logprobs(ctx + list(path))
            for tok in np.argsort(-lp, kind="stable")[:topk]:
                pool.append((path + (int(tok),), score + float(lp[tok])))
        secondary.update(dict(pool))
        pool.sort(key=lambda x: -x[1])
        primary = pool[:beam]
    return layers, secondary


SHAPES = [(2, 2, 4, 0), (3, 2, 3, 1), (4, 3, 4, 2), (1, 1, 5, 3)]


@pytest.mark.parametrize("beam,topk,depth,seed", SHAPES)
def test_construction_equals_brute_force_top_k(beam, topk, depth, seed):  # type: ignore[no-untyped-def]
    lm = FakeDraftLM(vocab_size=6, seed=seed)
    cache = grown(lm, beam, topk, depth)
    snap = cache.snapshot()
    layers, secondary = brute_force_layers(lm, CONTEXT, beam, topk, depth)
    got = paths(snap)
    # every secondary candidate is in the tree with its path score, and nothing else
    assert set(got) - {()} == set(secondary)
    for path, score in secondary.items():
        assert snap.score[got[path]] == pytest.approx(score, abs=1e-5)
    # the expanded (primary) nodes of each layer are the brute-force top-K
    expanded = [paths_of(snap, i) for i in range(snap.tokens.size) if cache.slot[i] >= 0]
    for level, want in enumerate(layers):
        assert sorted(p for p in expanded if len(p) == level) == want
    assert lm.forwards == depth


def test_query_takes_best_subtree_within_budget():
    lm = FakeDraftLM(vocab_size=6, seed=4)
    snap = grown(lm, 3, 3, 4).snapshot()
    for budget in (1, 3, 7, 20, 1000):
        tree, probs = snap.query(CONTEXT, budget)
        n = min(budget, snap.tokens.size - 1)
        assert len(tree) == n
        best = np.sort(snap.score[1:])[::-1][:n]
        # the chosen nodes are the n best by path score: recompute scores from probs
        score = np.zeros(len(tree))
        for i, p in enumerate(tree.parents.tolist()):
            score[i] = np.log(probs[i]) + (score[p] if p >= 0 else 0.0)
        assert np.allclose(np.sort(score)[::-1], best, atol=1e-5)


def test_query_after_new_tokens_and_miss():
    lm = FakeDraftLM(vocab_size=6, seed=5)
    snap = grown(lm, 2, 2, 4).snapshot()
    first = int(snap.tokens[1])
    sub, _ = snap.query(np.append(CONTEXT, first), 100)
    inside = [p[1:] for p in paths(snap) if p[:1] == (first,) and len(p) > 1]
    assert sorted(tuple(tree_path(sub, i)) for i in range(len(sub))) == sorted(inside)
    missing = next(t for t in range(6) if (t,) not in paths(snap))
    assert len(snap.query(np.append(CONTEXT, missing), 100)[0]) == 0
    assert len(snap.query(np.array([9, 9]), 100)[0]) == 0


def tree_path(tree, i):  # type: ignore[no-untyped-def]
    return tree.tokens[tree.path_to(i)].tolist()


@pytest.mark.parametrize("seed", range(6))
def test_correction_keeps_exactly_the_descendants(seed):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    lm = FakeDraftLM(vocab_size=5, seed=seed)
    cache = grown(lm, 3, 2, 4)
    before = cache.snapshot()
    # accept a random existing path of 1-3 tokens (the last one is the new root)
    node = int(rng.integers(1, before.tokens.size))
    accepted = list(paths_of(before, node))
    hit = cache.sync(lm, np.concatenate([CONTEXT, accepted]))
    assert hit
    after = cache.snapshot()
    want = {p[len(accepted):] for p in paths(before) if p[: len(accepted)] == tuple(accepted)}
    assert set(paths(after)) == want
    for p, i in paths(after).items():  # scores are relative to the new root
        old = before.score[paths(before)[tuple(accepted) + p]] - before.score[node]
        assert after.score[i] == pytest.approx(old)
    # the draft cache now holds the context up to the new root, and its kept scratch
    # rows are the computed descendants: growing on reuses them and stays exact
    assert lm.cached == CONTEXT.tolist() + accepted[:-1]
    assert len(lm.scratch) == sum(1 for s in cache.slot if s >= 0)
    while cache.grow(lm):
        pass
    ctx = np.concatenate([CONTEXT, accepted])
    fresh = grown(FakeDraftLM(vocab_size=5, seed=seed), 3, 2, 4, ctx)
    for p, i in paths(cache.snapshot()).items():
        if p in paths(fresh.snapshot()):
            j = paths(fresh.snapshot())[p]
            assert cache.snapshot().score[i] == pytest.approx(fresh.snapshot().score[j], abs=1e-5)


def test_miss_restarts_from_the_target_token():
    lm = FakeDraftLM(vocab_size=5, seed=7)
    cache = grown(lm, 2, 2, 3)
    snap = cache.snapshot()
    first = int(snap.tokens[1])
    missing = next(t for t in range(5) if (first, t) not in paths(snap))
    ctx = np.concatenate([CONTEXT, [first, missing]])
    assert not cache.sync(lm, ctx)
    assert len(cache) == 1 and cache.tokens == [missing]
    assert lm.cached == ctx[:-1].tolist() and lm.scratch == []
    # a context that does not extend the old one: trim to the common prefix, prefill
    other = np.array([3, 1, 2, 2], np.int64)
    cache.sync(lm, other)
    assert lm.cached == other[:-1].tolist()


def test_exhaustive_small_tree_is_all_sequences():
    """With K >= every sequence and k = V nothing is pruned: the tree holds every
    sequence up to the depth, each scored by its exact log-probability."""
    lm = FakeDraftLM(vocab_size=3, seed=8)
    snap = grown(lm, 9, 3, 2).snapshot()
    want = {p for n in (1, 2) for p in itertools.product(range(3), repeat=n)}
    assert set(paths(snap)) - {()} == want
    for p, i in paths(snap).items():
        seq, s = CONTEXT.tolist(), 0.0
        for t in p:
            s += lm.logprobs(seq)[t]
            seq.append(t)
        assert snap.score[i] == pytest.approx(s, abs=1e-5)


def test_bad_options():
    with pytest.raises(DraftwiseError, match="beam"):
        CandidateCache(0, 2, 3)


def test_chain_query_is_the_best_child_repeatedly():
    lm = FakeDraftLM(vocab_size=6, seed=9)
    snap = grown(lm, 3, 3, 4).snapshot()
    tree, probs = snap.query(CONTEXT, 3, chain=True)
    assert tree.is_chain() and len(tree) == 3
    node = 0
    for tok in tree.tokens.tolist():
        kids = np.flatnonzero(snap.parents == node)
        node = int(kids[np.argmax(snap.score[kids])])
        assert snap.tokens[node] == tok


def test_context_beyond_the_draft_limit_stops_drafting():
    """A draft model with a shorter context than the target's drafts nothing past it
    (instead of failing the generation), and drafts again on a shorter context."""
    lm = FakeDraftLM(vocab_size=5, seed=1, context_limit=12)
    cache = CandidateCache(2, 2, 3)
    long_ctx = np.arange(12) % 5
    assert not cache.sync(lm, long_ctx)
    assert not cache.can_grow(lm) and lm.cached == []
    assert len(cache.snapshot().query(long_ctx, 8)[0]) == 0
    cache.sync(lm, CONTEXT)
    assert cache.grow(lm) and lm.cached == CONTEXT[:-1].tolist()
