"""Draft trees: the guesses a drafter hands to the model for one verification pass.

A ``DraftTree`` holds ``N`` draft nodes as flat arrays, in topological order (a node's
parent always comes before it):

- ``tokens[N]``: the drafted token of each node;
- ``parents[N]``: the index of each node's parent, ``-1`` for children of the root;
- optional ``source[N]`` (which drafter proposed the node) and ``prob[N]`` (the proposing
  drafter's own probability of the node given its parent's path, NaN where it has none;
  ``auto`` calibrates it into an acceptance estimate).

The *root* is the last token of the context that is not in the model's KV cache yet (the
previous step's bonus token). It is not stored in the tree; backends verify the
``N + 1`` rows ``[root, node 0, ..., node N-1]`` in one forward pass, and row ``i + 1``
of the result predicts the children of node ``i`` (row 0 predicts the root's children).

Worked example: the chains ``[5, 6, 7]`` and ``[5, 8]`` share the prefix ``5``::

    >>> t = DraftTree.from_paths([[5, 6, 7], [5, 8]])
    >>> t.tokens.tolist(), t.parents.tolist()
    ([5, 6, 8, 7], [-1, 0, 0, 1])
    >>> t.depth.tolist()          # root children have depth 1
    [1, 2, 2, 3]
    >>> t.verify_mask().astype(int).tolist()   # rows/cols: root, then the 4 nodes
    [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 1, 0, 1]]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from draftwise.errors import DraftwiseError


@dataclass(frozen=True)
class DraftTree:
    """Draft nodes as arrays; see the module docstring for the conventions."""

    tokens: np.ndarray  # (N,) int64
    parents: np.ndarray  # (N,) int64, -1 = child of the root
    source: np.ndarray | None = None  # (N,) int16 drafter id per node, optional
    prob: np.ndarray | None = None  # (N,) float64 draft probability per node, optional
    _depth: np.ndarray = field(init=False, repr=False, compare=False)
    # the deepest node's depth, computed on first use (-1: not yet)
    _max_depth: int = field(init=False, repr=False, compare=False, default=-1)

    def __post_init__(self) -> None:
        tokens = np.asarray(self.tokens, dtype=np.int64).reshape(-1)
        parents = np.asarray(self.parents, dtype=np.int64).reshape(-1)
        if tokens.shape != parents.shape:
            raise DraftwiseError(
                f"draft tree needs as many parents as tokens, got {parents.size} and {tokens.size}"
            )
        idx = np.arange(tokens.size)
        if tokens.size and (np.any(parents >= idx) or np.any(parents < -1)):
            raise DraftwiseError("draft tree parents must point to earlier nodes (or -1)")
        depth = np.empty(tokens.size, dtype=np.int64)
        for i, p in enumerate(parents.tolist()):  # faster than vector steps below ~100 nodes
            depth[i] = 1 if p < 0 else depth[p] + 1
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "_depth", depth)
        if self.source is not None:
            object.__setattr__(self, "source", np.asarray(self.source, dtype=np.int16))
        if self.prob is not None:
            prob = np.asarray(self.prob, dtype=np.float64).reshape(-1)
            if prob.shape != tokens.shape:
                raise DraftwiseError(
                    f"draft tree needs one probability per node, got {prob.size} for {tokens.size}"
                )
            object.__setattr__(self, "prob", prob)

    # ----- construction -------------------------------------------------------------
    @classmethod
    def _trusted(
        cls,
        tokens: np.ndarray,
        parents: np.ndarray,
        source: np.ndarray | None,
        depth: np.ndarray,
        prob: np.ndarray | None = None,
        max_depth: int = -1,
    ) -> DraftTree:
        """A tree from arrays already known valid (int64 ``tokens`` and ``parents`` in
        topological order, their ``depth``; ``max_depth`` when known, else -1): the hot
        path skips the checks."""
        tree = object.__new__(cls)
        fields = tree.__dict__  # what object.__setattr__ would write, one call each
        fields["tokens"] = tokens
        fields["parents"] = parents
        fields["source"] = source
        fields["prob"] = prob
        fields["_depth"] = depth
        fields["_max_depth"] = max_depth
        return tree

    def with_prob(self, prob: np.ndarray) -> DraftTree:
        """This tree with the drafter's own probability of each node (N,)."""
        return DraftTree(self.tokens, self.parents, self.source, prob)

    @classmethod
    def empty(cls) -> DraftTree:
        """A tree with no drafts: verifying it is one plain decoding step."""
        return cls._trusted(np.zeros(0, np.int64), np.zeros(0, np.int64), None,
                            np.zeros(0, np.int64), None, 0)

    @classmethod
    def chain(cls, tokens: Sequence[int]) -> DraftTree:
        """A single path: node ``i``'s parent is ``i - 1``."""
        n = len(tokens)
        return cls(np.asarray(tokens, np.int64), np.arange(-1, n - 1, dtype=np.int64))

    @classmethod
    def from_paths(
        cls,
        paths: Iterable[Sequence[int]],
        budget: int | None = None,
        sources: Iterable[int] | None = None,
    ) -> DraftTree:
        """Merge token paths into one tree, deduplicating shared prefixes (a trie).

        Nodes are laid out in breadth-first order so that cutting the tree to ``budget``
        nodes keeps the shallow, most useful part of every path.
        """
        builder = TreeBuilder()
        src_iter = iter(sources) if sources is not None else None
        for path in paths:
            src = next(src_iter) if src_iter is not None else 0
            builder.add_path(-1, path, source=src)
        return builder.build(budget)

    # ----- derived quantities ---------------------------------------------------------
    def __len__(self) -> int:
        return int(self.tokens.size)

    @property
    def depth(self) -> np.ndarray:
        """(N,) depth of each node; children of the root have depth 1."""
        return self._depth

    @property
    def max_depth(self) -> int:
        """Depth of the deepest node (0 for an empty tree); computed once."""
        md = self._max_depth
        if md < 0:
            md = int(self._depth.max()) if self._depth.size else 0
            object.__setattr__(self, "_max_depth", md)
        return md

    def ancestor_mask(self) -> np.ndarray:
        """(N, N) bool: ``mask[i, j]`` is True when node j is node i or an ancestor of it."""
        n = self.tokens.size
        mask = np.zeros((n, n), dtype=bool)
        for i, p in enumerate(self.parents.tolist()):
            if p >= 0:
                mask[i, : p + 1] = mask[p, : p + 1]
            mask[i, i] = True
        return mask

    def verify_mask(self) -> np.ndarray:
        """(N+1, N+1) bool attention mask over ``[root, nodes]``: the root sees itself,
        every node sees the root, its ancestors and itself. Cached keys (the context
        before the root) are visible to every row and are not part of this mask."""
        n = self.tokens.size
        mask = np.zeros((n + 1, n + 1), dtype=bool)
        mask[:, 0] = True
        mask[1:, 1:] = self.ancestor_mask()
        return mask

    def verify_positions(self) -> np.ndarray:
        """(N+1,) position offsets of ``[root, nodes]`` relative to the root's position."""
        return np.concatenate([[0], self._depth]).astype(np.int64)

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node`` (inclusive)."""
        out: list[int] = []
        while node >= 0:
            out.append(node)
            node = int(self.parents[node])
        return out[::-1]

    def sibling_rank(self) -> np.ndarray:
        """(N,) position of each node among its parent's children (0 = first listed)."""
        n = self.tokens.size
        order = self.parents.argsort(kind="stable")  # (N,) siblings adjacent, in order
        grouped = self.parents[order]
        rank = np.empty(n, np.int64)
        rank[order] = np.arange(n) - grouped.searchsorted(grouped)  # minus the group's start
        return rank

    def subset(self, keep: np.ndarray) -> DraftTree:
        """The tree of the nodes ``keep`` (indices; every kept node's parent must be kept
        too), in their original relative order."""
        keep = np.array(keep, np.int64).reshape(-1)
        keep.sort()
        remap = np.empty(self.tokens.size + 1, np.int64)  # last slot maps the root (-1)
        remap.fill(-1)
        remap[keep] = np.arange(keep.size)
        parents = self.parents[keep]
        new_parents = remap[parents]
        if ((new_parents < 0) & (parents >= 0)).any():
            raise DraftwiseError("a subset of a draft tree must keep every kept node's parent")
        src = self.source[keep] if self.source is not None else None
        prob = self.prob[keep] if self.prob is not None else None
        return DraftTree._trusted(self.tokens[keep], new_parents, src, self._depth[keep], prob)

    def is_chain(self) -> bool:
        return bool(np.array_equal(self.parents, np.arange(-1, self.tokens.size - 1)))


