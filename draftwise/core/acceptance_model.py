"""How likely each draft node is to be accepted, learnt online (``AcceptanceModel``).

For each drafter (source), depth and sibling rank: the probability that a node is
accepted given that its parent was, as Beta-smoothed, slowly forgetting counts. A drafter
that states its own probability of a node (``DraftTree.prob``: ReDrafter's beam
probabilities) is binned by that probability instead of by rank (``PROB_EDGES``): the
counts calibrate it online. ``autotune.py`` and ``draftplan.py`` plan trees from it; it
knows nothing of drafters (so the drafters' package may use the planners without an
import circle).

Example::

    >>> acc = AcceptanceModel(prior=(1.0, 1.0))         # p = 0.5 per node
    >>> t = DraftTree.chain([1, 2])
    >>> acc.node_probs(t).round(2).tolist()           # each given its parent
    [0.5, 0.5]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from draftwise.core.tree import DraftTree, path_reduce

# Beta prior of every acceptance cell: p = 0.2, worth 1.25 observations, so that a few
# steps of a prompt outweigh it. Chosen on held-out corpus prompts by replaying the
# greedy outputs (scripts/corpus_prompts.py, scripts/replay_drafters.py): (1, 3) kept
# deep nodes of a copying turn near 0.25 for too long.
AUTO_PRIOR = (0.25, 1.0)

# Bins of a node's own draft probability (``DraftTree.prob``), most confident first: a
# node with q >= 0.8 takes the rank cell 0, q in [0.6, 0.8) cell 1, ..., q < 0.03 cell 7.
PROB_EDGES = np.array([0.8, 0.6, 0.4, 0.25, 0.15, 0.08, 0.03])
# Prior mean of each bin (about its middle): the drafter's word until counts say otherwise.
PROB_PRIOR = np.array([0.9, 0.7, 0.5, 0.32, 0.2, 0.11, 0.05, 0.015])


def prob_bins(prob: np.ndarray) -> np.ndarray:
    """(N,) bin of each draft probability (``PROB_EDGES``); -1 where it is NaN.

    Example::

        >>> prob_bins(np.array([0.95, 0.5, 0.01, np.nan])).tolist()
        [0, 2, 7, -1]
    """
    bins = np.searchsorted(-PROB_EDGES, -prob, side="left")  # (N,)
    return np.where(np.isnan(prob), -1, bins)


class AcceptanceModel:
    """P(node accepted | parent accepted) per (source, depth, sibling rank)."""

    def __init__(
        self,
        n_sources: int = 1,
        max_depth: int = 16,
        max_rank: int = 8,
        prior: tuple[float, float] = AUTO_PRIOR,
        decay: float = 0.998,
        prob_sources: Sequence[int] = (),
    ) -> None:
        """``prob_sources``: the drafters whose nodes carry their own probability; their
        cells start from each bin's ``PROB_PRIOR`` (same weight as ``prior``)."""
        shape = (n_sources, max_depth, max_rank)
        self.hits = np.full(shape, prior[0], np.float64)
        self.tries = np.full(shape, prior[0] + prior[1], np.float64)
        self.prior = prior
        self.decay = decay
        bins = min(max_rank, PROB_PRIOR.size)
        for s in prob_sources:
            self.hits[s, :, :bins] = PROB_PRIOR[None, :bins] * sum(prior)
        self._prior_hits = self.hits.copy()  # what the counts forget back towards

    def _index(self, tree: DraftTree) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n_src, n_depth, n_rank = self.hits.shape
        src = tree.source if tree.source is not None else np.zeros(len(tree), np.int16)
        rank = tree.sibling_rank()  # (N,)
        if tree.prob is not None:  # a drafter's own probability: its bin stands for the rank
            bins = prob_bins(tree.prob)
            rank = np.where(bins >= 0, bins, rank)
        return (
            np.minimum(src.astype(np.int64), n_src - 1),
            np.minimum(tree.depth - 1, n_depth - 1),
            np.minimum(rank, n_rank - 1),
        )

    def index(self, tree: DraftTree) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source, depth, rank) cell of every node; pass it back to ``node_probs`` and
        ``observe`` for the same tree to skip recomputing it."""
        return self._index(tree)

    def node_probs(self, tree: DraftTree, index: tuple[np.ndarray, ...] | None = None) -> np.ndarray:
        """(N,) conditional acceptance probability of each node."""
        i = self._index(tree) if index is None else index
        return (self.hits / self.tries)[i]

    def observe(
        self, tree: DraftTree, emitted: np.ndarray, index: tuple[np.ndarray, ...] | None = None
    ) -> None:
        """Score ``tree`` against the tokens the model emitted after its root: a node is
        *reached* when its parent's path matches, *accepted* when its token matches too."""
        if len(tree) == 0 or emitted.size == 0:
            return
        ok = matched(tree, emitted)
        known = tree.depth <= emitted.size  # deeper nodes cannot be judged yet
        parent_ok = np.where(tree.parents >= 0, ok[np.maximum(tree.parents, 0)], True)
        reached = known & parent_ok
        if not reached.any():
            return
        self.hits = self._prior_hits + (self.hits - self._prior_hits) * self.decay
        self.tries = sum(self.prior) + (self.tries - sum(self.prior)) * self.decay
        s, d, r = (a[reached] for a in (self._index(tree) if index is None else index))
        np.add.at(self.tries, (s, d, r), 1.0)
        np.add.at(self.hits, (s, d, r), ok[reached].astype(np.float64))


def matched(tree: DraftTree, emitted: np.ndarray) -> np.ndarray:
    """(N,) bool: the node and all its ancestors equal the emitted tokens at their depth.

    Example::

        >>> t = DraftTree.from_paths([[1, 2], [1, 3], [4]])
        >>> matched(t, np.array([1, 3])).tolist()   # nodes: 1, 4, 2, 3
        [True, False, False, True]
    """
    if len(tree) == 0 or emitted.size == 0:
        return np.zeros(len(tree), bool)
    depth = tree.depth
    at = np.minimum(depth, emitted.size) - 1  # (N,) the emitted token at the node's depth
    own = (depth <= emitted.size) & (tree.tokens == emitted[at])  # (N,) the node alone
    return path_reduce(tree.parents, own, np.logical_and, tree.max_depth)  # and every ancestor
