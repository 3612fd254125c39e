"""Saved KV-cache prefixes, so a conversation's next turn prefills only what is new even
when other requests ran in between.

A model has one KV cache. ``Decoder`` already reuses the longest common prefix of what
the cache holds and the next prompt, but a server interleaving several conversations
overwrites it between one conversation's turns. ``Prefixes`` keeps a few copies of
finished generations' caches (``tokens`` and the backend's opaque ``snapshot``), at
most ``max_tokens`` cached tokens in all, least recently used dropped first, each under
a ``key`` (a server's API key): a lookup only sees its own key's entries.

Example::

    >>> p = Prefixes(max_tokens=10)
    >>> p.put("a", [1, 2, 3, 4], "snap-a"); p.put("b", [1, 2, 9], "snap-b")
    >>> p.best("a", np.array([1, 2, 3, 7]))
    (3, 'snap-a')
    >>> p.best("b", np.array([1, 2, 3, 7]))
    (2, 'snap-b')
    >>> p.put("c", [5] * 6, "snap-c"); len(p)   # 13 tokens > 10: "a" (oldest) goes
    2
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Protocol, runtime_checkable

import numpy as np

from draftwise.errors import DraftwiseError


@runtime_checkable
class Snapshots(Protocol):
    """A backend whose KV cache prefix can be copied out and back in."""

    def save_prefix(self, n: int) -> Any:
        """A copy of the first ``n`` cached tokens' keys and values."""

    def load_prefix(self, snapshot: Any, n: int) -> None:
        """Make the cache hold the first ``n`` tokens of ``snapshot`` (and nothing else)."""


class Prefixes:
    """LRU store of (key, tokens, snapshot); see the module docstring."""

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 1:
            raise DraftwiseError(f"a prefix store needs max_tokens >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self._entries: OrderedDict[int, tuple[Any, list[int], Any]] = OrderedDict()
        self._next = 0
        self._held = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, key: Any, tokens: list[int], snapshot: Any) -> None:
        """Remember ``tokens``' cache; an entry of the same key that is a prefix of
        ``tokens`` is replaced (a conversation keeps only its latest turn)."""
        if not tokens or len(tokens) > self.max_tokens:
            return
        for i, (k, old, _) in list(self._entries.items()):
            if k == key and old == tokens[: len(old)]:
                del self._entries[i]
                self._held -= len(old)
        self._entries[self._next] = (key, list(tokens), snapshot)
        self._next += 1
        self._held += len(tokens)
        while self._held > self.max_tokens:
            _, (_, old, _) = self._entries.popitem(last=False)
            self._held -= len(old)

    def best(self, key: Any, prompt: np.ndarray) -> tuple[int, Any]:
        """(matched tokens, snapshot) of ``key``'s entry sharing the longest prefix with
        ``prompt``; (0, None) when none shares any. The entry becomes most recent."""
        best_i, best_n = -1, 0
        for i, (k, tokens, _) in self._entries.items():
            if k != key:
                continue
            n = _common(tokens, prompt)
            if n > best_n:
                best_i, best_n = i, n
        if best_i < 0:
            return 0, None
        self._entries.move_to_end(best_i)
        return best_n, self._entries[best_i][2]


def _common(a: list[int], b: np.ndarray) -> int:
    n = min(len(a), b.size)
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n], np.int64) != b[:n])
    return int(diff[0]) if diff.size else n
