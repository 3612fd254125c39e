"""Each verify row's logical key list, cut into fixed blocks: the plan both backends'
batch-invariant attention follows (``backends/*/invariant.py``).

A row at tree position i sees the committed cache ``0 .. committed-1`` and then its own
ancestors and itself: exactly the keys a plain step at that position sees. The list is
cut into blocks of ``block`` logical positions: the blocks that lie wholly in the
committed cache (slots ``0 .. shared-1``) are the same for every row; the rest, the
"tail", is gathered per row and padded at the end with masked slots.

Example::

    >>> shared, idx, ok = key_blocks(committed=5, rows=[[5], [5, 6]], block=4)
    >>> shared, idx.tolist(), ok.sum(1).tolist()
    (4, [[4, 5, 0, 0], [4, 5, 6, 0]], [2, 3])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BLOCK = 64  # logical key positions per attention block


def key_blocks(
    committed: int, rows: Sequence[Sequence[int]], block: int = BLOCK, share: bool = True
) -> tuple[int, np.ndarray, np.ndarray]:
    """``rows[i]``: the cache slots at or after ``committed`` that row i sees (its tree
    ancestors and itself, in depth order). Returns ``(shared, tail_idx, tail_ok)``:
    ``shared`` keys in whole blocks below ``committed``, and per row the slots of the rest
    of its list, (T, nT * block) int64, with ``tail_ok`` False on padding (slot 0).
    ``share=False``: no shared part (``shared`` = 0), every row's whole list is gathered;
    the blocks, and so the arithmetic per block, are the same either way."""
    shared = (committed // block) * block if share else 0
    lens = [committed - shared + len(r) for r in rows]
    width = -(-max(lens) // block) * block
    idx = np.zeros((len(rows), width), np.int64)  # (T, nT B); padding reads slot 0
    ok = np.zeros((len(rows), width), bool)  # (T, nT B)
    prefix = np.arange(shared, committed, dtype=np.int64)
    for i, r in enumerate(rows):
        idx[i, : lens[i]] = np.concatenate([prefix, np.asarray(r, np.int64)])
        ok[i, : lens[i]] = True
    return shared, idx, ok
