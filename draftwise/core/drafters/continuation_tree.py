"""Turn the continuations found after earlier matches into one draft tree.

Every continuation is a path below the root. Merged into a trie, a node's *count* is
the number of continuations passing through it: among the matches, the empirical chance
that the model's output starts with that node's path. Keeping the ``budget`` nodes with
the highest count maximises the expected number of accepted tokens under that
distribution, and since a node's count never exceeds its parent's, the kept nodes always
form a tree. Ties go to the more recent match (the newest logical end position through
the node), then to the shallower node, so a parent is always kept before its child.

Worked example: three matches continue with ``[7, 8, 9]``, ``[7, 8, 2]`` and
``[4, 5, -1]`` (``-1``: the request ended), the last being the newest::

    >>> conts = np.array([[7, 8, 9], [7, 8, 2], [4, 5, -1]])
    >>> t = continuation_tree(conts, recency=np.array([10, 20, 30]), budget=4)
    >>> t.tokens.tolist(), t.parents.tolist()   # 7, 8 seen twice; then the newest: 4, 5
    ([7, 4, 8, 5], [-1, -1, 0, 1])
"""

from __future__ import annotations

import numpy as np

from draftwise.core.tree import DraftTree


def continuation_tree(conts: np.ndarray, recency: np.ndarray, budget: int) -> DraftTree:
    """Draft tree of at most ``budget`` nodes from ``conts`` (m, w) (``-1`` pads a
    continuation that stopped early) and ``recency`` (m,) (larger = newer)."""
    conts = np.asarray(conts, dtype=np.int64)
    if conts.ndim != 2 or conts.size == 0 or budget <= 0:
        return DraftTree.empty()
    m, w = conts.shape
    order = np.lexsort(conts.T[::-1])  # rows in lexicographic order: shared prefixes adjacent
    c = conts[order]  # (m, w)
    rec = np.asarray(recency, dtype=np.int64)[order]  # (m,)
    # new[i, d]: row i's prefix of length d + 1 differs from row i - 1's: a new trie node
    new = np.ones((m, w), dtype=bool)
    new[1:] = np.logical_or.accumulate(c[1:] != c[:-1], axis=1)
    # numbering nodes depth-major keeps every parent id below its children's ids
    flat_new = new.T.ravel()  # (w*m,) depth-major: each node's cells are one run
    ids = (np.cumsum(flat_new) - 1).reshape(w, m).T  # (m, w) node id per cell
    n = int(ids[-1, -1]) + 1
    token = np.full(n, -1, np.int64)
    token[ids] = c
    parent = np.full(n, -1, np.int64)
    parent[ids[:, 1:]] = ids[:, :-1]
    depth = np.empty(n, np.int64)
    depth[ids] = np.arange(w)
    # a node's rows share its prefix (so all are valid or none): per-run count and max
    starts = np.flatnonzero(flat_new)  # (n,) first cell of each node's run
    count = np.diff(starts, append=flat_new.size)  # (n,) continuations through the node
    newest = np.maximum.reduceat(np.tile(rec, w), starts)  # (n,) newest of them
    cand = np.flatnonzero(token >= 0)
    # rank: count descending, then newest descending, then shallow first
    rank = np.lexsort((depth[cand], -newest[cand], -count[cand]))
    chosen = cand[rank[:budget]]
    chosen = chosen[np.argsort(depth[chosen], kind="stable")]  # parents before children
    remap = np.full(n + 1, -1, np.int64)  # remap[-1] (the root) stays -1
    remap[chosen] = np.arange(chosen.size)
    src = np.zeros(chosen.size, np.int16)
    return DraftTree._trusted(token[chosen], remap[parent[chosen]], src, depth[chosen] + 1)
