"""Bookkeeping every backend's KV cache shares: its length, trimming, and the checks
that turn a user's mistake into a clear error before any tensor work.

A backend inherits ``CacheBook`` and only does the tensor work: it reads ``_len`` (the
cached tokens), sets ``_pending`` (rows written by the last verify, 0 once committed),
and calls ``_check_room``/``_check_ids`` before a forward.

Example::

    >>> class Toy(CacheBook):
    ...     def __init__(self):
    ...         super().__init__(context_limit=8, vocab_size=100)
    >>> t = Toy(); t._len = 5
    >>> t.trim(3); t.cache_len
    3
    >>> t._check_room("prefill", 6)
    Traceback (most recent call last):
    ...
    draftwise.errors.DraftwiseError: prefill of 6 tokens after 3 cached exceeds the context limit 8
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from draftwise.errors import DraftwiseError


class CacheBook:
    """Length and checks of a single-sequence KV cache of ``context_limit`` slots."""

    # The cache length at which the backend's last-layer hidden state of the last cached
    # token is valid (-1: none). Backends store the tensor; the bookkeeping lives here, so
    # reset and trim invalidate it for every backend and subclass alike.
    _hidden_len = -1
    # Residual rows of cached positions for a drafter that attends over the context
    # (``keep_hidden_rows``): (start, rows) segments, oldest first, rows (t, C) a device
    # array of positions start..start+t-1. None: not recorded (no drafter asked).
    _rows: list[tuple[int, object]] | None = None
    # The backend's tensor work for ``hidden_rows``: kept residual rows, in order -> (n, C)
    # after the final norm (declared here, defined by each backend).
    _join_rows: Callable[[list[object]], object]

    def __init__(self, context_limit: int, vocab_size: int) -> None:
        self.context_limit = context_limit
        self.vocab_size = vocab_size
        self._len = 0  # tokens held by the cache
        self._pending = 0  # rows written by the last verify, 0 once committed

    @property
    def cache_len(self) -> int:
        return self._len

    @property
    def hidden_len(self) -> int:
        """The cache length at which ``last_hidden`` is valid (-1: not available)."""
        return self._hidden_len

    def _check_hidden(self) -> None:
        if self._hidden_len < 0 or self._hidden_len != self._len:
            raise DraftwiseError(
                f"no hidden state for cache length {self._len} (held for {self._hidden_len})"
            )

    def keep_hidden_rows(self) -> None:
        """From now on, keep every cached position's last-layer residual row (see
        ``hidden_rows``): a drafter attending over the context asks for this (when it is
        built, never during a generation). A cache that already holds positions without
        their rows is emptied, so the next generation prefills them again with rows: a
        drafter built after a plain generation of the same prompt would otherwise never
        see that prompt (measured: MAT 1.06 instead of 2.19 on a Spec-Bench translation
        turn)."""
        if self._rows is None:
            self._rows = []
            if self._len:
                self.trim(0)

    def _record_rows(self, start: int, rows: object) -> None:
        """The residual rows (t, C) of positions ``start..start+t-1`` (backends call this
        on prefill and commit)."""
        if self._rows is not None:
            self._rows.append((start, rows))

    def _rows_since(self, start: int) -> tuple[int, list[object]] | None:
        """``(first, pieces)``: the kept rows of cached positions ``first..cache_len-1``
        in order, ``first >= start`` (positions from before ``keep_hidden_rows``, a
        ``load_prefix`` or a ``reset`` are not there); None when rows are not kept."""
        if self._rows is None:
            return None
        pieces: list[object] = []
        first = self._len
        for s, rows in reversed(self._rows):
            n = rows.shape[0]  # type: ignore[attr-defined]
            if s + n <= start or s + n != first:
                break  # all before ``start``, or a gap
            cut = max(start - s, 0)
            pieces.append(rows[cut:] if cut else rows)  # type: ignore[index]
            first = s + cut
        return first, pieces[::-1]

    def residual_rows(self, start: int) -> tuple[int, list[object]] | None:
        """``(first, pieces)``: the kept residual rows (before the final norm) of cached
        positions ``first..cache_len-1``, in order, as the backend's arrays (see
        ``hidden_rows``); for a drafter that applies the final norm itself."""
        return self._rows_since(start)

    def hidden_rows(self, start: int) -> tuple[int, object | None] | None:
        """``(first, rows)``: the last-layer hidden states (after the final norm) of cached
        positions ``first..cache_len-1`` as a device array (n, C), ``first >= start`` the
        oldest kept (rows None when none are); None when rows are not kept
        (``keep_hidden_rows``). No forward, no sync: the backend's ``_join_rows``."""
        got = self._rows_since(start)
        if got is None:
            return None
        first, pieces = got
        return first, (self._join_rows(pieces) if pieces else None)

    def _cut_rows(self, n: int) -> None:
        """Forget kept rows of positions ``>= n``."""
        if self._rows:
            kept = []
            for s, rows in self._rows:
                if s < n:
                    m = min(rows.shape[0], n - s)  # type: ignore[attr-defined]
                    kept.append((s, rows if m == rows.shape[0] else rows[:m]))  # type: ignore
            self._rows = kept

    def reset(self) -> None:
        # Nothing to clear: slots past cache_len are never read before being rewritten.
        self._len = 0
        self._pending = 0
        self._hidden_len = -1
        if self._rows is not None:
            self._rows = []

    def trim(self, n: int) -> None:
        if not 0 <= n <= self._len:
            raise DraftwiseError(f"cannot trim the cache to {n} tokens: it holds {self._len}")
        if n != self._len:
            self._hidden_len = -1
            self._cut_rows(n)
        self._len = n
        self._pending = 0

    def _check_room(self, what: str, n: int) -> None:
        if self._len + n > self.context_limit:
            raise DraftwiseError(
                f"{what} of {n} tokens after {self._len} cached exceeds the context "
                f"limit {self.context_limit}"
            )

    def _check_ids(self, ids: np.ndarray) -> None:
        # Out-of-range ids are a device-side assert on CUDA and a garbage read in MLX.
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = ids[(ids < 0) | (ids >= self.vocab_size)][0]
            raise DraftwiseError(f"token id {bad} outside the vocabulary (size {self.vocab_size})")
