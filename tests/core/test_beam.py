"""Beam search equals a naive loop and, when wide enough, brute force; dedup equals a trie."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from draftwise.core.beam import Beams, beam_search, dedup_beams
from draftwise.errors import DraftwiseError


class TableRNN:
    """A tiny deterministic 'network': log-probs depend on the whole path so far."""

    def __init__(self, vocab: int, seed: int) -> None:
        self.vocab, self.rng_seed = vocab, seed
        self.paths: list[tuple[int, ...]] = []

    def logp(self, path: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng(abs(hash((self.rng_seed, path))) % (2**32))
        x = rng.normal(size=self.vocab) * 2.0
        return x - np.log(np.exp(x).sum())

    def step(self, tokens: np.ndarray, parents: np.ndarray) -> np.ndarray:
        new = [
            (self.paths[p] if p >= 0 else ()) + (int(t),)
            for t, p in zip(tokens.tolist(), parents.tolist(), strict=True)
        ]
        self.paths = new
        return np.stack([self.logp(p) for p in new])


def naive_beam(net: TableRNN, root: int, width: int, length: int) -> list[tuple[float, list[int]]]:
    beams: list[tuple[float, list[int]]] = [(0.0, [])]
    for _ in range(length):
        cand = []
        for bi, (s, seq) in enumerate(beams):
            lp = net.logp(tuple([root] + seq))
            for v in range(net.vocab):
                cand.append((s + lp[v], bi * net.vocab + v, seq + [v]))
        cand.sort(key=lambda c: (-c[0], c[1]))
        beams = [(c[0], c[2]) for c in cand[:width]]
    return beams


@pytest.mark.parametrize("seed", range(6))
def test_beam_search_equals_naive_loop(seed: int) -> None:
    net = TableRNN(vocab=5, seed=seed)
    got = beam_search(net.step, root=3, width=3, length=4)
    want = naive_beam(TableRNN(5, seed), 3, 3, 4)
    assert got.tokens.tolist() == [seq for _, seq in want]
    np.testing.assert_allclose(got.score, [s for s, _ in want])
    np.testing.assert_allclose(got.logp.sum(axis=1), got.score)


@pytest.mark.parametrize("seed", range(3))
def test_one_beam_is_the_greedy_chain_ties_to_the_lower_id(seed: int) -> None:
    """Width 1 (its own argmax path) equals the naive loop, and a tie goes to the lower
    id as in wider searches."""
    net = TableRNN(vocab=5, seed=seed)
    got = beam_search(net.step, root=3, width=1, length=4)
    assert got.tokens.tolist() == [naive_beam(TableRNN(5, seed), 3, 1, 4)[0][1]]
    flat = np.log(np.full((1, 4), 0.25))
    tied = beam_search(lambda t, p: np.repeat(flat, t.size, 0), root=0, width=1, length=2)
    assert tied.tokens.tolist() == [[0, 0]]
    assert [p.shape for p, _ in tied.pruned] == [(0, 1)]


def test_wide_beam_equals_brute_force() -> None:
    """With width >= V^(T-1) nothing is pruned early: the beams are the global top-k."""
    vocab, length, width = 3, 3, 9
    net = TableRNN(vocab, seed=11)
    got = beam_search(net.step, root=0, width=width, length=length)
    scored = []
    for seq in itertools.product(range(vocab), repeat=length):
        s = sum(net.logp(tuple([0, *seq[:i]]))[seq[i]] for i in range(length))
        scored.append((-s, seq))
    scored.sort()
    assert [tuple(r) for r in got.tokens.tolist()] == [seq for _, seq in scored[:width]]


@pytest.mark.parametrize("seed", range(6))
def test_pruned_are_the_kept_prefixes_no_later_beam_continues(seed: int) -> None:
    """At each depth d < T - 1 the beams kept there are exactly the pruned ones plus the
    length-(d + 1) prefixes of the next depth's beams, and the two never overlap."""
    width, length = 3, 4
    got = beam_search(TableRNN(4, seed).step, root=2, width=width, length=length)
    assert len(got.pruned) == length - 1
    for d, (p_tok, p_lp) in enumerate(got.pruned):
        kept = {tuple(seq) for _, seq in naive_beam(TableRNN(4, seed), 2, width, d + 1)}
        nxt = {tuple(seq[: d + 1]) for _, seq in naive_beam(TableRNN(4, seed), 2, width, d + 2)}
        pruned = {tuple(r) for r in p_tok.tolist()}
        assert p_tok.shape[1] == p_lp.shape[1] == d + 1
        assert not pruned & nxt and pruned | nxt == kept


