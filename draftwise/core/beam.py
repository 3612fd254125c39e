"""Beam search over a draft network's next-token log-probs, and prefix dedup of the beams.

ReDrafter (seed 001) drafts ``BW`` beams of ``T`` tokens each with beam search, then
merges the beams' shared prefixes into one tree so that the target verifies every
distinct prefix once. The algorithm lives here, once; a backend supplies only the tensor
step (``step(tokens, parents) -> log-probs``), keeping its recurrent states on its device.

Step contract: ``step(tokens (B,), parents (B,))`` advances the states of the previous
call's rows ``parents`` (``-1`` at the first call: the initial state) by ``tokens`` and
returns the next-token log-probabilities ``(B, V)`` of the new rows. Row ``i`` of the
result continues beam ``i``.

Worked example (V = 3, a network that always prefers token 2, then 0)::

    >>> lp = np.log(np.array([[0.3, 0.1, 0.6]]))
    >>> step = lambda tok, par: np.repeat(lp, tok.size, axis=0)
    >>> beams = beam_search(step, root=7, width=2, length=2)
    >>> beams.tokens.tolist()
    [[2, 2], [2, 0]]
    >>> d = dedup_beams(beams)
    >>> d.tree.tokens.tolist(), d.tree.parents.tolist(), (d.packed, d.unpacked)
    ([2, 2, 0], [-1, 0, 0], (3, 4))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from draftwise.core.tree import DraftTree
from draftwise.errors import DraftwiseError

StepFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Beams:
    """``width`` beams of ``length`` drafted tokens, best first."""

    tokens: np.ndarray  # (BW, T) int64
    logp: np.ndarray  # (BW, T) float64: log q(token | beam prefix), per position
    score: np.ndarray  # (BW,) float64: the beam's total log-probability


@dataclass(frozen=True)
class BeamTree:
    """The beams' distinct prefixes as one ``DraftTree``, with draft probabilities."""

    tree: DraftTree
    logp: np.ndarray  # (N,) float64: log q(node | its parent path)
    path_logp: np.ndarray  # (N,) float64: log q(path from the root down to the node)
    packed: int  # nodes in the tree (distinct prefixes)
    unpacked: int  # tokens over all beams (BW * T): what verifying them unmerged costs


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """Flat indices of the ``k`` largest of ``scores`` (any shape), best first; ties go to
    the lower flat index, so the order never depends on the partition algorithm."""
    flat = scores.reshape(-1)
    k = min(k, flat.size)
    cand = np.argpartition(-flat, k - 1)[:k] if k < flat.size else np.arange(flat.size)
    # Include every entry tied with the k-th best so the tie-break below is by index.
    kth = flat[cand].min()
    cand = np.flatnonzero(flat >= kth)
    order = np.lexsort((cand, -flat[cand]))
    return cand[order[:k]]


def beam_search(step: StepFn, root: int, width: int, length: int) -> Beams:
    """``width`` beams of ``length`` tokens continuing ``root``; see the module docstring.

    Beam 0 starts from ``root`` alone (one row), so the first expansion takes the top
    ``width`` tokens of one distribution; each later step keeps the top ``width`` of
    ``width x V`` candidates by total log-probability.
    """
    if width < 1 or length < 1:
        raise DraftwiseError(f"beam width and length must be >= 1, got {width} and {length}")
    tokens = np.array([root], np.int64)  # (1,)
    parents = np.array([-1], np.int64)  # (1,)
    seq = np.zeros((1, 0), np.int64)  # (B, t)
    seq_lp = np.zeros((1, 0), np.float64)  # (B, t)
    score = np.zeros(1, np.float64)  # (B,)
    for _ in range(length):
        lp = np.asarray(step(tokens, parents), np.float64)  # (B, V)
        if lp.ndim != 2 or lp.shape[0] != tokens.size:
            raise DraftwiseError(
                f"beam step must return ({tokens.size}, V) log-probs, got {lp.shape}"
            )
        total = score[:, None] + lp  # (B, V)
        best = _top(total, width)  # (B',)
        beam, tok = np.divmod(best, lp.shape[1])  # (B',), (B',)
        seq = np.concatenate([seq[beam], tok[:, None]], axis=1)  # (B', t+1)
        seq_lp = np.concatenate([seq_lp[beam], lp[beam, tok][:, None]], axis=1)  # (B', t+1)
        score = total.reshape(-1)[best]  # (B',)
        tokens, parents = tok, beam
    return Beams(seq, seq_lp, score)


def dedup_beams(beams: Beams, budget: int | None = None) -> BeamTree:
    """Merge the beams into a prefix tree (a trie), breadth-first; within a depth nodes
    follow the first (best) beam that reaches them. With ``budget``, keep the ``budget``
    nodes of highest path probability (a parent is never less probable than its child,
    so the kept nodes always include their parents)."""
    bw, t = beams.tokens.shape
    # A Python dict per depth: BW x T is small (at most a few hundred), where np.unique
    # over (parent, token) pairs cost ~1 ms a proposal.
    toks = beams.tokens.tolist()
    cum = np.cumsum(beams.logp, axis=1)  # (BW, T): path log-prob of each beam prefix
    node_of = [-1] * bw  # node of each beam at the previous depth
    parents_l: list[int] = []
    beam_l: list[int] = []  # representative beam of each node (the best reaching it)
    depth_l: list[int] = []
    for d in range(t):
        seen: dict[tuple[int, int], int] = {}
        for i in range(bw):
            key = (node_of[i], toks[i][d])
            node = seen.get(key)
            if node is None:
                node = seen[key] = len(parents_l)
                parents_l.append(key[0])
                beam_l.append(i)
                depth_l.append(d)
            node_of[i] = node
    n = len(parents_l)
    rep, dep = np.array(beam_l, np.int64), np.array(depth_l, np.int64)  # (N,), (N,)
    parents = np.array(parents_l, np.int64)
    tokens = beams.tokens[rep, dep]
    logp = beams.logp[rep, dep]
    path = cum[rep, dep]
    tree = DraftTree(tokens, parents, prob=np.exp(logp))
    if budget is not None and budget < n:
        depth = tree.depth
        keep = np.lexsort((np.arange(n), depth, -path))[: max(budget, 0)]
        tree = tree.subset(keep)
        keep = np.sort(keep)
        logp, path = logp[keep], path[keep]
    return BeamTree(tree, logp, path, int(len(tree)), bw * t)
