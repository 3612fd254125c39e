"""Acceptance: which drafted nodes the target model agrees with, written once for all
backends.

Words: a node is *accepted* when the token the target emits at its parent equals the
node's token; the accepted nodes form one root-to-node *path*; the *bonus* token is the
token the target emits after the last accepted node (always one, so a step emits
``len(path) + 1`` tokens).

Both rules below walk down from the root. At each row the target's token is produced by
``draftwise.core.sampling.next_token`` from that row's logits and one uniform number; if
a child carries that token we descend, else the token is the bonus. For greedy decoding
that is "longest path whose tokens equal the target's argmax". For sampling it is exact:
every emitted token is a sample of the target's processed distribution given the tokens
before it (the tree only decides which conditionals were precomputed), so the output
distribution equals plain sampling, and with the same uniforms it is the same output.

Example (greedy, target argmax per row given)::

    >>> from draftwise.core.tree import DraftTree
    >>> t = DraftTree.from_paths([[5, 6, 7], [5, 8]])   # tokens [5, 6, 8, 7]
    >>> accept_greedy(t, np.array([5, 8, 9, 9, 9]))   # row 0 -> 5, row 1 (node 5) -> 8
    ([0, 2], 9)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from draftwise.core.tree import DraftTree


def _child_with(tree: DraftTree, node: int, token: int) -> int:
    """Index of the child of ``node`` (-1 = root) carrying ``token``, or -1."""
    hits = np.flatnonzero((tree.parents == node) & (tree.tokens == token))
    return int(hits[0]) if hits.size else -1


def accept(tree: DraftTree, emit: Callable[[int, list[int]], int]) -> tuple[list[int], int]:
    """Descend from the root: ``emit(row, path)`` gives the target's token at ``row``
    (0 = root, ``i + 1`` = node i) after the accepted ``path``. Returns (path, bonus)."""
    path: list[int] = []
    node = -1
    while True:
        token = emit(node + 1, path)
        child = _child_with(tree, node, token) if len(tree) else -1
        if child < 0:
            return path, token
        path.append(child)
        node = child


def accept_greedy(tree: DraftTree, argmax: np.ndarray) -> tuple[list[int], int]:
    """Greedy acceptance from the target's argmax per row ``argmax[N+1]``."""
    return accept(tree, lambda row, _path: int(argmax[row]))
