"""Cacheback's dynamic table (§3.1): leader -> followers, both evicted least recently used.

The table maps a *leader* (LL tokens) to up to FC *followers* (FL tokens each) and holds
at most LC leaders. A leader's recency is refreshed by queries and insertions; a
follower's only by insertion, and only against its own leader's followers.

Layout, chosen so that a full paper-sized table (LC=2^20, FC=128, FL=3) fits in a few
GiB: leaders live in an ``OrderedDict`` (least recent first) mapping the leader tuple to a
*slot*; each slot owns an (FC, FL) int32 block of followers ordered least recent first,
plus a count. Slots come in blocks of about 1 MiB allocated on demand, and the slot of an
evicted leader is reused by the leader that evicted it. A follower therefore costs
4*FL bytes; see :meth:`LRUTable.worst_case_nbytes`.

Example (LL=1, FL=2, FC=2)::

    >>> t = LRUTable(ll=1, fl=2, lc=8, fc=2)
    >>> t.insert((1,), (2, 3)); t.insert((1,), (4, 5)); t.insert((1,), (2, 3))
    >>> t.query((1,))                       # most recent first
    [(2, 3), (4, 5)]
    >>> t.insert((1,), (6, 7))              # FC=2: evicts (4, 5), least recently inserted
    >>> t.query((1,))
    [(6, 7), (2, 3)]
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterator

import numpy as np

from draftwise.core.drafters.table_io import check, read_table, write_table
from draftwise.errors import DraftwiseError

Gram = tuple[int, ...]

#: Python bytes per leader beyond its follower block: OrderedDict entry and linked-list
#: node, the leader tuple and its int objects, the slot int and the count list entry.
#: Calibrated with tracemalloc (tests/core/test_cacheback_table.py): 201 bytes for LL=1.
LEADER_OVERHEAD = 165
LEADER_TOKEN_OVERHEAD = 36  # one more int object + tuple slot per leader token
_BLOCK_BYTES = 1 << 20


class LRUTable:
    """Leader -> followers with LRU eviction at LC leaders and FC followers per leader."""

    def __init__(self, ll: int = 1, fl: int = 3, lc: int = 1 << 16, fc: int = 32) -> None:
        for name, value in (("ll", ll), ("fl", fl), ("lc", lc), ("fc", fc)):
            if not isinstance(value, (int, np.integer)) or int(value) < 1:
                raise DraftwiseError(f"cacheback {name} must be an integer >= 1, got {value!r}")
        self.ll, self.fl, self.lc, self.fc = int(ll), int(fl), int(lc), int(fc)
        self._block_slots = max(1, min(self.lc, _BLOCK_BYTES // (self.fc * self.fl * 4)))
        self.clear()

    def __len__(self) -> int:
        return len(self._slots)

    def clear(self) -> None:
        # leader -> slot, least recent first
        self._slots: OrderedDict[Gram, int] = OrderedDict()
        self._blocks: list[np.ndarray] = []  # each (block_slots, FC, FL) int32
        self._count: list[int] = []  # followers held per slot

    def _rows(self, slot: int) -> np.ndarray:
        """(FC, FL) view of a slot's followers, least recent first."""
        return self._blocks[slot // self._block_slots][slot % self._block_slots]

    def _take_slot(self) -> int:
        if len(self._slots) >= self.lc:  # evict the LRU leader, reuse its slot
            _, slot = self._slots.popitem(last=False)
            return slot
        slot = len(self._slots)  # slots 0..len-1 are all in use when nothing was evicted
        if slot >= len(self._count):
            self._blocks.append(np.zeros((self._block_slots, self.fc, self.fl), np.int32))
            self._count.extend([0] * self._block_slots)
        return slot

    def insert(self, leader: Gram, follower: Gram) -> None:
        """Add ``follower`` after ``leader`` (or refresh it), evicting LRU entries if full."""
        slot = self._slots.get(leader)
        if slot is None:
            slot = self._take_slot()
            self._slots[leader] = slot
            self._count[slot] = 0
        else:
            self._slots.move_to_end(leader)
        rows, n = self._rows(slot), self._count[slot]
        j = -1
        if n:  # at most fc short rows: a list search (the numpy compare, ~4 calls, cost
            # ~25 us right after a verify; an insert runs per emitted token)
            try:
                j = rows[:n].tolist().index(list(follower))
            except ValueError:
                j = -1
        if j >= 0:  # move it to the most recent end
            rows[j : n - 1] = rows[j + 1 : n]
            rows[n - 1] = follower
        elif n >= self.fc:  # evict this leader's LRU follower (row 0)
            rows[:-1] = rows[1:]
            rows[-1] = follower
        else:
            rows[n] = follower
            self._count[slot] = n + 1

    def holds(self, leader: Gram) -> bool:
        """Whether ``leader`` has followers, without refreshing its recency (as ``query``
        does)."""
        return leader in self._slots

    def query(self, leader: Gram, limit: int | None = None) -> list[Gram]:
        """Followers of ``leader``, most recent first (at most ``limit``); refreshes the
        leader's recency."""
        slot = self._slots.get(leader)
        if slot is None:
            return []
        self._slots.move_to_end(leader)
        bs = self._block_slots
        rows = self._blocks[slot // bs][slot % bs, : self._count[slot]][::-1]
        if limit is not None:
            rows = rows[: max(limit, 0)]
        return list(map(tuple, rows.tolist()))

    def insert_windows(self, tokens: list[int], first: int) -> None:
        """Insert every (leader, follower) window whose follower starts at index >= first
        and ends inside ``tokens``: the sliding window of §3.2."""
        ll, fl = self.ll, self.fl
        for i in range(max(first, ll), len(tokens) - fl + 1):
            self.insert(tuple(tokens[i - ll : i]), tuple(tokens[i : i + fl]))

    def items(self) -> Iterator[tuple[Gram, list[Gram]]]:
        """(leader, followers least recent first), leaders least recent first."""
        for leader, slot in self._slots.items():
            yield leader, list(map(tuple, self._rows(slot)[: self._count[slot]].tolist()))

    def token_count(self) -> int:
        """Tokens held: the quantity the paper bounds by LL*LC + FL*LC*FC."""
        return sum(self.ll + self.fl * self._count[s] for s in self._slots.values())

    # ----- memory ------------------------------------------------------------------------
    def nbytes(self) -> int:
        """Estimated bytes held: follower blocks allocated so far (exact) plus the Python
        objects of the leaders (calibrated per-leader overhead)."""
        per_leader = LEADER_OVERHEAD + LEADER_TOKEN_OVERHEAD * self.ll
        blocks = sum(b.nbytes for b in self._blocks) + 8 * len(self._count)
        return blocks + per_leader * len(self._slots)

    @staticmethod
    def worst_case_nbytes(ll: int, fl: int, lc: int, fc: int) -> int:
        """Bytes of a completely full table, computed without allocating it.

        Example: the paper's settings (LL=1, FL=3, LC=2^20, FC=128) and the defaults::

            >>> round(LRUTable.worst_case_nbytes(1, 3, 1 << 20, 128) / 2**30, 2)   # GiB
            1.7
            >>> round(LRUTable.worst_case_nbytes(1, 3, 1 << 16, 32) / 2**20, 1)    # MiB
            37.1
        """
        per_leader = LEADER_OVERHEAD + LEADER_TOKEN_OVERHEAD * ll + 8
        return lc * (fc * fl * 4 + per_leader)

    # ----- persistence -------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str], tokenizer_id: str) -> None:
        """Write the table to ``path`` (.npz, atomic), keeping the exact LRU order."""
        slots = list(self._slots.values())
        counts = np.array([self._count[s] for s in slots], np.int64)
        leaders = np.array(list(self._slots), np.int32).reshape(len(slots), self.ll)
        followers = (
            np.concatenate([self._rows(s)[: self._count[s]] for s in slots])
            if slots
            else np.zeros((0, self.fl), np.int32)
        )
        meta = {"ll": self.ll, "fl": self.fl, "lc": self.lc, "fc": self.fc}
        arrays: dict[str, np.ndarray] = {
            "leaders": leaders,
            "counts": counts,
            "followers": followers,
        }
        write_table(path, "lru", tokenizer_id, meta, arrays)

    @classmethod
    def load(cls, path: str | os.PathLike[str], tokenizer_id: str) -> LRUTable:
        """Read a table saved by :meth:`save` (same tokenizer), in the same LRU order."""
        meta, a = read_table(
            path, "lru", tokenizer_id, ["ll", "fl", "lc", "fc"], ["leaders", "counts", "followers"]
        )
        table = cls(meta["ll"], meta["fl"], meta["lc"], meta["fc"])
        leaders, counts, followers = a["leaders"], a["counts"], a["followers"]
        n = leaders.shape[0] if leaders.ndim == 2 else -1
        check(leaders.ndim == 2 and leaders.shape[1] == table.ll, path, "leaders shape")
        check(counts.shape == (n,) and n <= table.lc, path, "more leaders than LC")
        check(bool(np.all((counts >= 1) & (counts <= table.fc))), path, "follower counts")
        check(followers.shape == (int(counts.sum()), table.fl), path, "followers shape")
        keys = [tuple(r) for r in leaders.tolist()]
        check(len(set(keys)) == n, path, "duplicate leaders")
        group = np.repeat(np.arange(n), counts)
        order = np.lexsort([*followers.T[::-1], group])
        same = (group[order][1:] == group[order][:-1]) & np.all(
            followers[order][1:] == followers[order][:-1], axis=1
        )
        check(not bool(same.any()), path, "a leader lists the same follower twice")
        start = 0
        for leader, c in zip(keys, counts.tolist(), strict=True):
            slot = table._take_slot()
            table._slots[leader] = slot
            table._rows(slot)[:c] = followers[start : start + c]
            table._count[slot] = c
            start += c
        return table
