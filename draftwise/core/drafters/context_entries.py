"""Which context entries a drafter that attends over the context holds, and which it
must add: the bookkeeping once, for every backend (the entries' tensors live there).

Entry ``p`` (``p >= 1``) stands for the cached token ``x_p`` with the target's hidden
states ``g_{p-1}`` (the one that predicted it) and ``g_p``, and the token that followed,
``x_{p+1}`` (the root for the last one). It depends on the tokens ``x_0 .. x_{p+1}``
only, so after a rollback or a new prompt the entries whose tokens still agree stay;
the rest are dropped. New entries need the backend's hidden rows from ``rows_from`` on;
it may hold fewer (rows from before a ``reset`` or a ``load_prefix`` are gone): entries
are built for the positions it has, and attention does not care about the gap.

Example::

    >>> book = ContextEntries()
    >>> book.plan(np.array([5, 6, 7, 8]))      # nothing held: rows from position 0
    (0, 0)
    >>> book.added(np.array([5, 6, 7, 8]), first=0)   # rows g_0..g_2 -> entries 1, 2
    (1, 3)
    >>> book.plan(np.array([5, 6, 7, 9, 4]))   # x_3 changed: entry 2 (x_2 -> x_3) goes
    (1, 1)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# a backend's ``hidden_rows(start)`` (``core.cachebook.CacheBook``)
HiddenRows = Callable[[int], "tuple[int, object | None] | None"]


class ContextEntries:
    """Positions of the entries held, in order, and the tokens they were built from."""

    def __init__(self) -> None:
        self._pos = np.zeros(64, np.int64)  # (cap,) entry positions, increasing: m held
        self._m = 0
        self.tokens = np.zeros(0, np.int64)  # the context (cache + root) they came from
        self.next = 1  # the first position not yet tried

    @property
    def pos(self) -> np.ndarray:
        """(m,) the held entries' positions, increasing."""
        return self._pos[: self._m]

    @property
    def held(self) -> int:
        """How many entries are held (``pos.size``)."""
        return self._m

    @pos.setter
    def pos(self, value: np.ndarray) -> None:
        value = np.asarray(value, np.int64)
        if value.size > self._pos.size:
            self._pos = np.zeros(2 * value.size + 64, np.int64)
        self._pos[: value.size] = value
        self._m = int(value.size)

    def _append(self, a: int, b: int) -> None:
        """Hold the positions ``a .. b-1`` after the others."""
        m, n = self._m, self._m + max(b - a, 0)
        if n > self._pos.size:
            grown = np.zeros(2 * n + 64, np.int64)
            grown[:m] = self._pos[:m]
            self._pos = grown
        if n - m > 8:  # a prompt's entries: one numpy call
            self._pos[m:n] = np.arange(a, b, dtype=np.int64)
        else:  # a step's one to a few: plain Python (a numpy call costs more cold)
            for i in range(m, n):
                self._pos[i] = a + i - m
        self._m = n

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]

    def plan(self, context: np.ndarray) -> tuple[int, int]:
        """``(keep, rows_from)`` for ``context`` (the cached tokens and the root): the
        first ``keep`` held entries are still right (drop the others); hidden rows are
        needed from position ``rows_from`` on."""
        ctx = np.asarray(context, np.int64)
        n = min(ctx.size, self.tokens.size)
        diff = np.flatnonzero(ctx[:n] != self.tokens[:n])
        common = int(diff[0]) if diff.size else n  # tokens 0..common-1 agree
        # entry p needs x_0..x_{p+1}: it stays when p + 1 < common
        keep = int(np.searchsorted(self.pos, common - 1))
        self.pos = self.pos[:keep]
        self.next = max(1, min(self.next, common - 1))
        self.tokens = ctx[: min(common, ctx.size)]
        return keep, self.next - 1

    def added(self, context: np.ndarray, first: int) -> tuple[int, int]:
        """The backend gave hidden rows of positions ``first .. len(context) - 2``: the
        new entries are positions ``a .. b-1`` (``(a, b)``; ``a == b``: none), recorded
        as held. Entry ``p`` uses rows ``p - 1 - first`` and ``p - first``."""
        ctx = np.asarray(context, np.int64)
        b = ctx.size - 1  # entries up to the one whose next token is the root
        a = min(max(self.next, first + 1), b)
        self._append(a, b)
        self.tokens = ctx.copy()
        self.next = b
        return a, b

    def update(
        self, context: np.ndarray, hidden_rows: HiddenRows
    ) -> tuple[int, int, int, int, object | None]:
        """``plan``, the backend's rows, ``added`` in one: ``(keep, first, a, b, rows)``,
        the held entries still right, then the new ones ``a .. b-1`` built from ``rows``
        (positions ``first ..``; None, or ``a == b``: no new entry)."""
        keep, rows_from = self.plan(context)
        got = hidden_rows(rows_from)
        first, rows = (context.size - 1, None) if got is None else got
        a, b = self.added(context, first)
        return keep, first, a, b, rows

    def extend(
        self, context: np.ndarray, hidden_rows: HiddenRows
    ) -> tuple[int, int, int, int, object | None]:
        """``update`` for a ``context`` that extends the last one (the caller checked;
        it is kept, not copied, so it must not change): every held entry stays, and
        the new ones are found in a few Python operations (the usual decoding step).

        Example::

            >>> book = ContextEntries()
            >>> book.update(np.array([5, 6, 7, 8]), lambda s: (s, "rows"))
            (0, 0, 1, 3, 'rows')
            >>> book.extend(np.array([5, 6, 7, 8, 9, 4]), lambda s: (s, "rows"))
            (2, 2, 3, 5, 'rows')
            >>> book.pos.tolist()
            [1, 2, 3, 4]
        """
        if context.size <= self.tokens.size or self.tokens.size == 0:
            return self.update(context, hidden_rows)
        # ``plan`` of an extension: all held (each entry's tokens are still there), and
        # ``next`` stays (it is at most the last context's size - 1)
        self.next = max(1, min(self.next, self.tokens.size - 1))
        got = hidden_rows(self.next - 1)
        b = context.size - 1
        first, rows = (b, None) if got is None else got
        a = min(max(self.next, first + 1), b)
        keep = self._m
        self._append(a, b)
        self.tokens = context
        self.next = b
        return keep, first, a, b, rows
