"""Build a Cacheback frozen table from token streams (seed §4), in bounded memory.

Every (LL+FL)-gram window of every stream is one (leader, follower) observation. The
table keeps the LC leaders with the most observations and, per leader, its FC most
frequent followers. Ties go to the lexicographically smaller token tuple, so the result is
deterministic. A leader's count is the number of its windows, i.e. its occurrences with at
least FL tokens after it in the same stream.

Counting is numpy only: each window is hashed to a 64-bit key (``hash_rows``); windows are
buffered up to ``chunk_tokens``, reduced with ``np.unique(..., return_counts=True)`` and
merged into a running (key, count, gram) table. When that table exceeds ``max_keys``
entries it is pruned to the ``max_keys // 2`` most frequent grams; counts are then
approximate (heavy hitters survive) and ``NgramCounter.pruned`` is set. Without pruning
the counts are exact, barring a 64-bit hash collision (odds ~K^2 / 2^65 for K keys).

Example (LL=1, FL=1)::

    >>> t = build_frozen_table([np.array([1, 2, 1, 2, 1, 3])], ll=1, fl=1, lc=2, fc=2)
    >>> list(t.items())            # leader 1: (1,2) twice, (1,3) once; leader 2: (2,1) twice
    [((1,), [(2,), (3,)]), ((2,), [(1,)])]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from draftwise.core.drafters.frozen_table import FrozenTable, hash_rows
from draftwise.errors import DraftwiseError


class NgramCounter:
    """Counts n-gram windows of token streams with bounded memory (see module doc)."""

    def __init__(self, n: int, max_keys: int = 1 << 22, chunk_tokens: int = 1 << 20) -> None:
        if n < 1 or max_keys < 2 or chunk_tokens < 1:
            raise DraftwiseError(
                f"n-gram counter needs n >= 1, max_keys >= 2, chunk_tokens >= 1; got "
                f"{n}, {max_keys}, {chunk_tokens}"
            )
        self.n, self.max_keys, self.chunk_tokens = n, max_keys, chunk_tokens
        self.keys = np.zeros(0, np.uint64)  # sorted
        self.counts = np.zeros(0, np.int64)
        self.grams = np.zeros((0, n), np.int32)
        self.pruned = False
        self._pending: list[np.ndarray] = []
        self._pending_rows = 0

    def add(self, tokens: np.ndarray) -> None:
        """Count every n-gram window of one stream (windows never cross streams)."""
        tokens = np.asarray(tokens)
        if tokens.ndim != 1:
            raise DraftwiseError(f"a token stream must be 1-D, got shape {tokens.shape}")
        if tokens.size and (tokens.min() < 0 or tokens.max() > np.iinfo(np.int32).max):
            raise DraftwiseError("token ids must be in 0..2^31-1")
        if tokens.size < self.n:
            return
        windows = np.lib.stride_tricks.sliding_window_view(tokens.astype(np.int32), self.n)
        self._pending.append(windows)
        self._pending_rows += windows.shape[0]
        if self._pending_rows >= self.chunk_tokens:
            self.flush()

    def flush(self) -> None:
        """Fold the buffered windows into the running counts."""
        if not self._pending:
            return
        grams = np.concatenate(self._pending)
        self._pending, self._pending_rows = [], 0
        keys, first, counts = np.unique(hash_rows(grams), return_index=True, return_counts=True)
        self._merge(keys, counts.astype(np.int64), grams[first])

    def _merge(self, keys: np.ndarray, counts: np.ndarray, grams: np.ndarray) -> None:
        all_keys = np.concatenate([self.keys, keys])
        order = np.argsort(all_keys, kind="stable")
        all_keys = all_keys[order]
        starts = np.flatnonzero(np.r_[True, all_keys[1:] != all_keys[:-1]])
        self.keys = all_keys[starts]
        self.counts = np.add.reduceat(np.concatenate([self.counts, counts])[order], starts)
        self.grams = np.concatenate([self.grams, grams])[order[starts]]
        if self.keys.size > self.max_keys:
            keep = np.lexsort((self.keys, -self.counts))[: self.max_keys // 2]
            keep.sort()  # keys stay sorted
            self.keys, self.counts, self.grams = (
                self.keys[keep],
                self.counts[keep],
                self.grams[keep],
            )
            self.pruned = True

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(grams (K, n) int32, counts (K,) int64) of every distinct gram counted."""
        self.flush()
        return self.grams, self.counts

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.counts.nbytes + self.grams.nbytes)


def select_top(
    grams: np.ndarray, counts: np.ndarray, ll: int, lc: int, fc: int, fl: int | None = None
) -> FrozenTable:
    """The frozen table of the LC most frequent leaders and their FC most frequent
    followers, from distinct (leader + follower) ``grams`` (K, LL+FL) and their ``counts``."""
    grams = np.asarray(grams, np.int32)
    fl = grams.shape[1] - ll if fl is None else fl
    if grams.shape[0] == 0:
        return FrozenTable(np.zeros((0, ll), np.int32), np.zeros(1), np.zeros((0, fl)), fc=fc)
    cols = [grams[:, c] for c in range(grams.shape[1])]
    # group by leader (lexicographic), then total each leader's windows
    by_leader = np.lexsort(cols[:ll][::-1])
    lead = grams[by_leader, :ll]
    starts = np.flatnonzero(np.r_[True, np.any(lead[1:] != lead[:-1], axis=1)])
    totals = np.add.reduceat(counts[by_leader], starts)
    # leader rank: most windows first; the stable sort keeps lexicographic order on ties
    rank_of_group = np.empty(starts.size, np.int64)
    rank_of_group[np.argsort(-totals, kind="stable")] = np.arange(starts.size)
    group = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, grams.shape[0]]))
    rank = np.empty(grams.shape[0], np.int64)
    rank[by_leader] = rank_of_group[group]
    keep = rank < lc
    grams, counts, rank = grams[keep], counts[keep], rank[keep]
    # within a leader: most frequent follower first, then lexicographic
    order = np.lexsort(
        [grams[:, c] for c in range(grams.shape[1] - 1, ll - 1, -1)] + [-counts, rank]
    )
    grams, rank = grams[order], rank[order]
    first = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]])
    within = np.arange(rank.size) - np.repeat(first, np.diff(np.r_[first, rank.size]))
    keep = within < fc
    grams, rank = grams[keep], rank[keep]
    first = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1]])
    offsets = np.r_[first, rank.size]
    return FrozenTable(grams[first, :ll], offsets, grams[:, ll:], fc=fc)


def build_frozen_table(
    token_streams: Iterable[np.ndarray],
    ll: int,
    fl: int,
    lc: int,
    fc: int,
    progress: Callable[[int], None] | None = None,
    max_keys: int = 1 << 22,
    chunk_tokens: int = 1 << 20,
) -> FrozenTable:
    """Count (leader, follower) windows over ``token_streams`` and keep the top LC
    leaders x FC followers (see the module doc for ties and memory). ``progress`` is
    called with the token count of each stream after it is counted."""
    for name, value in (("ll", ll), ("fl", fl), ("lc", lc), ("fc", fc)):
        if int(value) < 1:
            raise DraftwiseError(f"frozen table {name} must be >= 1, got {value!r}")
    counter = NgramCounter(ll + fl, max_keys, chunk_tokens)
    for stream in token_streams:
        arr = np.asarray(stream)
        counter.add(arr)
        if progress is not None:
            progress(int(arr.size))
    grams, counts = counter.result()
    return select_top(grams, counts, ll, lc, fc, fl)