class TreeBuilder:
    """Incremental trie of draft tokens, used by drafters to grow trees node by node.

    Example::

        >>> b = TreeBuilder()
        >>> a, _ = b.add_path(-1, [3, 4])  # the last node's index, complete?
        >>> _ = b.add_path(a, [9])         # grow below node `a`
        >>> _ = b.add_path(-1, [3, 7])     # shares node for token 3
        >>> t = b.build()
        >>> t.tokens.tolist(), t.parents.tolist()
        ([3, 4, 7, 9], [-1, 0, 0, 1])
    """

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.sources: list[int] = []
        self.depths: list[int] = []  # 1 for children of the root
        self._children: dict[tuple[int, int], int] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def child(self, parent: int, token: int) -> int | None:
        return self._children.get((parent, token))

    def add(self, parent: int, token: int, source: int = 0) -> tuple[int, bool]:
        """Add one node (or find the existing one); returns (index, created)."""
        key = (parent, int(token))
        found = self._children.get(key)
        if found is not None:
            return found, False
        idx = len(self.tokens)
        self.tokens.append(key[1])
        self.parents.append(parent)
        self.sources.append(source)
        self.depths.append(self.depths[parent] + 1 if parent >= 0 else 1)
        self._children[key] = idx
        return idx, True

    def add_path(
        self, parent: int, path: Sequence[int], source: int = 0, limit: int | None = None
    ) -> tuple[int, bool]:
        """Add ``path`` below ``parent``; stops creating nodes once the tree holds
        ``limit`` nodes. Returns (deepest node reached or ``parent``, whole path added)."""
        children, tokens, depths = self._children, self.tokens, self.depths
        node = parent
        for tok in path:
            key = (node, int(tok))
            existing = children.get(key)
            if existing is None:  # a new node (``add``, inlined: the hot path)
                existing = len(tokens)
                if limit is not None and existing >= limit:
                    return node, False
                tokens.append(key[1])
                self.parents.append(node)
                self.sources.append(source)
                depths.append(depths[node] + 1 if node >= 0 else 1)
                children[key] = existing
            node = existing
        return node, True

    def build(self, budget: int | None = None) -> DraftTree:
        """Return the tree in breadth-first order, cut to ``budget`` nodes."""
        n = len(self.tokens)
        if n == 0:
            return DraftTree.empty()
        depth = np.array(self.depths, np.int64)
        order = depth.argsort(kind="stable")  # by depth, then creation order
        if budget is not None:
            order = order[: max(budget, 0)]
        remap = np.empty(n + 1, np.int64)  # index n stands for the root (-1)
        remap.fill(-1)
        remap[order] = np.arange(order.size)
        new_parents = remap[np.array(self.parents, np.int64)[order]]
        tokens = np.array(self.tokens, np.int64)[order]
        sources = np.array(self.sources, np.int16)[order]
        return DraftTree._trusted(tokens, new_parents, sources, depth[order])


