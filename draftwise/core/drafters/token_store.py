"""The lifetime token store of the ``ssd`` drafter: a bounded ring of every request.

Tokens live at *logical* positions 0, 1, 2, ... that only grow; position ``p`` sits in
slot ``p % capacity``, and once more than ``capacity`` tokens were written the oldest are
overwritten. Each request is written as a separator ``-1``, its prompt, then its output
as it is generated, so no match or continuation can run from one request into another.
A small table of request records (prompt start, answer start, end) lets the drafter
replay the answer to a prompt it has seen before.

All methods take one lock: the decoding thread appends while the indexing thread takes
snapshots, and every read returns a copy.

Example (capacity 8)::

    >>> st = TokenStore(capacity=8)
    >>> st.begin_request(np.array([1, 2, 3]))        # writes -1, 1, 2, 3
    >>> st.append(np.array([4, 5, 6, 7, 8]))         # 9 tokens written: the -1 is gone
    >>> st.total, st.oldest, st.read(st.oldest, st.total).tolist()
    (9, 1, [1, 2, 3, 4, 5, 6, 7, 8])
"""

from __future__ import annotations

import bisect
import os
import threading
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from draftwise.core.atomic import atomic_file
from draftwise.errors import DraftwiseError

SEPARATOR = -1
FORMAT_VERSION = 1


class TokenStore:
    """Ring buffer of token ids with request boundaries; see the module docstring."""

    def __init__(self, capacity: int = 1 << 20) -> None:
        # the index packs two tokens and a position into int64 keys: bounded size
        if not 2 <= int(capacity) <= 1 << 29:
            raise DraftwiseError(f"ssd capacity must be 2 to 2**29 tokens, got {capacity!r}")
        self.capacity = int(capacity)
        self._buf = np.full(self.capacity, SEPARATOR, np.int32)
        self._lock = threading.Lock()
        self.total = 0  # tokens ever written; the next one goes to logical position total
        self.epoch = 0  # bumped when the contents are replaced (clear, load)
        # one row per request: logical prompt start, answer start, end (-1 while open)
        self._records: list[list[int]] = []

    # ----- writing ------------------------------------------------------------------
    @property
    def oldest(self) -> int:
        """The oldest logical position still held."""
        return max(0, self.total - self.capacity)

    def clear(self) -> None:
        with self._lock:
            self._buf.fill(SEPARATOR)
            self.total = 0
            self.epoch += 1
            self._records = []

    def begin_request(self, prompt: np.ndarray | list[int]) -> None:
        """Close the open request and start a new one: separator, then ``prompt``."""
        prompt = np.asarray(prompt, dtype=np.int64).reshape(-1)
        with self._lock:
            if self._records and self._records[-1][2] < 0:
                self._records[-1][2] = self.total
            start = self.total + 1
            self._write(np.concatenate([[SEPARATOR], prompt]))
            self._records.append([start, self.total, -1])
            self._prune()

    def append(self, tokens: np.ndarray) -> None:
        """Append tokens generated for the open request."""
        with self._lock:
            self._write(np.asarray(tokens, dtype=np.int64).reshape(-1))

    def _write(self, tokens: np.ndarray) -> None:
        if tokens.size and int(tokens.min()) < SEPARATOR:
            raise DraftwiseError(f"token ids must be >= 0, got {int(tokens.min())}")
        if tokens.size and int(tokens.max()) >= 1 << 31:  # the ring holds int32
            raise DraftwiseError(f"token ids must be < 2**31, got {int(tokens.max())}")
        cap = self.capacity
        if tokens.size > cap:  # only the newest capacity tokens survive anyway
            self.total += tokens.size - cap
            tokens = tokens[-cap:]
        n = tokens.size
        slot = self.total % cap
        first = min(n, cap - slot)
        self._buf[slot : slot + first] = tokens[:first]
        self._buf[: n - first] = tokens[first:]
        self.total += n

    def _prune(self) -> None:
        oldest = self.oldest
        while self._records and self._records[0][0] < oldest:
            self._records.pop(0)

    # ----- reading ------------------------------------------------------------------
    def read(self, lo: int, hi: int) -> np.ndarray:
        """A copy of the tokens at logical ``[lo, hi)``; ``lo`` is raised to the oldest
        position held and ``hi`` lowered to ``total``."""
        with self._lock:
            return self._read(lo, hi)

    def _read(self, lo: int, hi: int) -> np.ndarray:
        lo, hi = max(lo, self.oldest), min(hi, self.total)
        if hi <= lo:
            return np.zeros(0, np.int32)
        cap = self.capacity
        a, b = lo % cap, hi % cap
        if a < b:
            return self._buf[a:b].copy()
        return np.concatenate([self._buf[a:], self._buf[:b]])

    def read_since(self, lo: int, max_len: int) -> tuple[np.ndarray, int, int, int]:
        """(tokens, first logical position, total, epoch) for ``[lo, total)``, at most
        the newest ``max_len`` tokens of it, read under one lock so the four agree."""
        with self._lock:
            first = max(lo, self.oldest, self.total - max_len)
            return self._read(first, self.total), first, self.total, self.epoch

    def record_at(self, prompt_start: int) -> tuple[int, int, int] | None:
        """The request whose prompt starts at ``prompt_start``, if still held."""
        with self._lock:
            i = bisect.bisect_left(self._records, prompt_start, key=lambda r: r[0])
            if i < len(self._records) and self._records[i][0] == prompt_start:
                a, b, c = self._records[i]
                return a, b, c
            return None

    def snapshot(self) -> tuple[np.ndarray, int, int]:
        """(every token held, its first logical position, epoch)."""
        with self._lock:
            return self._read(self.oldest, self.total), self.oldest, self.epoch

    def records(self) -> list[tuple[int, int, int]]:
        """Closed and open requests still fully held: (prompt start, answer start, end)."""
        with self._lock:
            return [(a, b, c) for a, b, c in self._records]

    # ----- persistence --------------------------------------------------------------
    def save(self, path: str | os.PathLike[str], tokenizer_id: str) -> None:
        """Write the store to ``path`` (``.npz``, no pickle) atomically: a temporary file
        in the same folder, then ``os.replace``, so a crash never leaves half a file."""
        path = Path(path)
        with self._lock:
            tokens = self._read(self.oldest, self.total)
            arrays: dict[str, Any] = {
                "format_version": np.array(FORMAT_VERSION, np.int64),
                "tokenizer_id": np.array(str(tokenizer_id)),
                "first": np.array(self.oldest, np.int64),
                "tokens": tokens,
                "records": np.array(self._records, np.int64).reshape(-1, 3),
            }
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path, "wb") as f:
            np.savez(f, **arrays)  # a file object: numpy adds no ".npz" suffix

    def load(self, path: str | os.PathLike[str], tokenizer_id: str) -> None:
        """Replace the contents with the store saved at ``path``. A missing, corrupt or
        foreign file raises ``DraftwiseError`` and leaves both the file and this store
        as they were."""
        tokens, first, records = read_store_file(Path(path), str(tokenizer_id))
        with self._lock:
            self._buf.fill(SEPARATOR)
            self.total = first
            self._write(tokens)  # keeps the newest capacity tokens if the file is larger
            self.epoch += 1
            self._records = [list(map(int, r)) for r in records]
            self._prune()


