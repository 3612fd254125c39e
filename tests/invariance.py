"""Helpers of the batch-invariance tests of both backends: plain one-row steps, and a
tree that hides a path among random siblings."""

from __future__ import annotations

import numpy as np

from draftwise.core.backend import Backend
from draftwise.core.tree import DraftTree


def plain_logits(be: Backend, ctx: np.ndarray, path: list[int]) -> list[np.ndarray]:
    """Logits of plain one-row steps over ``ctx[-1]`` then ``path``; cache left at ctx[:-1]."""
    out = []
    for tok in [int(ctx[-1]), *path]:
        v = be.verify(tok, DraftTree.empty(), need_logits=True)
        be.commit(np.array([0]))
        assert v.logits is not None
        out.append(v.logits[0].copy())
    be.trim(len(ctx) - 1)
    return out


def tree_with_path(
    rng: np.random.Generator, path: list[int], n_other: int, vocab: int
) -> tuple[DraftTree, list[int]]:
    """Random single-token siblings, the path (as a chain), more siblings; returns the
    tree and the verify rows of the path's nodes (root row 0 first)."""
    before = n_other // 2
    paths = [[int(t)] for t in rng.integers(0, vocab, before)]
    paths.append(path)
    paths += [[int(t)] for t in rng.integers(0, vocab, n_other - before)]
    tree = DraftTree.from_paths(paths)
    rows = [0]
    for depth in range(len(path)):
        node = next(
            i
            for i in range(len(tree))
            if tree.tokens[tree.path_to(i)].tolist() == path[: depth + 1]
        )
        rows.append(node + 1)
    return tree, rows
