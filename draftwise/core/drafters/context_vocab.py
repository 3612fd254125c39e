"""A draft vocabulary that grows with the context: the network's fixed ids, then every
id of the context outside them.

A ReDrafter head scores a fixed draft vocabulary (the shipped one: the 4,096 most frequent
ids of the model's own outputs, 92.9% of its training tokens), so a token outside it is
never drafted. On Spec-Bench 14% of the greedy output tokens are outside it (35% in
translation, 25% in rag and summarization: names, numbers, words of the source text),
and many of them are in the prompt. ``ContextVocab`` gives each proposal the fixed ids
plus the context's other ids, in order of first appearance (so a growing context keeps
their columns); the backend scores an extra id ``i`` as ``z . E[i] + extra_bias`` (the
target's own embedding row, as the fixed columns, with one bias for all) and its copy
distribution may point at it. The algorithm is here once; backends gather the rows.

Example::

    >>> cv = ContextVocab(np.array([5, 7]), vocab_size=10)
    >>> cv.update(np.array([5, 9, 7, 3, 9])).tolist()   # 9 and 3 are new: columns 2, 3
    [5, 7, 9, 3]
    >>> cv.columns(np.array([9, 5, 4])).tolist()        # 4 is in no column
    [2, 0, -1]
"""

from __future__ import annotations

import numpy as np

# ``extra_bias``: the bias of the extra ids is this quantile of the fixed ids' trained
# biases: an extra id is rarer than every fixed one, so a little below the rarest of them
# (the shipped network: -0.25, against a mean of -0.13 over its 512 rarest fixed ids and
# -0.05 over all). Not tuned; the head's logit comes mostly from the embedding row.
EXTRA_BIAS_QUANTILE = 0.1


def extra_bias(bias: np.ndarray, quantile: float = EXTRA_BIAS_QUANTILE) -> float:
    """The one bias of every extra id: ``quantile`` of the fixed ids' trained ``bias``.

    Example::

        >>> extra_bias(np.arange(11.0), 0.1)
        1.0
    """
    return float(np.quantile(np.asarray(bias, np.float64), quantile))


class ContextVocab:
    """The fixed draft ids (``base``, (K,)) and the context's extra ids (``extra``, (E,))."""

    def __init__(self, base: np.ndarray, vocab_size: int) -> None:
        self.base = np.asarray(base, np.int64)  # (K,)
        self.vocab_size = vocab_size
        self._col = np.full(vocab_size, -1, np.int64)  # (V,) id -> column
        self._col[self.base] = np.arange(self.base.size)
        # (K + cap,) the fixed ids, then room for the extra ones: ``extend`` appends in
        # place; ``update`` writes a new buffer (arrays handed out before stay as they were)
        self._buf = self.base
        self._ids = self.base  # (K + E,) a view of _buf
        self.extra = self.base[:0]  # (E,) a view of _buf
        self._seen = np.zeros(0, np.int64)  # the context the extra ids were taken from

    @property
    def ids(self) -> np.ndarray:
        """(K + E,) target id of every column."""
        return self._ids

    def check_ids(self, ids: np.ndarray) -> None:
        """Raise ``ValueError`` unless every id is in ``0 .. vocab_size - 1``."""
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise ValueError(f"context ids outside the vocabulary 0..{self.vocab_size - 1}")

    def _set_extra(self, extra: np.ndarray, cap: int) -> None:
        """A new buffer holding the fixed ids, ``extra`` and room for ``cap`` in all."""
        k, e = self.base.size, extra.size
        self._buf = np.empty(k + max(cap, e), np.int64)
        self._buf[:k] = self.base
        self._buf[k : k + e] = extra
        self._ids, self.extra = self._buf[: k + e], self._buf[k : k + e]

    def update(self, context: np.ndarray) -> np.ndarray:
        """Set the extra ids from ``context`` (the cached tokens and the root); returns
        ``ids``. The old extra columns go; the new ones are the context's ids outside
        ``base``, in order of first appearance. A context that extends the last one only
        appends the new tokens' ids (the same columns as from scratch). Raises
        ``ValueError`` for an id outside ``0 .. vocab_size - 1``."""
        ctx = np.asarray(context, np.int64)
        self.check_ids(ctx)
        n = self._seen.size
        if n and ctx.size >= n and np.array_equal(ctx[:n], self._seen):
            tail = ctx[n:]
            base = self.extra
        else:
            self._col[self.extra] = -1
            tail, base = ctx, np.zeros(0, np.int64)
        out = tail[self._col[tail] < 0]  # (n,) outside the fixed ids and the held extra
        if out.size:
            _, first = np.unique(out, return_index=True)
            new = out[np.sort(first)]
            self._col[new] = self.base.size + base.size + np.arange(new.size)
            extra = np.concatenate([base, new])  # (E,)
            self._set_extra(extra, 2 * extra.size + 64)
        elif base.size != self.extra.size:
            self._set_extra(base, 2 * base.size + 64)
        self._seen = ctx.copy()
        return self._ids

    def extend(self, context: np.ndarray, tail: list[int]) -> np.ndarray:
        """``update`` for a ``context`` that is the last one followed by ``tail`` (the
        caller checked; ``context`` is kept, not copied, so it must not change): the
        usual decoding step, a few Python operations on the new ids alone. Returns ``ids``.

        Example::

            >>> cv = ContextVocab(np.array([5, 7]), vocab_size=10)
            >>> cv.update(np.array([5, 9])).tolist()
            [5, 7, 9]
            >>> cv.extend(np.array([5, 9, 3, 7, 3]), [3, 7, 3]).tolist()
            [5, 7, 9, 3]
        """
        col, v = self._col, self.vocab_size
        new: list[int] = []
        for t in tail:
            if not 0 <= t < v:
                raise ValueError(f"context id {t} outside the vocabulary 0..{v - 1}")
            if col.item(t) < 0 and t not in new:
                new.append(t)
        if new:
            k, e = self.base.size, self.extra.size
            if k + e + len(new) > self._buf.size:
                self._set_extra(self.extra, 2 * (e + len(new)) + 64)
            for i, t in enumerate(new):
                col[t] = k + e + i
                self._buf[k + e + i] = t
            self._ids, self.extra = self._buf[: k + e + len(new)], self._buf[k : k + e + len(new)]
        self._seen = context
        return self._ids

    def columns(self, ids: np.ndarray) -> np.ndarray:
        """(n,) column of each target id now; -1 where it has none."""
        return self._col[np.asarray(ids, np.int64)]