def merge_trees(trees: Sequence[DraftTree], budget: int | None = None) -> DraftTree:
    """Merge trees rooted at the same context into one, deduplicating shared prefixes.
    Earlier trees win ties: the result is breadth-first, and within a depth the first
    tree's nodes come first, so cutting to ``budget`` favours them. A node's ``source``
    is the index of the first tree that proposed it, its ``prob`` that tree's (NaN when
    that tree has none; no ``prob`` at all when no tree has one).

    Example::

        >>> a = DraftTree.chain([1, 2]); b = DraftTree.chain([1, 3])
        >>> m = merge_trees([a, b]); m.tokens.tolist(), m.parents.tolist()
        ([1, 2, 3], [-1, 0, 0])
    """
    children: dict[tuple[int, int], int] = {}  # (merged parent, token) -> merged node
    get = children.get
    tokens: list[int] = []
    parents: list[int] = []
    sources: list[int] = []
    depths: list[int] = []
    probs: list[float] = []
    any_prob = any(t.prob is not None for t in trees)
    for k, tree in enumerate(trees):
        if not tree.tokens.size:
            continue
        own: list[float] | None = None
        if any_prob:
            own = tree.prob.tolist() if tree.prob is not None else [float("nan")] * len(tree)
        tok_l, par_l, dep_l = tree.tokens.tolist(), tree.parents.tolist(), tree.depth.tolist()
        if not tokens:  # the first tree with nodes: all its (parent, token) pairs are new
            children.update(zip(zip(par_l, tok_l), range(len(tok_l))))
            if len(children) == len(tok_l):  # no repeated sibling: it maps onto itself
                tokens, parents, depths, sources = tok_l, par_l, dep_l, [k] * len(tok_l)
                if own is not None:
                    probs = own
                continue
            children.clear()  # a repeated sibling: merge it node by node below
        mapped: list[int] = []  # node of ``tree`` -> merged node
        for i, (tok, par, d) in enumerate(zip(tok_l, par_l, dep_l)):
            key = (mapped[par] if par >= 0 else -1, tok)
            node = get(key)
            if node is None:
                node = children[key] = len(tokens)
                tokens.append(tok)
                parents.append(key[0])
                sources.append(k)
                depths.append(d)
                if own is not None:
                    probs.append(own[i])
            mapped.append(node)
    n = len(tokens)
    if n == 0:
        return DraftTree.empty()
    depth = np.array(depths, np.int64)
    order = depth.argsort(kind="stable")  # breadth-first, then creation order
    if budget is not None:
        order = order[: max(budget, 0)]
    remap = np.empty(n + 1, np.int64)  # index n stands for the root (-1)
    remap.fill(-1)
    remap[order] = np.arange(order.size)
    new_parents = remap[np.array(parents, np.int64)[order]]
    src = np.array(sources, np.int16)[order]
    prob = np.array(probs, np.float64)[order] if any_prob else None
    return DraftTree._trusted(
        np.array(tokens, np.int64)[order], new_parents, src, depth[order], prob,
        max(depths) if budget is None else -1,
    )


