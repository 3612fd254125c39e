"""Suffix arrays in numpy, and the read-only index the ``ssd`` drafter searches.

``suffix_array(seq)`` sorts the suffixes of ``seq`` by prefix doubling: a first sort by
the first two tokens, then after the round with step ``k`` every suffix carries the rank
of its first ``2k`` tokens, obtained by sorting the pairs (rank of the first ``k``, rank
of the next ``k``) as one int64 key. Suffixes whose rank is already unique never take
part again, so a round only sorts the suffixes that still tie (the Larsson–Sadakane
refinement); random text settles in 1-2 rounds, repeated text in about log2 of its
longest repeat.

Order: a suffix that runs out sorts first (``[1] < [1, 0]``), and negative tokens are
*separators*: each one compares as distinct, below every token and above the end, so no
common prefix ever runs across a separator.

Worked example ("banana" as tokens b=1, a=0, n=2)::

    >>> suffix_array(np.array([1, 0, 2, 0, 2, 0])).tolist()   # a, ana, anana, banana, ...
    [5, 3, 1, 0, 4, 2]

``SuffixIndex`` holds one snapshot of the token store *reversed*, with the suffix array
of that reversed text. A suffix of the context then reads as a *prefix* of a reversed
suffix, so the matches of the last ``q + 1`` tokens are a sub-range of the matches of
the last ``q``: one narrowing pass finds the longest match and every shorter one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# above this many candidates a narrowing step bisects in Python instead of gathering
_GATHER_MAX = 512


def suffix_array(seq: np.ndarray, depth: int | None = None) -> np.ndarray:
    """(n,) int64 start positions of the suffixes of ``seq`` (n,) in sorted order.

    With ``depth``, suffixes are only ordered by their first ``depth`` tokens (ties
    beyond are left in any order): enough for searches of at most ``depth`` tokens, and
    repetitive text then needs no more than log2(depth) rounds."""
    s = np.asarray(seq, dtype=np.int64).reshape(-1)
    if s.size and int(s.max()) + s.size >= 1 << 31:  # huge ids: dense ranks keep pairs in int64
        dense = np.unique(s[s >= 0], return_inverse=True)[1].reshape(-1)
        s = s.copy()
        s[s >= 0] = dense
    return _sort_suffixes(s, depth)[0].astype(np.int64)


def _sort_suffixes(s: np.ndarray, depth: int | None) -> tuple[np.ndarray, np.ndarray, int]:
    """(sa, keys, top) for ``s`` (n,) int64 with ``max(s) + n < 2**31``: ``sa`` (int32 when
    n allows), and ``keys[i]`` the first two tokens of suffix ``sa[i]`` as one sorted key:
    ``(a + n) * top + (b + n + 1)`` for tokens ``a, b`` (``b`` past the end counts as
    ``-n - 1``); a separator at ``a``'s place gives a distinct key below ``n * top``."""
    n = s.size
    if n == 0:
        return np.zeros(0, np.int32), np.zeros(0, np.int64), 2
    # int32 positions and ranks halve the memory traffic of the random gathers
    idx_t = np.int32 if n < (1 << 31) - 1 else np.int64
    # one key per token: separators their position (distinct, below every token), a
    # token t is n + t; the first sort uses two tokens at once, which saves a round
    one = np.where(s < 0, np.arange(n, dtype=np.int64), s + n)
    top = int(one.max()) + 2
    key = one * top
    key[:-1] += one[1:] + 1  # 0 = past the end
    sa = np.argsort(key).astype(idx_t)  # (n,) slot -> position
    ks = key[sa]  # later rounds only reorder within equal keys: stays aligned with sa
    head = np.ones(n, dtype=bool)  # head[slot]: the slot starts a group of equal prefixes
    head[1:] = ks[1:] != ks[:-1]
    del one, key
    slots = np.arange(n, dtype=idx_t)
    rank = np.full(n + 1, -1, idx_t)  # rank[pos]: slot where its group starts; rank[n] = -1
    rank[sa] = np.maximum.accumulate(np.where(head, slots, 0))
    k = 2
    while True:
        single = head.copy()
        single[:-1] &= head[1:]  # a head followed by a head is a group of one: settled
        active = slots[~single]  # (a,) slots still tied, ascending
        if active.size == 0 or (depth is not None and k >= depth):
            return sa, ks, top
        pos = sa[active]
        # 0 = ran out, below every real rank
        second = rank[np.minimum(pos + k, n)].astype(np.int64) + 1
        # the group's start slot is the major key, so each group keeps its own slots
        pair = rank[pos].astype(np.int64) * (n + 1) + second
        order = np.argsort(pair)
        pos = pos[order]
        sa[active] = pos
        pair = pair[order]
        new_head = np.ones(active.size, dtype=bool)
        new_head[1:] = pair[1:] != pair[:-1]
        head[active] = new_head
        # ranks change only after every pair of this round was formed from the old ones
        rank[pos] = np.maximum.accumulate(np.where(new_head, active, 0))
        k *= 2


