"""Batched verification (The N-Grammys): k drafts of length w as k independent rows.

Instead of one tree, the model runs a batch of ``k`` rows ``[root, d_i1 .. d_iw]`` at
positions ``cache_len .. cache_len + w``, every row attending to the shared KV cache and
causally to itself, with no custom mask. Row ``i`` predicts after each of its prefixes,
so its *accepted length* is the longest prefix of draft ``i`` that equals the model's
argmax chain; the best row (first among equals) is kept and its argmax after the
accepted prefix is the *bonus* token. For the same drafts this accepts exactly what the
tree path accepts (``DraftTree.from_paths(drafts)`` + greedy acceptance): both emit the
model's greedy chain as far as some draft follows it.

A backend that can do this implements :class:`BatchVerifier`; the decoding loop uses it
for drafters that propose a (k, w) matrix (:class:`BatchDrafter`) when greedy decoding
and the backend's ``batch_by_default`` (measured per backend) or the drafter asks for it.

Example::

    >>> drafts = np.array([[5, 6, 7], [5, 8, 1]])
    >>> argmax = np.array([[5, 8, 2, 0], [5, 8, 3, 4]])   # (k, w + 1) from the model
    >>> accept_batch(drafts, argmax)       # row 1 matches 2 tokens, then the bonus 3
    (1, 2, 3)
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from draftwise.errors import DraftwiseError


@runtime_checkable
class BatchVerifier(Protocol):
    """A backend that verifies a (k, w) draft matrix as k rows in one forward."""

    batch_by_default: bool  # True where the batch path measured faster than the tree

    def verify_batch(self, root: int, drafts: np.ndarray) -> np.ndarray:
        """One forward over rows ``[root, drafts[i]]`` (k, w + 1) at positions
        ``cache_len + 0..w``; returns the argmax (k, w + 1) int64. Does not grow the cache."""

    def commit_batch(self, row: int, n: int) -> None:
        """Keep the first ``n`` entries (root + n - 1 drafts) of ``row`` of the last
        ``verify_batch`` in the cache; ``cache_len`` grows by ``n``."""


@runtime_checkable
class BatchDrafter(Protocol):
    """A drafter that can hand its guesses over as a (k, w) matrix of equal-length rows."""

    name: str
    verify: str  # "auto" (the backend's default path), "tree" or "batch"

    def propose_batch(self, context: np.ndarray, budget: int) -> np.ndarray:
        """(k, w) int64 drafts after ``context`` (possibly (0, w): nothing to propose)."""


def check_drafts(drafts: np.ndarray) -> np.ndarray:
    """``drafts`` as a (k, w) int64 array; raises DraftwiseError naming the bad shape."""
    d = np.asarray(drafts)
    if d.ndim != 2 or d.dtype.kind not in "iu":
        raise DraftwiseError(f"drafts must be a (k, w) integer array, got shape {d.shape} ({d.dtype})")
    return d.astype(np.int64, copy=False)


def accept_batch(drafts: np.ndarray, argmax: np.ndarray) -> tuple[int, int, int]:
    """Greedy acceptance over rows: (best row, accepted drafts in it, bonus token).

    ``drafts`` (k, w); ``argmax`` (k, w + 1), row i's model prediction after the root and
    after each of its drafted tokens. With k == 0 rows, ``argmax`` is (1, 1) from a plain
    step and the result is (0, 0, argmax[0, 0]).
    """
    k, w = drafts.shape
    if k == 0 or w == 0:
        return 0, 0, int(argmax[0, 0])
    match = drafts == argmax[:, :w]  # (k, w)
    acc = np.cumprod(match, axis=1).sum(axis=1)  # (k,) accepted prefix length per row
    best = int(np.argmax(acc))
    n = int(acc[best])
    return best, n, int(argmax[best, n])
