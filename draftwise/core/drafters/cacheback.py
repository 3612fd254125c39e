"""Cacheback (seed 000): n-gram tables of tokens as the only drafter.

Two tables map a *leader* (the last LL tokens) to *followers* (the FL tokens seen right
after it): the dynamic ``LRUTable`` learns from the prompt and the accepted tokens
(§3.1), the optional ``FrozenTable`` holds frequent n-grams of a corpus and never
changes (§3.3).

Drafting grows a tree breadth-first: query with the last LL tokens of the context, hang
each follower below the root as a chain of FL nodes, then query again with the last LL
tokens of every new leaf, until the tables have nothing more or the tree holds
``budget`` nodes (TDL minus the uncached root). For every node the dynamic table's
followers come first (most recent first), then the frozen table's (most frequent first);
a follower already in the tree adds nothing. The first level may use at most
``budget - CRT`` nodes, so CRT nodes stay reserved for depth (§3.2). ``table`` picks the
configuration of the paper's Table 1: ``"dual"``, ``"dynamic"`` (no frozen table) or
``"frozen"`` (frozen table only; the dynamic one is still updated, just not queried).

Example (LL=1, FL=2)::

    >>> d = Cacheback(ll=1, fl=2)
    >>> d.begin(np.array([1, 2, 3, 1, 2, 4]))      # warm-up: (1)->(2,3), (2)->(3,1)...
    >>> t = d.propose(np.array([9, 1]), budget=4)
    >>> t.tokens.tolist(), t.parents.tolist()       # 1 -> (2,4) newest first, (2,3); 3 -> (1,...)
    ([2, 4, 3, 1], [-1, 0, 0, 2])
    >>> frozen = FrozenTable(np.array([[1]]), np.array([0, 1]), np.array([[5, 6]]))
    >>> d = Cacheback(ll=1, fl=2, frozen=frozen)
    >>> d.begin(np.array([1, 2, 3]))
    >>> d.propose(np.array([1]), budget=4).tokens.tolist()   # dynamic (2,3), then frozen (5,6)
    [2, 5, 3, 6]
"""

from __future__ import annotations

import os
from collections import deque

import numpy as np

from draftwise.core.drafters.frozen_table import FrozenTable
from draftwise.core.drafters.lru_table import Gram, LRUTable
from draftwise.core.tree import DraftTree, TreeBuilder
from draftwise.errors import DraftwiseError

TABLE_MODES = ("dual", "dynamic", "frozen")