def read_store_file(path: Path, tokenizer_id: str) -> tuple[np.ndarray, int, np.ndarray]:
    """Validated (tokens, first logical position, records) from a saved store."""
    try:
        with np.load(path, allow_pickle=False) as z:
            version = int(z["format_version"])
            if version != FORMAT_VERSION:
                raise DraftwiseError(
                    f"ssd store {str(path)!r} has format version {version}; "
                    f"this draftwise reads version {FORMAT_VERSION}"
                )
            saved_tok = str(z["tokenizer_id"])
            tokens = np.asarray(z["tokens"])
            first = int(z["first"])
            records = np.asarray(z["records"])
    except DraftwiseError:
        raise
    except FileNotFoundError:
        raise DraftwiseError(f"ssd store {str(path)!r} does not exist") from None
    except (OSError, ValueError, KeyError, EOFError, TypeError, zipfile.BadZipFile) as exc:
        raise DraftwiseError(f"ssd store {str(path)!r} is corrupt or truncated: {exc}") from None
    if saved_tok != tokenizer_id:
        raise DraftwiseError(
            f"ssd store {str(path)!r} was built with tokenizer {saved_tok!r}, "
            f"not {tokenizer_id!r}: its tokens mean something else"
        )
    ok = (
        tokens.ndim == 1
        and tokens.dtype.kind == "i"
        and (tokens.size == 0 or int(tokens.min()) >= SEPARATOR)
        and first >= 0
        and records.ndim == 2
        and records.shape[1] == 3
        and records.dtype.kind == "i"
    )
    if not ok:
        raise DraftwiseError(f"ssd store {str(path)!r} is corrupt: arrays have unexpected shapes")
    return tokens.astype(np.int64), first, records
