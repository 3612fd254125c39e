"""A context drafter's bookkeeping for each proposal, in one place: the draft vocabulary
(``ContextVocab``), the entries it attends over (``ContextEntries``) and each entry's
next-token column, for the context (the cached tokens and the root) of every proposal.

Why one object: a decoding step's context is the last one plus the accepted tokens and a
new root, and every backend's ReDrafter step needs all three updated for it. Run right
after the target's forward, which has streamed the model's weights through the caches,
each numpy call costs 20-90 us instead of 1-7 (AMD EPYC Zen 3, measured): a step that
compared the whole context twice, gathered every entry's column and copied the context
twice spent about 0.3 ms of a 1.0-1.5 ms ReDrafter proposal there. ``update`` now checks
the whole context once (its bytes against the last one's) and, when it extends the last
context, touches the new tokens alone in plain Python; any other context (a rollback, a
new text) takes the general path of ``ContextVocab.update`` and ``ContextEntries.update``.
Both paths give the same ids, entries and columns (``tests/core/test_context_book.py``).

Example::

    >>> book = ContextBook(np.array([5, 7]), vocab_size=10, extend=True, entries=True)
    >>> book.update(np.array([5, 9, 7]), lambda s: (s, "rows"))   # (keep, first, a, b, rows)
    (0, 0, 1, 2, 'rows')
    >>> book.vocab_ids.tolist(), book.pos.tolist(), book.cols.tolist()
    ([5, 7, 9], [1], [1])
    >>> book.update(np.array([5, 9, 7, 3, 9]), lambda s: (s, "rows"))
    (1, 1, 2, 4, 'rows')
    >>> book.vocab_ids.tolist(), book.pos.tolist(), book.cols.tolist()
    ([5, 7, 9, 3], [1, 2, 3], [1, 3, 2])
    >>> book.fresh   # columns from here on are new this update (the rest were checked)
    1
"""

from __future__ import annotations

import numpy as np

from draftwise.core.drafters.context_entries import ContextEntries, HiddenRows
from draftwise.core.drafters.context_vocab import ContextVocab


class ContextBook:
    """The vocabulary (``extend``: the context's other ids join the fixed ``base``), the
    entries (``entries``: a network that attends over the context) and their columns."""

    def __init__(self, base: np.ndarray, vocab_size: int, extend: bool, entries: bool) -> None:
        self.vocab = ContextVocab(base, vocab_size)
        self.entries = ContextEntries()
        self.extend, self.use_entries = extend, entries
        self._last = b""  # the last context's int64 bytes
        self._cols = np.zeros(64, np.int64)  # (cap,) each held entry's next-token column
        self.fresh = 0  # columns [fresh, m) were set by the last update

    @property
    def vocab_ids(self) -> np.ndarray:
        """(K + E,) the target id of every draft column (``ContextVocab.ids``)."""
        return self.vocab.ids

    @property
    def pos(self) -> np.ndarray:
        """(m,) the held entries' positions."""
        return self.entries.pos

    @property
    def cols(self) -> np.ndarray:
        """(m,) the column of each held entry's next token (-1: none)."""
        return self._cols[: self.entries.held]

    def update(
        self, context: np.ndarray, hidden_rows: HiddenRows
    ) -> tuple[int, int, int, int, object | None]:
        """Bring everything to ``context``; returns the entries' ``(keep, first, a, b,
        rows)`` (``ContextEntries.update``; ``(0, n - 1, n - 1, n - 1, None)`` without
        entries). Raises ``ValueError`` for an id outside the vocabulary."""
        ctx = np.asarray(context, np.int64)
        raw = ctx.tobytes()
        n = len(self._last) // 8
        if n and len(raw) > len(self._last) and raw.startswith(self._last):
            # the usual step: the last context, then a few tokens; one copy kept
            seen = np.frombuffer(raw, np.int64)  # read-only: nobody changes it
            tail = seen[n:].tolist()
            if self.extend:
                self.vocab.extend(seen, tail)
            else:
                v = self.vocab.vocab_size
                for t in tail:
                    if not 0 <= t < v:
                        raise ValueError(f"context id {t} outside the vocabulary 0..{v - 1}")
            got = self._entries(seen, hidden_rows, fast=True)
        else:
            if self.extend:
                self.vocab.update(ctx)
            else:
                self.vocab.check_ids(ctx)
            got = self._entries(ctx, hidden_rows, fast=False)
        self._last = raw
        return got

    def _entries(
        self, ctx: np.ndarray, hidden_rows: HiddenRows, fast: bool
    ) -> tuple[int, int, int, int, object | None]:
        b = ctx.size - 1
        if not self.use_entries:
            self.fresh = 0
            return 0, b, b, b, None
        book = self.entries
        got = (book.extend if fast else book.update)(ctx, hidden_rows)
        keep, _, a, b, _ = got
        m = book.held
        if m > self._cols.size:
            grown = np.zeros(2 * m + 64, np.int64)
            grown[:keep] = self._cols[:keep]
            self._cols = grown
        if fast and keep == m - max(b - a, 0):  # the held columns stand; add the new ones
            col = self.vocab._col
            for i, t in enumerate(ctx[a + 1 : b + 1].tolist()):
                self._cols[keep + i] = col.item(t)
            self.fresh = keep
        else:  # every column again (another context may have moved the extra ids)
            self._cols[:m] = self.vocab.columns(ctx[book.pos + 1])
            self.fresh = 0
        return got
