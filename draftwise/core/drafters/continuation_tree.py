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
    if m == 1:  # one continuation: its tokens up to the budget, a chain
        return _single(conts[0], budget)
    order = np.lexsort(conts.T[::-1])  # rows in lexicographic order: shared prefixes adjacent
    c = conts.T[:, order]  # (w, m) depth-major: row d holds every continuation's token d
    cells = w * m
    # new[d, i]: row i's prefix of length d + 1 differs from row i - 1's: a new trie node
    new = np.empty((w, m), dtype=bool)
    new[:, 0] = True
    np.logical_or.accumulate(c[:, 1:] != c[:, :-1], axis=0, out=new[:, 1:])
    # numbering nodes depth-major keeps every parent id below its children's ids
    flat_new = new.reshape(cells)  # (w*m,) each node's cells are one run
    starts = flat_new.nonzero()[0]  # (n,) first cell of each node's run
    n = starts.size
    token = c.reshape(cells)[starts]  # (n,)
    depth = starts // m  # (n,) 0-based
    # the parent: the node whose run holds the cell one depth up (-1 above depth 0)
    parent = starts.searchsorted(starts - m, "right") - 1
    # a node's rows share its prefix (so all are valid or none): per-run count and max
    count = np.empty(n, np.int64)  # (n,) continuations through the node: its run length
    count[:-1] = starts[1:]
    count[-1] = cells
    count -= starts
    rec = np.empty((w, m), np.int64)
    rec[:] = np.asarray(recency, dtype=np.int64)[order]
    newest = np.maximum.reduceat(rec.reshape(cells), starts)  # (n,) newest of them
    # rank: count descending, then newest descending, then shallow first (node ids are
    # depth-major, so the stable sort's index order is that last key); -1 cells are no nodes
    rank = np.lexsort((-newest, -count))
    chosen = rank[token[rank] >= 0][:budget]
    chosen = chosen[depth[chosen].argsort(kind="stable")]  # parents before children
    k = chosen.size
    remap = np.empty(n + 1, np.int64)  # remap[-1] (the root) stays -1
    remap.fill(-1)
    remap[chosen] = np.arange(k)
    src = np.zeros(k, np.int16)
    return DraftTree._trusted(token[chosen], remap[parent[chosen]], src, depth[chosen] + 1)


def _single(row: np.ndarray, budget: int) -> DraftTree:
    """``continuation_tree`` of one continuation ``row`` (w,): its first ``budget`` valid
    cells, each hung below the cell before it (the root when that cell is ``-1``)."""
    keep = (row >= 0).nonzero()[0][:budget]  # (k,) cells, shallow first
    k = keep.size
    parents = np.arange(-1, k - 1, dtype=np.int64)
    if k and keep[-1] != k - 1:  # a -1 inside the row: what follows it hangs off the root
        parents[1:][keep[1:] != keep[:-1] + 1] = -1
    return DraftTree._trusted(row[keep], parents, np.zeros(k, np.int16), keep + 1)
