"""Beam search over a draft network's next-token log-probs, and prefix dedup of the beams.

ReDrafter (seed 001) drafts ``BW`` beams of ``T`` tokens each with beam search, then
merges the beams' shared prefixes into one tree so that the target verifies every
distinct prefix once. The algorithm lives here, once; a backend supplies only the tensor
step (``step(tokens, parents) -> log-probs``), keeping its recurrent states on its device.

Step contract: ``step(tokens (B,), parents (B,))`` advances the states of the previous
call's rows ``parents`` (``-1`` at the first call: the initial state) by ``tokens`` and
returns the next-token log-probabilities ``(B, V)`` of the new rows. Row ``i`` of the
result continues beam ``i``.

Pruned prefixes (not in seed 001): a beam kept at depth ``d`` whose continuations all
lost to other beams' is gone from the final beams, though it was among the ``BW`` best
prefixes of its length. ``beam_search`` keeps these (``Beams.pruned``) and
``dedup_beams(..., pruned=True)`` adds them to the tree: no extra network step, a node
or two more to verify. Measured live on 20 Spec-Bench prompts (bf16, shipped
checkpoint, ``t = 3``): MAT 1.70 -> 1.77 at ``bw = 2`` (5.0 -> 5.4 nodes), 1.79 -> 1.90
at ``bw = 4`` (8.6 -> 10.1 nodes).

Worked example (V = 3, a network that always prefers token 2, then 0)::

    >>> lp = np.log(np.array([[0.3, 0.1, 0.6]]))
    >>> step = lambda tok, par: np.repeat(lp, tok.size, axis=0)
    >>> beams = beam_search(step, root=7, width=2, length=2)
    >>> beams.tokens.tolist()
    [[2, 2], [2, 0]]
    >>> [t.tolist() for t, _ in beams.pruned]   # depth 1 kept 2 and 0; only 2 went on
    [[[0]]]
    >>> d = dedup_beams(beams)
    >>> d.tree.tokens.tolist(), d.tree.parents.tolist(), (d.packed, d.unpacked)
    ([2, 2, 0], [-1, 0, 0], (3, 4))
    >>> d = dedup_beams(beams, pruned=True)
    >>> d.tree.tokens.tolist(), d.tree.parents.tolist(), (d.packed, d.unpacked)
    ([2, 2, 0, 0], [-1, 0, 0, -1], (4, 5))
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate

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
    # per depth d < T - 1: the beams kept at d that no later beam continues, as
    # (tokens, logp) of shape (P_d, d + 1) each
    pruned: tuple[tuple[np.ndarray, np.ndarray], ...] = field(default=())


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
    pruned: list[tuple[np.ndarray, np.ndarray]] = []
    for d in range(length):
        lp = np.asarray(step(tokens, parents), np.float64)  # (B, V)
        if lp.ndim != 2 or lp.shape[0] != tokens.size:
            raise DraftwiseError(
                f"beam step must return ({tokens.size}, V) log-probs, got {lp.shape}"
            )
        total = score[:, None] + lp  # (B, V)
        if width == 1:  # a chain: one argmax (ties to the lower index, as ``_top``)
            best = np.array([int(total.argmax())])  # (1,)
        else:
            best = _top(total, width)  # (B',)
        beam, tok = np.divmod(best, lp.shape[1])  # (B',), (B',)
        if d:  # the previous depth's beams that none of the new ones continues
            gone = np.ones(seq.shape[0], bool)
            gone[beam] = False
            pruned.append((seq[gone], seq_lp[gone]))
        seq = np.concatenate([seq[beam], tok[:, None]], axis=1)  # (B', t+1)
        seq_lp = np.concatenate([seq_lp[beam], lp[beam, tok][:, None]], axis=1)  # (B', t+1)
        score = total.reshape(-1)[best]  # (B',)
        tokens, parents = tok, beam
    return Beams(seq, seq_lp, score, tuple(pruned))


def dedup_beams(beams: Beams, budget: int | None = None, pruned: bool = False) -> BeamTree:
    """Merge the beams into a prefix tree (a trie), breadth-first; within a depth nodes
    follow the first (best) beam that reaches them. ``pruned``: then also the beams'
    pruned prefixes (``Beams.pruned``), after them. With ``budget``, keep the ``budget``
    nodes of highest path probability (a parent is never less probable than its child,
    so the kept nodes always include their parents)."""
    bw, t = beams.tokens.shape
    if bw == 1 and not any(p.size for p, _ in beams.pruned):
        chain = _chain_tree(beams, budget)
        if chain is not None:
            return chain
    # Python dicts and lists: BW x T is small (at most a few hundred), where np.unique
    # over (parent, token) pairs cost ~1 ms a proposal.
    toks = beams.tokens.tolist()
    lps = beams.logp.tolist()
    node: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    parents_l: list[int] = []
    tokens_l: list[int] = []
    logp_l: list[float] = []
    path_l: list[float] = []

    def add(parent: int, token: int, lp: float) -> int:
        key = (parent, token)
        got = node.get(key)
        if got is None:
            got = node[key] = len(parents_l)
            parents_l.append(parent)
            tokens_l.append(token)
            logp_l.append(lp)
            path_l.append(lp + (path_l[parent] if parent >= 0 else 0.0))
        return got

    node_of = [-1] * bw  # node of each beam at the previous depth
    for d in range(t):
        for i in range(bw):
            node_of[i] = add(node_of[i], toks[i][d], lps[i][d])
    unpacked = bw * t
    if pruned:
        for p_tok, p_lp in beams.pruned:
            for row, row_lp in zip(p_tok.tolist(), p_lp.tolist(), strict=True):
                at = -1
                for tk, lp in zip(row, row_lp, strict=True):
                    at = add(at, tk, lp)
                unpacked += len(row)
    n = len(parents_l)
    logp, path = np.array(logp_l, np.float64), np.array(path_l, np.float64)  # (N,), (N,)
    tree = DraftTree(np.array(tokens_l, np.int64), np.array(parents_l, np.int64), prob=np.exp(logp))
    if budget is not None and budget < n:
        depth = tree.depth
        keep = np.lexsort((np.arange(n), depth, -path))[: max(budget, 0)]
        tree = tree.subset(keep)
        keep = np.sort(keep)
        logp, path = logp[keep], path[keep]
    return BeamTree(tree, logp, path, int(len(tree)), unpacked)


# (parents, depth) of a chain of n nodes, read-only, made once per n
_CHAIN_INDEX: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _chain_index(n: int) -> tuple[np.ndarray, np.ndarray]:
    got = _CHAIN_INDEX.get(n)
    if got is None:
        depth = np.arange(n + 1, dtype=np.int64)  # (n + 1,): parents are depth - 2
        parents, depth = depth[:n] - 1, depth[1:].copy()
        parents.setflags(write=False)
        depth.setflags(write=False)
        got = _CHAIN_INDEX[n] = (parents, depth)
    return got


def _chain_tree(beams: Beams, budget: int | None) -> BeamTree | None:
    """``dedup_beams`` of one beam with nothing pruned: ``chain_tree`` of its tokens."""
    return chain_tree(beams.tokens[0], beams.logp[0].tolist(), budget)


def chain_tree(tokens: np.ndarray, logp: list[float], budget: int | None) -> BeamTree | None:
    """One beam of ``tokens`` (t,) with log-probabilities ``logp`` (t Python floats) and
    nothing pruned as a ``BeamTree``, without the trie: the beam is the tree (a
    ReDrafter chain each step). Run right after a verify, where each numpy call costs
    tens of microseconds (a step's caches are cold): a handful of operations on lists,
    as t is small. Its path log-probabilities never grow along the chain, so the
    ``budget`` most probable nodes are its first ones. None where a log-probability is
    positive (rounding): then ``dedup_beams`` decides.

    Example::

        >>> out = chain_tree(np.array([7, 3]), [-0.1, -0.5], budget=None)
        >>> out.tree.tokens.tolist(), out.tree.parents.tolist(), out.packed, out.unpacked
        ([7, 3], [-1, 0], 2, 2)
        >>> [round(v, 2) for v in out.path_logp.tolist()]
        [-0.1, -0.6]
    """
    t = len(logp)
    if t and max(logp) > 0:
        return None
    n = t if budget is None else min(t, max(budget, 0))
    head = logp[:n]
    rows = np.array([head, list(accumulate(head)), [math.exp(v) for v in head]], np.float64)
    parents, depth = _chain_index(n)  # (n,), (n,)
    tree = DraftTree._trusted(tokens[:n], parents, None, depth, rows[2], n)
    return BeamTree(tree, rows[0], rows[1], n, t)
