"""Cacheback (seed 000): LRU tables of token n-grams as the only drafter.

The table maps a *leader* (the last LL tokens) to up to FC *followers* (the FL tokens
seen right after it), and holds at most LC leaders. Both evictions are least recently
used. A leader's recency is refreshed by queries and insertions; a follower's only by
insertion, and only against its own leader's followers (§3.1).

Drafting grows a tree breadth-first: query the table with the last LL tokens of the
context, hang each follower below the root as a chain of FL nodes, then query again
with the last LL tokens of every new leaf, until the table has nothing more or the tree
holds ``budget`` nodes (TDL minus the uncached root). The first level may use at most
``budget - CRT`` nodes, so CRT nodes stay reserved for depth (§3.2).

Example (LL=1, FL=2)::

    >>> d = Cacheback(ll=1, fl=2)
    >>> d.begin(np.array([1, 2, 3, 1, 2, 4]))      # warm-up: (1)->(2,3), (2)->(3,1)...
    >>> t = d.propose(np.array([9, 1]), budget=4)
    >>> t.tokens.tolist(), t.parents.tolist()       # 1 -> (2,4) newest first, (2,3); 3 -> (1,...)
    ([2, 4, 3, 1], [-1, 0, 0, 2])
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator

import numpy as np

from draftwise.core.tree import DraftTree, TreeBuilder
from draftwise.errors import DraftwiseError

Gram = tuple[int, ...]


class LRUTable:
    """Leader -> followers with LRU eviction at LC leaders and FC followers per leader."""

    def __init__(self, ll: int = 1, fl: int = 3, lc: int = 1 << 16, fc: int = 32) -> None:
        for name, value in (("ll", ll), ("fl", fl), ("lc", lc), ("fc", fc)):
            if int(value) < 1:
                raise DraftwiseError(f"cacheback {name} must be >= 1, got {value!r}")
        self.ll, self.fl, self.lc, self.fc = int(ll), int(fl), int(lc), int(fc)
        # leader -> followers; both OrderedDicts run from least to most recent
        self._table: OrderedDict[Gram, OrderedDict[Gram, None]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._table)

    def clear(self) -> None:
        self._table.clear()

    def insert(self, leader: Gram, follower: Gram) -> None:
        followers = self._table.get(leader)
        if followers is None:
            if len(self._table) >= self.lc:
                self._table.popitem(last=False)  # evict the LRU leader
            followers = self._table[leader] = OrderedDict()
        else:
            self._table.move_to_end(leader)
        if follower in followers:
            followers.move_to_end(follower)
        else:
            if len(followers) >= self.fc:
                followers.popitem(last=False)  # evict this leader's LRU follower
            followers[follower] = None

    def query(self, leader: Gram) -> list[Gram]:
        """Followers of ``leader``, most recent first; refreshes the leader's recency."""
        followers = self._table.get(leader)
        if followers is None:
            return []
        self._table.move_to_end(leader)
        return list(reversed(followers))

    def insert_windows(self, tokens: list[int], first: int) -> None:
        """Insert every (leader, follower) window whose follower starts at index >= first
        and ends inside ``tokens``: the sliding window of §3.2."""
        ll, fl = self.ll, self.fl
        for i in range(max(first, ll), len(tokens) - fl + 1):
            self.insert(tuple(tokens[i - ll : i]), tuple(tokens[i : i + fl]))

    def items(self) -> Iterator[tuple[Gram, list[Gram]]]:
        """(leader, followers least recent first), leaders least recent first."""
        for leader, followers in self._table.items():
            yield leader, list(followers)

    def token_count(self) -> int:
        """Tokens held: the quantity the paper bounds by LL*LC + FL*LC*FC."""
        return sum(self.ll + self.fl * len(f) for f in self._table.values())


class Cacheback:
    """The Cacheback drafter over a dynamic LRU table (the frozen table comes later)."""

    name = "cacheback"

    def __init__(
        self,
        ll: int = 1,
        fl: int = 3,
        lc: int = 1 << 16,
        fc: int = 32,
        crt: int = 4,
    ) -> None:
        if crt < 0:
            raise DraftwiseError(f"cacheback crt must be >= 0, got {crt!r}")
        self.table = LRUTable(ll, fl, lc, fc)
        self.crt = int(crt)

    def reset(self) -> None:
        self.table.clear()

    def begin(self, prompt: np.ndarray) -> None:
        self.table.insert_windows(np.asarray(prompt).tolist(), 0)

    def update(self, context: np.ndarray, n_new: int) -> None:
        t = self.table
        lo = max(0, context.size - n_new - t.fl - t.ll + 1)
        tail = context[lo:].tolist()
        # only windows whose follower ends in the new tokens are new
        t.insert_windows(tail, max(t.ll, len(tail) - n_new - t.fl + 1))

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        ll = self.table.ll
        if budget <= 0 or context.size < ll:
            return DraftTree.empty()
        builder = TreeBuilder()
        first_limit = budget - self.crt if budget > self.crt else budget
        queue: deque[tuple[int, Gram]] = deque([(-1, tuple(context[-ll:].tolist()))])
        seen = {-1}
        while queue and len(builder) < budget:
            node, leader = queue.popleft()
            limit = first_limit if node < 0 else budget
            for follower in self.table.query(leader):
                if len(builder) >= limit:
                    break
                end, complete = builder.add_path(node, follower, limit=limit)
                if complete and end not in seen:
                    seen.add(end)
                    queue.append((end, (leader + follower)[-ll:]))
        return builder.build(budget)