@dataclass(frozen=True)
class SuffixIndex:
    """A completed, immutable index over the store's tokens at logical ``[start, end)``.

    ``rev`` is the snapshot reversed and padded with ``-1``; ``rev[n - 1 - (p - start)]``
    is the token at logical position ``p``. ``sa`` is the suffix array of ``rev[:n]``
    (ordered by the first ``pad - 1`` tokens) and ``head`` the first two tokens of each
    suffix as one sorted int64 key, so depths 0 and 1 are ``searchsorted`` calls.

    Example: the store holds ``[-1, 5, 6, 7, 5, 6]`` from logical 0; the last two
    context tokens ``(5, 6)`` read reversed as ``(6, 5)``::

        >>> ix = SuffixIndex.build(np.array([-1, 5, 6, 7, 5, 6]), start=0, epoch=0)
        >>> ranges = ix.narrow(np.array([6, 5]))
        >>> sorted(ix.match_ends(*ranges[-1]).tolist())      # (5, 6) ends at 2 and 5
        [2, 5]
    """

    rev: np.ndarray  # (n + pad,) int32
    sa: np.ndarray  # (n,) int32
    head: np.ndarray  # (n,) int64 first two tokens of each suffix as one sorted key
    top: int  # the key of tokens (a, b) is (a + n) * top + b + n + 1
    start: int
    end: int
    epoch: int  # the store's epoch when the snapshot was taken (reset/load bump it)
    newest_slot: int  # slot of the suffix that starts at the newest token, -1 if empty

    @classmethod
    def build(cls, tokens: np.ndarray, start: int, epoch: int, pad: int = 64) -> SuffixIndex:
        """Index ``tokens`` (n,), the store's contents from logical position ``start``."""
        rev = np.asarray(tokens, dtype=np.int32)[::-1]
        n = rev.size
        # searches never compare past pad - 1 tokens, so sorting deeper is wasted work
        sa, head, top = _sort_suffixes(rev.astype(np.int64), depth=max(pad - 1, 1))
        padded = np.concatenate([rev, np.full(max(pad, 2), -1, np.int32)])
        newest = int(np.flatnonzero(sa == 0)[0]) if n else -1
        return cls(
            padded, sa.astype(np.int32), head, top, int(start), int(start) + n, epoch, newest
        )

    @classmethod
    def empty(cls, start: int = 0, epoch: int = 0) -> SuffixIndex:
        return cls.build(np.zeros(0, np.int32), start, epoch)

    @property
    def size(self) -> int:
        return self.end - self.start

    def narrow(self, pattern: np.ndarray) -> list[tuple[int, int]]:
        """Slot ranges ``[lo, hi)`` of the suffixes starting with ``pattern[:d + 1]`` for
        d = 0, 1, ... while some suffix matches; ``pattern`` (q,) is the context's tail
        reversed. The list's length is the longest match (an empty list: no match)."""
        if self.size == 0:
            return []
        sa, rev = self.sa, self.rev
        pad = rev.size - self.size
        # int32 keys: a wider key would make searchsorted cast (copy) the whole array
        pat = np.asarray(pattern).astype(np.int32)
        n, top = self.size, self.top
        if pat.size == 0 or not 0 <= int(pat[0]) < top - n - 1:  # a token never seen
            return []
        out: list[tuple[int, int]] = []
        # depths 0 and 1 by searching the two-token keys
        key = np.int64((int(pat[0]) + n) * top)
        lo, hi = int(self.head.searchsorted(key)), int(self.head.searchsorted(key + top))
        if lo >= hi:
            return out
        out.append((lo, hi))
        if pat.size > 1:
            t1 = int(pat[1])
            if not 0 <= t1 < top - n - 1:
                return out
            key += t1 + n + 1
            lo, hi = int(self.head.searchsorted(key)), int(self.head.searchsorted(key, "right"))
        depth = min(pat.size, pad)
        for d in range(1, depth):
            if d > 1:
                if hi - lo <= _GATHER_MAX:
                    return out + _narrow_small(rev, sa, pat[d:depth], d, lo, hi)
                lo, hi = _bisect(rev, sa, d, int(pat[d]), lo, hi)
            if lo >= hi:
                break
            out.append((lo, hi))
        return out

    def match_ends(self, lo: int, hi: int) -> np.ndarray:
        """Logical positions of the last matched token for the slots ``[lo, hi)``."""
        return self.end - 1 - self.sa[lo:hi].astype(np.int64)

    def tokens_at(self, positions: np.ndarray) -> np.ndarray:
        """Tokens at logical ``positions`` inside ``[start, end)`` (any shape)."""
        return self.rev[self.end - 1 - positions]


def _narrow_small(
    rev: np.ndarray, sa: np.ndarray, rest: np.ndarray, d: int, lo: int, hi: int
) -> list[tuple[int, int]]:
    """The remaining ranges at once for a small range ``[lo, hi)`` whose suffixes share
    ``d`` tokens: each suffix's match length against ``rest`` (r,), then for every depth
    the block of suffixes matching that far (contiguous, as the range is sorted)."""
    r = rest.size
    cols = rev[sa[lo:hi, None] + np.arange(d, d + r)]  # (m, r) the next r tokens
    eq = cols == rest
    lens = np.where(eq.all(axis=1), r, eq.argmin(axis=1))  # (m,)
    reach = lens[None, :] > np.arange(r)[:, None]  # (r, m): matches past depth d + j
    found = reach.any(axis=1)
    first = reach.argmax(axis=1)
    last = reach.shape[1] - reach[:, ::-1].argmax(axis=1)
    n = int(found.sum())  # found is True for a prefix of depths only (nested blocks)
    return list(zip((first[:n] + lo).tolist(), (last[:n] + lo).tolist(), strict=True))


def _bisect(rev: np.ndarray, sa: np.ndarray, d: int, t: int, lo: int, hi: int) -> tuple[int, int]:
    """The sub-range of slots ``[lo, hi)`` whose token at depth ``d`` equals ``t``."""
    a, b = lo, hi
    while a < b:  # first slot with token >= t
        mid = (a + b) >> 1
        if rev[sa[mid] + d] < t:
            a = mid + 1
        else:
            b = mid
    first = a
    b = hi
    while a < b:  # first slot with token > t
        mid = (a + b) >> 1
        if rev[sa[mid] + d] <= t:
            a = mid + 1
        else:
            b = mid
    return first, a
