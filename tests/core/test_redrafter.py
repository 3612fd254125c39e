"""The core ReDrafter over a fake recurrent network: beams map draft-vocabulary columns
to target ids, share prefixes, respect the budget, and draft nothing without a hidden state."""

from __future__ import annotations

import numpy as np
import pytest

from draftwise.core.drafters.base import NoDrafter
from draftwise.core.drafters.compose import Capped, Combined
from draftwise.core.drafters.redrafter import RecurrentNet, ReDrafter
from draftwise.errors import DraftwiseError


class FakeNet:
    """Draft vocabulary: target ids 100..104; after target id x it prefers 100 + (x+1) % 5."""

    def __init__(self, ready: bool = True) -> None:
        self.vocab_ids = np.arange(100, 105)
        self.ready = ready
        self.calls: list[tuple[list[int], list[int]]] = []

    def start(self, cache_len: int, context: np.ndarray) -> bool:
        self.cache_len = cache_len
        return self.ready

    def step(self, tokens: np.ndarray, parents: np.ndarray) -> np.ndarray:
        self.calls.append((tokens.tolist(), parents.tolist()))
        lp = np.full((tokens.size, 5), np.log(0.1))
        lp[np.arange(tokens.size), (tokens + 1) % 5] = np.log(0.6)
        return lp


def test_beams_become_a_tree_of_target_ids() -> None:
    net = FakeNet()
    assert isinstance(net, RecurrentNet)
    d = ReDrafter(net, bw=2, t=3, pruned=False)  # the final beams only, as seed 001
    tree = d.propose(np.array([7, 8, 103]), budget=64)
    assert net.cache_len == 2  # the hidden state of the token before the root
    assert net.calls[0] == ([103], [-1])  # the root, from the initial state
    assert all(t >= 100 for toks, _ in net.calls[1:] for t in toks)  # then target ids
    # best beam: 103 -> 104 -> 100 -> 101
    best = [int(tree.tokens[i]) for i in tree.path_to(int(np.flatnonzero(tree.depth == 3)[0]))]
    assert best == [104, 100, 101]
    assert d.last is not None and d.last.unpacked == 6 and d.last.packed == len(tree) < 6
    assert d.last_beam == (2, 3)  # what the decoder reports per step
    np.testing.assert_allclose(np.exp(d.last.path_logp[0]), 0.6)
    d.reset()  # a new prompt: the run's totals stay (the bench reports them)
    d.propose(np.array([7, 8, 103]), budget=64)
    assert d.stats() == {
        "proposals": 2, "packed": 2 * len(tree), "unpacked": 12, "beam_rows": 4, "beam_len": 6
    }


def test_pruned_prefixes_join_the_tree() -> None:
    """By default the prefixes beam search kept at a depth and then dropped are verified
    too: here the second first token (100) and the second two-token prefix (104 101)."""
    d = ReDrafter(FakeNet(), bw=2, t=3)
    tree = d.propose(np.array([7, 8, 103]), budget=64)
    paths = {tuple(int(tree.tokens[j]) for j in tree.path_to(i)) for i in range(len(tree))}
    assert {(104,), (104, 100), (104, 100, 101), (104, 100, 100)} < paths  # the beams
    assert {(100,), (104, 101)} < paths and len(paths) == len(tree) == 6
    assert d.last is not None and (d.last.packed, d.last.unpacked) == (6, 6 + 1 + 2)
    for i in range(len(tree)):  # every node's path log-prob is its path's sum
        np.testing.assert_allclose(
            d.last.path_logp[i], d.last.logp[tree.path_to(i)].sum(), rtol=1e-12
        )


def test_budget_and_no_hidden_state() -> None:
    d = ReDrafter(FakeNet(), bw=3, t=4)
    assert len(d.propose(np.array([1, 2]), budget=5)) == 5
    assert d.last_beam == (3, 4)
    assert len(ReDrafter(FakeNet(ready=False)).propose(np.array([1, 2]), budget=8)) == 0
    assert len(d.propose(np.array([1, 2]), budget=0)) == 0
    assert d.last_beam is None  # no beams drafted this step
    with pytest.raises(DraftwiseError, match="bw=0"):
        ReDrafter(FakeNet(), bw=0)


def test_wrappers_report_the_beams() -> None:
    """``budget=N`` (Capped) and ``a+b`` (Combined) pass on what their beam members drafted
    (the bench's per-step beam column) and Capped its member's counters."""
    capped = Capped(ReDrafter(FakeNet(), bw=2, t=3), 4)
    assert capped.last_beam is None
    assert len(capped.propose(np.array([1, 2]), budget=64)) <= 4
    assert capped.last_beam == (2, 3) and capped.stats()["beam_rows"] == 2
    both = Combined([ReDrafter(FakeNet(), bw=2, t=3), NoDrafter(), ReDrafter(FakeNet(), bw=3, t=2)])
    both.propose(np.array([1, 2]), budget=64)
    assert both.last_beam == (5, 3)
    assert Capped(NoDrafter(), 4).stats() == {} and Combined([NoDrafter()]).last_beam is None


class ChainNet(FakeNet):
    """A ``FakeNet`` with the compiled step's ``chain``, ending early as it does."""

    def __init__(self) -> None:
        super().__init__()
        self.floors: list[np.ndarray | None] = []

    def chain(self, root: int, t: int, min_path: np.ndarray | None = None):  # type: ignore[no-untyped-def]
        self.floors.append(None if min_path is None else np.array(min_path))
        tok, lp, path = [], [], 0.0
        for j in range(t):
            root = 100 + (root + 1) % 5
            tok.append(root)
            lp.append(np.log(0.6))
            path += lp[-1]
            if min_path is not None and j + 1 < t and path < min_path[j + 1]:
                break
        return np.array(tok), np.array(lp)


@pytest.mark.parametrize("chained", [False, True])
def test_min_path_keeps_the_chain_tokens_that_reach_their_floor(chained: bool) -> None:
    """At bw=1 the tokens whose path probability (0.6, 0.36, 0.216 here) reaches its
    depth's floor are kept (floors made non-decreasing); none kept: an empty tree. A net
    with ``chain`` gets the floors in log space (it stops drafting early)."""
    net = ChainNet() if chained else FakeNet()
    d = ReDrafter(net, bw=1, t=3)
    ctx = np.array([7, 8, 103])
    assert d.propose(ctx, 16).tokens.tolist() == [104, 100, 101]  # no floor: all t
    d.min_path = np.array([0.3, 0.3, 0.3])
    assert d.propose(ctx, 16).tokens.tolist() == [104, 100]
    d.min_path = np.array([0.1, 0.5, 0.2])  # -> 0.1, 0.5, 0.5
    assert d.propose(ctx, 16).tokens.tolist() == [104]
    if chained:
        np.testing.assert_allclose(net.floors[-1], np.log([0.1, 0.5, 0.5]))
    d.min_path = np.array([0.7, 0.7, 0.7])
    assert len(d.propose(ctx, 16)) == 0
    d.min_path = np.array([0.5, 0.3])
    with pytest.raises(DraftwiseError, match="min_path needs 3"):
        d.propose(ctx, 16)