@pytest.mark.parametrize("seed", range(10))
def test_dedup_with_pruned_equals_a_trie_of_every_row(seed: int) -> None:
    net = TableRNN(vocab=3, seed=seed)
    beams = beam_search(net.step, root=1, width=int(seed % 4) + 1, length=3)
    got = dedup_beams(beams, pruned=True)
    rows = beams.tokens.tolist() + [r for tk, _ in beams.pruned for r in tk.tolist()]
    ids: dict[tuple[int, ...], int] = {}
    for r in rows:  # every prefix of every row, each once
        for d in range(len(r)):
            ids.setdefault(tuple(r[: d + 1]), len(ids))
    paths = [tuple(int(got.tree.tokens[j]) for j in got.tree.path_to(i)) for i in range(got.packed)]
    assert sorted(paths) == sorted(ids) and len(set(paths)) == len(paths)
    assert got.unpacked == sum(len(r) for r in rows)
    nodes_of_final = dedup_beams(beams).packed
    assert got.tree.tokens[:nodes_of_final].tolist() == dedup_beams(beams).tree.tokens.tolist()


def naive_trie(tokens: np.ndarray) -> tuple[list[int], list[int]]:
    """BFS trie of the rows, nodes at a depth in first-beam order."""
    ids: dict[tuple[int, ...], int] = {}
    toks, pars = [], []
    for d in range(tokens.shape[1]):
        for row in tokens.tolist():
            key = tuple(row[: d + 1])
            if key not in ids:
                ids[key] = len(toks)
                toks.append(row[d])
                pars.append(ids[key[:-1]] if d else -1)
    return toks, pars


@pytest.mark.parametrize("seed", range(20))
def test_dedup_equals_naive_trie(seed: int) -> None:
    rng = np.random.default_rng(seed)
    bw, t = rng.integers(1, 8), rng.integers(1, 6)
    tokens = rng.integers(0, 3, size=(bw, t))
    # a real drafter gives one log-prob per distinct prefix
    table: dict[tuple[int, ...], float] = {}
    logp = np.array(
        [
            [table.setdefault(tuple(r[: d + 1]), -rng.random()) for d in range(t)]
            for r in tokens.tolist()
        ]
    )
    beams = Beams(tokens, logp, logp.sum(axis=1))
    got = dedup_beams(beams)
    toks, pars = naive_trie(tokens)
    assert got.tree.tokens.tolist() == toks
    assert got.tree.parents.tolist() == pars
    assert (got.packed, got.unpacked) == (len(toks), bw * t)
    # every beam is a path of the tree, with its per-position log-probs
    for b in range(bw):
        node, path = -1, []
        for d in range(t):
            kids = np.flatnonzero((got.tree.parents == node) & (got.tree.tokens == tokens[b, d]))
            assert kids.size == 1
            node = int(kids[0])
            path.append(node)
        np.testing.assert_allclose(got.path_logp[path], np.cumsum(logp[b]))


def test_budget_keeps_most_probable_nodes_with_parents() -> None:
    tokens = np.array([[1, 2, 3], [1, 4, 5], [6, 7, 8]])
    logp = np.log(np.array([[0.9, 0.5, 0.5], [0.9, 0.4, 0.9], [0.05, 0.9, 0.9]]))
    got = dedup_beams(Beams(tokens, logp, logp.sum(1)), budget=4)
    # paths: 1 .9, 12 .45, 14 .36, 145 .324, 123 .225, 6 .05
    assert got.tree.tokens.tolist() == [1, 2, 4, 5]
    assert got.tree.parents.tolist() == [-1, 0, 0, 2]
    np.testing.assert_allclose(np.exp(got.path_logp), [0.9, 0.45, 0.36, 0.324])


def test_bad_arguments() -> None:
    with pytest.raises(DraftwiseError, match="width"):
        beam_search(lambda t, p: np.zeros((1, 2)), 0, 0, 2)
    with pytest.raises(DraftwiseError, match="log-probs"):
        beam_search(lambda t, p: np.zeros(2), 0, 2, 2)


@pytest.mark.parametrize("budget", [None, 0, 1, 3, 5, 9])
def test_a_chain_takes_the_short_path_to_the_same_tree(budget, monkeypatch) -> None:
    """One beam with nothing pruned (a ReDrafter chain) skips the trie: the same tree,
    probabilities, paths and counts as the general path; a positive log-prob (rounding)
    falls back to the general path."""
    import draftwise.core.beam as beam

    net = TableRNN(vocab=7, seed=3)
    beams = beam_search(net.step, 2, 1, 5)
    fast = dedup_beams(beams, budget, pruned=True)
    monkeypatch.setattr(beam, "_chain_tree", lambda b, budget: None)
    slow = dedup_beams(beams, budget, pruned=True)
    assert fast.tree.tokens.tolist() == slow.tree.tokens.tolist()
    assert fast.tree.parents.tolist() == slow.tree.parents.tolist()
    assert fast.tree.depth.tolist() == slow.tree.depth.tolist()
    np.testing.assert_array_equal(fast.tree.prob, slow.tree.prob)
    np.testing.assert_allclose(fast.path_logp, slow.path_logp, rtol=1e-12)
    np.testing.assert_array_equal(fast.logp, slow.logp)
    assert (fast.packed, fast.unpacked) == (slow.packed, slow.unpacked)
    monkeypatch.undo()
    up = Beams(beams.tokens, np.abs(beams.logp), beams.score, beams.pruned)
    assert beam._chain_tree(up, budget) is None
