"""Cacheback's frozen table (§3.3): frequent leader -> followers from a corpus, read-only.

Built offline (``build_frozen_table``, the ``draftwise build-table`` app), it answers the
same ``query(leader)`` as the dynamic ``LRUTable`` but never changes: no insertions, no
recency. It is three flat arrays:

- ``leaders`` (L, LL) int32: most frequent leader first;
- ``offsets`` (L+1,) int64: leader ``i`` owns ``followers[offsets[i]:offsets[i+1]]``;
- ``followers`` (F, FL) int32: per leader, most frequent first.

Lookup hashes the leader to 64 bits (splitmix64 over its tokens), binary-searches the
sorted hashes and compares the stored leader, so it is exact and O(log L).

Example::

    >>> fol = np.array([[8, 9], [1, 1], [2, 3]])
    >>> t = FrozenTable(np.array([[7], [1]]), np.array([0, 2, 3]), fol)
    >>> t.query((7,)), t.query((1,)), t.query((5,))
    ([(8, 9), (1, 1)], [(2, 3)], [])
    >>> t.query((7,), limit=1)
    [(8, 9)]
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from draftwise.core.drafters.table_io import check, read_table, write_table
from draftwise.errors import DraftwiseError

Gram = tuple[int, ...]
_MASK = (1 << 64) - 1
_SEED = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB

#: Query results kept for reuse (the table never changes), bounded in followers held;
#: ~150 bytes of Python objects per follower, so at most ~10 MiB.
MEMO_FOLLOWERS = 1 << 16

#: The table shipped for the embedded default model (SmolLM2-135M-Instruct).
DEFAULT_TABLE = Path(__file__).resolve().parents[2] / "data" / "cacheback-smollm2-135m.npz"


def hash_rows(rows: np.ndarray) -> np.ndarray:
    """(N,) uint64 splitmix64 hashes of the rows of ``rows`` (N, K); equals ``hash_gram``.

    Example::

        >>> int(hash_rows(np.array([[1, 2]]))[0]) == hash_gram((1, 2))
        True
    """
    rows = np.asarray(rows)
    h = np.full(rows.shape[0], _SEED, np.uint64)
    with np.errstate(over="ignore"):
        for col in rows.T:
            x = h ^ col.astype(np.int64).astype(np.uint64)
            x ^= x >> np.uint64(30)
            x *= np.uint64(_M1)
            x ^= x >> np.uint64(27)
            x *= np.uint64(_M2)
            h = x ^ (x >> np.uint64(31))
    return h


def hash_gram(gram: Gram) -> int:
    """The 64-bit hash of one token tuple, in plain Python (see ``hash_rows``)."""
    h = _SEED
    for t in gram:
        x = h ^ (t & _MASK)
        x ^= x >> 30
        x = (x * _M1) & _MASK
        x ^= x >> 27
        x = (x * _M2) & _MASK
        h = x ^ (x >> 31)
    return h


class FrozenTable:
    """Read-only leader -> followers table stored as flat numpy arrays (see module doc)."""

    def __init__(
        self, leaders: np.ndarray, offsets: np.ndarray, followers: np.ndarray, fc: int | None = None
    ) -> None:
        leaders = np.ascontiguousarray(leaders, np.int32)
        offsets = np.ascontiguousarray(offsets, np.int64)
        followers = np.ascontiguousarray(followers, np.int32)
        if (
            leaders.ndim != 2
            or followers.ndim != 2
            or leaders.shape[1] < 1
            or followers.shape[1] < 1
        ):
            raise DraftwiseError(
                f"frozen table needs (L, LL) leaders and (F, FL) followers, got shapes "
                f"{leaders.shape} and {followers.shape}"
            )
        n = leaders.shape[0]
        if (
            offsets.shape != (n + 1,)
            or offsets[0] != 0
            or offsets[-1] != followers.shape[0]
            or np.any(np.diff(offsets) < 0)
        ):
            raise DraftwiseError(
                f"frozen table offsets do not fit {n} leaders and {followers.shape[0]} followers"
            )
        self.leaders, self.offsets, self.followers = leaders, offsets, followers
        self.ll, self.fl = int(leaders.shape[1]), int(followers.shape[1])
        self.lc = n
        widest = int(np.diff(offsets).max()) if n else 0
        self.fc = int(fc) if fc is not None else widest
        if widest > self.fc:
            raise DraftwiseError(f"frozen table has a leader with {widest} followers > fc={fc}")
        keys = hash_rows(leaders)
        self._order = np.argsort(keys, kind="stable")
        self._keys = keys[self._order]
        self._memo: dict[Gram, list[Gram]] = {}
        self._memo_size = 0

    def __len__(self) -> int:
        return self.lc

    def _find(self, leader: Gram) -> int:
        """Row of ``leader`` in ``leaders``, or -1."""
        h = hash_gram(leader)
        i = int(self._keys.searchsorted(np.uint64(h)))  # a bare int > 2^63 is 30x slower
        keys, n = self._keys, self._keys.size
        while i < n and int(keys[i]) == h:
            row = int(self._order[i])
            if tuple(self.leaders[row].tolist()) == tuple(leader):
                return row
            i += 1
        return -1

    def query(self, leader: Gram, limit: int | None = None) -> list[Gram]:
        """Followers of ``leader``, most frequent first (at most ``limit``); [] if absent."""
        found = self._memo.get(leader)
        if found is None:
            found = self._lookup(leader)
            if self._memo_size + len(found) > MEMO_FOLLOWERS:
                self._memo.clear()
                self._memo_size = 0
            self._memo[leader] = found
            self._memo_size += len(found) + 1
        return found[: max(limit, 0)] if limit is not None else list(found)

    def _lookup(self, leader: Gram) -> list[Gram]:
        row = self._find(leader) if len(leader) == self.ll else -1
        if row < 0:
            return []
        lo, hi = self.offsets[row : row + 2].tolist()
        return list(map(tuple, self.followers[lo:hi].tolist()))

    def items(self) -> Iterator[tuple[Gram, list[Gram]]]:
        """(leader, followers most frequent first), most frequent leader first."""
        for row, leader in enumerate(self.leaders.tolist()):
            lo, hi = self.offsets[row], self.offsets[row + 1]
            yield tuple(leader), list(map(tuple, self.followers[lo:hi].tolist()))

    def token_count(self) -> int:
        return int(self.leaders.size + self.followers.size)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays held, lookup index included."""
        arrays = (self.leaders, self.offsets, self.followers, self._keys, self._order)
        return int(sum(a.nbytes for a in arrays))

    # ----- persistence -------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str], tokenizer_id: str) -> None:
        """Write the table to ``path`` as a compressed .npz (atomic, no pickle)."""
        meta = {"ll": self.ll, "fl": self.fl, "lc": self.lc, "fc": self.fc}
        arrays = {"leaders": self.leaders, "offsets": self.offsets, "followers": self.followers}
        write_table(path, "frozen", tokenizer_id, meta, arrays)

    @classmethod
    def load(cls, path: str | os.PathLike[str], tokenizer_id: str) -> FrozenTable:
        """Read a table saved by :meth:`save`; DraftwiseError naming ``path`` if it is
        corrupt, truncated, or was built for another tokenizer."""
        meta, a = read_table(
            path,
            "frozen",
            tokenizer_id,
            ["ll", "fl", "lc", "fc"],
            ["leaders", "offsets", "followers"],
        )
        leaders, offsets, followers = a["leaders"], a["offsets"], a["followers"]
        check(leaders.shape == (meta["lc"], meta["ll"]), path, "leaders shape")
        check(followers.ndim == 2 and followers.shape[1] == meta["fl"], path, "followers shape")
        try:
            return cls(leaders, offsets, followers, fc=meta["fc"])
        except DraftwiseError as exc:
            raise DraftwiseError(f"table file '{os.fspath(path)}' is inconsistent: {exc}") from None