class Cacheback:
    """The Cacheback drafter: a dynamic LRU table, optionally backed by a frozen table.

    ``frozen`` is a loaded ``FrozenTable``; or give ``frozen_path`` and ``tokenizer_id``
    (``Tokenizer.identity()``) to load one, refused if built for another tokenizer.
    """

    name = "cacheback"

    def __init__(
        self,
        ll: int = 1,
        fl: int = 3,
        lc: int = 1 << 16,
        fc: int = 32,
        crt: int = 4,
        frozen: FrozenTable | None = None,
        table: str = "dual",
        frozen_path: str | os.PathLike[str] | None = None,
        tokenizer_id: str | None = None,
    ) -> None:
        if not isinstance(crt, (int, np.integer)) or crt < 0:
            raise DraftwiseError(f"cacheback crt must be an integer >= 0, got {crt!r}")
        if table not in TABLE_MODES:
            raise DraftwiseError(f"cacheback table must be one of {TABLE_MODES}, got {table!r}")
        if frozen_path is not None:
            if frozen is not None:
                raise DraftwiseError("give cacheback either frozen or frozen_path, not both")
            if tokenizer_id is None:
                raise DraftwiseError(
                    f"cacheback frozen_path={os.fspath(frozen_path)!r} needs tokenizer_id "
                    "(the model tokenizer's identity()) to check the table matches"
                )
            frozen = FrozenTable.load(frozen_path, tokenizer_id)
        if table == "frozen" and frozen is None:
            raise DraftwiseError("cacheback table='frozen' needs a frozen table (frozen_path)")
        if frozen is not None and frozen.ll != ll:
            raise DraftwiseError(
                f"the frozen table has leader length {frozen.ll} but cacheback ll={ll}"
            )
        self.table = LRUTable(ll, fl, lc, fc)
        self.frozen = frozen
        self.mode = table
        self.crt = int(crt)
        # leaders of tokens not shown yet (``note_unseen``), until ``update`` shows them
        self._unseen: set[Gram] = set()

    def reset(self) -> None:
        """Forget the dynamic table (the frozen table stays)."""
        self.table.clear()
        self._unseen.clear()

    def begin(self, prompt: np.ndarray) -> None:
        self.table.insert_windows(np.asarray(prompt).tolist(), 0)

    def update(self, context: np.ndarray, n_new: int) -> None:
        t = self.table
        lo = max(0, context.size - n_new - t.fl - t.ll + 1)
        tail = context[lo:].tolist()
        # only windows whose follower ends in the new tokens are new
        t.insert_windows(tail, max(t.ll, len(tail) - n_new - t.fl + 1))
        self._unseen.clear()  # (update shows every token not shown: ``note_unseen``)

    def note_unseen(self, context: np.ndarray, n_new: int) -> None:
        """The last ``n_new`` tokens of ``context`` are not shown to the table now (a
        later ``update`` shows them all at once): keep only the leaders whose followers
        they complete, so that ``seen_before`` still counts them. A few tuples a step
        where ``update`` inserts windows (``auto`` keeps its copy member this way while
        another member drafts: 0.025 -> ~0.003 ms a step, AMD EPYC Zen 5)."""
        t = self.table
        ll, fl, n = t.ll, t.fl, context.size
        lo = max(ll, n - n_new - fl + 1)  # the first new leader ends here, the last at n - fl
        if lo > n - fl:
            return
        tail = context[lo - ll : n - fl].tolist()
        add = self._unseen.add
        for i in range(len(tail) - ll + 1):
            add(tuple(tail[i : i + ll]))

    def seen_before(self, context: np.ndarray) -> bool:
        """Whether the context's last LL tokens occurred before in the text, FL tokens or
        more before its end (the dynamic table holds their followers, or will once shown
        the tokens ``note_unseen`` kept): a span may be being copied. One or two
        dictionary lookups; ``auto`` asks it each step on a steep cost curve
        (``copy_member``).

        Example::

            >>> d = Cacheback(ll=2, table="dynamic")
            >>> d.begin(np.array([4, 5, 6, 7, 8]))   # (4, 5) followed by (6, 7, 8)
            >>> d.seen_before(np.array([9, 4, 5])), d.seen_before(np.array([9, 5, 4]))
            (True, False)
            >>> text = np.array([4, 5, 6, 7, 8, 1, 2, 3, 0, 0, 0])
            >>> d.note_unseen(text, 6)               # (1, 2) now has 3 followers: kept
            >>> d.seen_before(np.array([1, 2])), d.table.holds((1, 2))
            (True, False)
        """
        ll = self.table.ll
        if context.size < ll:
            return False
        key = tuple(context[-ll:].tolist())
        return self.table.holds(key) or key in self._unseen

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        ll = self.table.ll
        if budget <= 0 or context.size < ll:
            return DraftTree.empty()
        query = self.table.query if self.mode != "frozen" else None
        frozen = self.frozen if self.mode != "dynamic" else None
        root = tuple(context[-ll:].tolist())
        first = query(root) if query is not None else []  # the root's dynamic followers
        if not first and frozen is None:
            return DraftTree.empty()  # nothing to draft: skip building
        builder = TreeBuilder()
        nodes = builder.tokens  # the builder's node list: len(nodes) is the tree's size
        add_path = builder.add_path
        first_limit = budget - self.crt if budget > self.crt else budget
        queue: deque[tuple[int, Gram]] = deque([(-1, root)])
        seen = {-1}
        while queue and len(nodes) < budget:
            node, leader = queue.popleft()
            if node < 0:
                limit, followers = first_limit, first
            else:
                limit = budget
                followers = query(leader) if query is not None else []
            if frozen is not None and len(nodes) < limit:
                # each frozen follower not among the dynamic ones adds >= 1 node (exact
                # when both tables share FL), so more than this could never fit
                followers += frozen.query(leader, limit - len(nodes) + len(followers))
            for follower in followers:
                if len(nodes) >= limit:
                    break
                end, complete = add_path(node, follower, limit=limit)
                if complete and end not in seen:
                    seen.add(end)
                    queue.append((end, (leader + follower)[-ll:]))
        return builder.build(budget)

    # ----- memory and persistence --------------------------------------------------------
    def nbytes(self) -> int:
        """Estimated bytes of both tables."""
        return self.table.nbytes() + (self.frozen.nbytes if self.frozen is not None else 0)

    def save(self, path: str | os.PathLike[str], tokenizer_id: str) -> None:
        """Save the dynamic table (LRU order kept; atomic). The frozen table is a separate
        read-only file and is not saved here."""
        self.table.save(path, tokenizer_id)

    def load(self, path: str | os.PathLike[str], tokenizer_id: str) -> None:
        """Replace the dynamic table by one saved with :meth:`save`. On any error the
        drafter and the file are left as they were."""
        table = LRUTable.load(path, tokenizer_id)
        if self.frozen is not None and table.ll != self.frozen.ll:
            raise DraftwiseError(
                f"table file '{os.fspath(path)}' has leader length {table.ll} but the frozen "
                f"table has {self.frozen.ll}"
            )
        self.table = table


__all__ = ["Cacheback", "FrozenTable", "LRUTable", "TABLE_MODES"]
