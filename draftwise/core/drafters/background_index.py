"""Keeps a ``SuffixIndex`` of a ``TokenStore`` fresh without ever making a reader wait.

A daemon thread rebuilds the index from a snapshot whenever ``rebuild_tokens`` new
tokens arrived or ``rebuild_seconds`` passed with anything new. The finished index
replaces the old one by a single reference assignment, so a reader either sees the old
complete index or the new complete one, never a half-built one. Readers cover what came
after the index with a linear scan of the store's tail (see ``ssd.py``).

``background=False`` builds synchronously inside ``notify`` instead (deterministic, for
tests and single-threaded tools).

Example::

    >>> st = TokenStore(capacity=1024)
    >>> bx = BackgroundIndexer(st, rebuild_tokens=4, background=False)
    >>> st.begin_request([3, 4, 5, 6])
    >>> bx.notify()                      # 5 new tokens >= 4: rebuilt now
    >>> bx.index.start, bx.index.end
    (0, 5)
    >>> bx.close()
"""

from __future__ import annotations

import threading
import time

from draftwise.core.drafters.suffix_array import SuffixIndex
from draftwise.core.drafters.token_store import TokenStore
from draftwise.errors import DraftwiseError


class BackgroundIndexer:
    """Owns the current ``SuffixIndex`` of ``store`` and the thread that rebuilds it."""

    def __init__(
        self,
        store: TokenStore,
        rebuild_tokens: int = 4096,
        rebuild_seconds: float = 30.0,
        background: bool = True,
        pad: int = 64,
    ) -> None:
        if int(rebuild_tokens) < 1:
            raise DraftwiseError(f"ssd rebuild_tokens must be >= 1, got {rebuild_tokens!r}")
        if not float(rebuild_seconds) > 0:
            raise DraftwiseError(f"ssd rebuild_seconds must be > 0, got {rebuild_seconds!r}")
        self.store = store
        self.rebuild_tokens = int(rebuild_tokens)
        self.rebuild_seconds = float(rebuild_seconds)
        self.background = bool(background)
        self.pad = int(pad)
        self.index = SuffixIndex.empty(epoch=store.epoch)  # swapped whole, never mutated
        self.builds = 0  # completed rebuilds, for tests and stats
        self.last_build_s = 0.0  # seconds the last rebuild took
        self._last_done = time.monotonic()
        self._wake = threading.Event()
        self._stop = False
        self._build_lock = threading.Lock()  # one build at a time (thread or sync())
        self._thread: threading.Thread | None = None

    def pending(self) -> int:
        """Tokens written since the current index's snapshot (all, after a reset)."""
        ix = self.index
        if ix.epoch != self.store.epoch:
            return self.store.total - self.store.oldest
        return self.store.total - ix.end

    def _due(self) -> bool:
        new = self.pending()
        if new >= self.rebuild_tokens:
            return True
        return new > 0 and time.monotonic() - self._last_done >= self.rebuild_seconds

    def notify(self) -> None:
        """Call after writing to the store: starts a rebuild if one is due. Cheap."""
        if self._stop or not self._due():
            return
        if not self.background:
            self.sync()
            return
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="ssd-index", daemon=True)
            self._thread.start()
        self._wake.set()

    def sync(self) -> SuffixIndex:
        """Rebuild now in the calling thread (waits for a running rebuild first)."""
        self._rebuild()
        return self.index

    def close(self) -> None:
        """Stop rebuilding for good: the thread finishes the rebuild it is in, if any,
        and exits. Readers keep the last index (plus the tail scan). Idempotent."""
        self._stop = True
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while not self._stop:
            # the timeout makes the time trigger fire even when nobody calls notify()
            self._wake.wait(timeout=self.rebuild_seconds)
            self._wake.clear()
            if not self._stop and self._due():
                self._rebuild()

    def _rebuild(self) -> None:
        with self._build_lock:
            t0 = time.perf_counter()
            tokens, start, epoch = self.store.snapshot()
            fresh = SuffixIndex.build(tokens, start, epoch, pad=self.pad)
            cur = self.index
            # a store reset or load during the build makes this snapshot stale
            if epoch == self.store.epoch and (cur.epoch != epoch or fresh.end >= cur.end):
                self.index = fresh  # one reference assignment: atomic for readers
            self.builds += 1
            self.last_build_s = time.perf_counter() - t0
            self._last_done = time.monotonic()

    def reset(self) -> None:
        """Drop the index (after the store was cleared or loaded). A rebuild in flight
        is not waited for: its snapshot has the old epoch, so it is never swapped in."""
        self.index = SuffixIndex.empty(self.store.oldest, epoch=self.store.epoch)
        self._last_done = time.monotonic()
