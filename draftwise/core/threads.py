"""The thread count that is fastest now, chosen from the decoder's own step timings.

Two OpenMP threads on a 2-core machine whose other core is busy wait at every barrier for
the preempted one: a plain step of the default model went from 2.4 ms to 5-10 ms (one
thread: 3.6 ms) on a Zen 5 EPYC with one busy loop beside it. ``ThreadTuner`` keeps the
recent verify times of each thread count and, now and then or as soon as steps turn slow,
tries the other count for a few steps and keeps whichever is faster. Only the compiled
kernels take the chosen count (``Backend.set_kernel_threads``), and those give a row the
same bits at any thread count, so the choice changes speed, never the output.

Example::

    >>> tuner = ThreadTuner((2, 1), probe_every=8, probe_len=2)
    >>> for _ in range(8):
    ...     tuner.record(tuner.current(), rows=1, ms=10.0)   # two threads, slow (busy)
    >>> tuner.current()                                     # probing one thread
    1
    >>> for _ in range(2):
    ...     tuner.record(tuner.current(), rows=1, ms=4.0)
    >>> tuner.current(), tuner.best
    (1, 1)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from statistics import median
from typing import Protocol, runtime_checkable

# steps of at most this many rows are compared (most steps; wide trees cost more anyway)
SMALL_ROWS = 4


@runtime_checkable
class ThreadTunable(Protocol):
    """A backend whose compiled kernels take a thread count of their own, row-invariant
    at every count (``thread_counts``: the counts worth trying, best guess first; empty
    or one: nothing to tune)."""

    thread_counts: tuple[int, ...]

    def set_kernel_threads(self, n: int) -> None: ...


class ThreadTuner:
    """Chooses among ``counts`` by the median verify time of recent small steps."""

    def __init__(
        self,
        counts: Sequence[int],
        probe_every: int = 128,
        probe_len: int = 4,
        window: int = 9,
        slow: float = 1.6,
        margin: float = 0.9,
    ) -> None:
        if not counts or any(c < 1 for c in counts):
            raise ValueError(f"thread counts must be >= 1, got {list(counts)}")
        self.counts = tuple(dict.fromkeys(counts))
        self.best = self.counts[0]
        self.probe_every, self.probe_len = probe_every, probe_len
        self.slow, self.margin = slow, margin
        self.times = {c: deque(maxlen=window) for c in self.counts}  # ms of small steps
        self._every = probe_every  # grows (to 8x) while probes keep losing
        self._since = max(0, probe_every - 16)  # the first probe early: busy from the start?
        self._probe: list[int] = []  # counts still to try, one per remaining probe step
        self._streak = 0  # consecutive slow steps at the best count
        self.switches = 0

    def current(self) -> int:
        """The thread count for the next step."""
        return self._probe[0] if self._probe else self.best

    def record(self, used: int, rows: int, ms: float) -> None:
        """The verify time of a step run with ``used`` threads over ``rows`` rows."""
        if rows > SMALL_ROWS or used not in self.times:
            return
        probing = bool(self._probe)
        if probing:
            self._probe.pop(0)
        ref = self.times[used]
        # slow against the faster quarter of recent steps (a busy core makes them bimodal)
        if not probing and len(ref) >= 3 and ms > self.slow * sorted(ref)[len(ref) // 4]:
            self._streak += 1
        else:
            self._streak = 0
        ref.append(ms)
        if probing and not self._probe:
            self._decide()
            return
        self._since += 1
        if len(self.counts) > 1 and (self._since >= self._every or self._streak >= 3):
            self._start_probe()

    def _start_probe(self) -> None:
        others = [c for c in self.counts if c != self.best]
        self._probe = [c for c in others for _ in range(self.probe_len)]
        self._since = self._streak = 0
        for c in others:
            self.times[c].clear()  # judge the other counts on fresh steps only

    def _decide(self) -> None:
        recent = {c: list(t) for c, t in self.times.items() if t}
        if self.best not in recent:
            return
        now = median(list(self.times[self.best])[-self.probe_len :])  # the steps just before
        switched = False
        for c, t in recent.items():
            if c != self.best and median(t[-self.probe_len :]) < self.margin * now:
                self.best, now = c, median(t[-self.probe_len :])
                self.switches += 1
                switched = True
        # a lost probe waits twice as long next time (up to 8x): a quiet machine pays
        # ~4 slower steps in 1024, not in 128
        self._every = self.probe_every if switched else min(8 * self.probe_every, 2 * self._every)