def path_reduce(
    parents: np.ndarray, values: np.ndarray, op: np.ufunc, max_depth: int | None = None
) -> np.ndarray:
    """(N,) ``op`` of ``values`` over each node and all its ancestors (``parents[i] < i``,
    ``-1`` = none), by pointer doubling: log2(``max_depth``) vector steps (the tree's
    depth when known, else enough for any), no node loop.

    Example::

        >>> path_reduce(np.array([-1, 0, 1, 0]), np.array([1, 1, 1, 1]), np.add).tolist()
        [1, 2, 3, 2]
    """
    n = parents.size
    acc = np.empty(n + 1, values.dtype)  # slot n: the root, holding op's identity
    acc[:n], acc[n] = values, op.identity
    # acc[i] covers i and its ancestors below jump[i]; -1 (the root) reads slot n and
    # stays -1 (jump[-1] is jump[n] = -1)
    jump = np.empty(n + 1, np.int64)
    jump[:n], jump[n] = parents, -1
    # after k doublings acc[i] covers 2**k path nodes: depth.bit_length() rounds reach the root
    rounds = max_depth.bit_length() if max_depth is not None else n.bit_length()
    for k in range(rounds):
        acc = op(acc, acc[jump])  # the root's slot stays op(identity, identity) = identity
        if k + 1 < rounds:
            jump = jump[jump]
    return acc[:n]
