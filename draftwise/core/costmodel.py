"""The measured cost of verifying ``r`` rows at context length ``c`` on one device.

``draftwise tune`` measures it (``core.costprofile``); the auto drafter plans with it.

The stored curve is a prior: ``observe`` takes each verify's measured time (the decoder
times every step anyway) and keeps, per row count of the curve, the running median of
measured / predicted over its last ``WINDOW`` steps that are among the last ``FRESH``
verifies of any size (so every correction is of the same recent time); the curve planned
with is the prior scaled by those medians (a row count not seen yet takes them interpolated between its
seen neighbours, or the nearest one's), made non-decreasing in rows; ``wants_plain``
asks the planner for the plain steps it would otherwise never time. A curve measured on
a busy machine (8 rows "cheaper" than 1) is thereby corrected within a few steps of each
size, and ``drifted`` says when live
timings disagree with the stored curve by more than ``DRIFT`` (``Assets`` then replaces
the stored file with ``corrected()``).

Example::

    >>> cm = CostModel(rows=[1, 16], ms=[10.0, 25.0])
    >>> float(cm.cost(8, context_len=100))
    17.0
    >>> for _ in range(5):
    ...     cm.observe(1, 100, 20.0)                       # one row costs twice the prior
    >>> float(cm.cost(1, context_len=100)), float(cm.cost(16, context_len=100))
    (20.0, 50.0)
"""

from __future__ import annotations

import bisect
import json
import math
import os
import statistics
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from draftwise.core.atomic import atomic_file
from draftwise.errors import DraftwiseError

WINDOW = 15  # recent steps per row count whose median corrects the prior
MIN_SEEN = 5  # steps of a row count before its correction applies
# a row count's timings count only while they are among the last FRESH verifies of any
# size: the machine's speed changes (a busy core, a slowed VM), and a correction kept
# from long ago beside a recent one gives the curve a shape neither time had (seen: a
# stored curve corrected to 2.5 / 6.9 ms at 1 / 2 rows, its one-row timings hours older)
FRESH = 256
DRIFT = 2.0  # live / stored beyond this (or below its inverse): the stored curve is stale
NOISE = 0.8  # a stored curve may dip by this factor with more rows (noise), no further
# the corrected curve grows at most this much faster than the rows: r rows in one pass
# cost about r passes of one at most (a 4bit CPU curve: 2.06x from 32 to 64 rows)
STEEP = 1.25
# observations between re-derivations of the corrected curve: each costs ~1 ms of Python
# (the fit below), a per-step ~90 us at 8 and ~30 at 16 (AMD EPYC Zen 3, warm; more right
# after a verify), while medians of 15 move slowly anyway. 32 since 2026-11-30: on the AMD
# EPYC Zen 5 VM the fit took 0.19-0.25 ms right after a verify, 0.012 ms a step at 16 (the
# largest item of `auto`'s own work in a greedy step there)
REFRESH = 32
# the machine's speed drifts (another process, a VM's neighbours) while the row counts
# are timed at different moments: a row count's correction is read against the verifies
# of any size around it, in blocks of this many consecutive verifies (``_joint``)
BLOCK = 16


class CostModel:
    """Verify latency in ms for ``rows`` rows, per context length (piecewise linear),
    corrected online by ``observe``."""

    def __init__(
        self,
        rows: Sequence[int],
        ms: Sequence[float] | Sequence[Sequence[float]],
        contexts: Sequence[int] = (0,),
        meta: dict[str, str] | None = None,
    ) -> None:
        self.rows = np.asarray(rows, np.float64)  # (R,) increasing
        table = np.asarray(ms, np.float64)
        self.ms = table.reshape(len(contexts), self.rows.size)  # (C, R)
        self.contexts = np.asarray(contexts, np.float64)  # (C,) increasing
        self.meta = dict(meta or {})
        self._ctx_list = self.contexts.tolist()  # the same floats, for scalar lookups
        self._dense: np.ndarray | None = None  # (C, R') cost at 1..R' rows, made on demand
        self._dense_lists: list[list[float]] | None = None  # the same as lists (costs_to)
        if self.rows.size < 2 or np.any(np.diff(self.rows) <= 0) or np.any(self.ms <= 0):
            raise DraftwiseError("a cost curve needs >= 2 increasing row counts and positive times")
        self.prior = self.ms  # (C, R) as stored or measured
        # per row count: (verify number, measured / predicted) of its last WINDOW verifies
        self._ratios: list[deque[tuple[int, float]]] = [
            deque(maxlen=WINDOW) for _ in range(self.rows.size)
        ]
        self._count = 0  # verifies observed
        # the last FRESH verifies of any size: (verify number, row index, log measured / prior)
        self._all: deque[tuple[int, int, float]] = deque(maxlen=FRESH)
        self._fresh_n = [0] * self.rows.size  # per row count: its fresh ratios, lately
        self._scale = np.ones(self.rows.size)  # (R,) measured / prior, per row count
        self._logr = np.log(self.rows)  # (R,)
        self._unapplied = 0  # observations since the curve was last re-derived
        self._prior_dense: list[list[float]] | None = None  # (C, R') the prior at 1..R' rows
        self._nearest: dict[int, int] = {}  # row count -> index of the nearest in rows

    def wants_plain(self) -> bool:
        """Live timings correct the curve but none of a plain (one-row) step yet: the
        planner should verify one now and then (it never would while trees look cheap,
        and without it drafting is priced against a guess)."""
        seen = any(len(q) >= MIN_SEEN for q in self._ratios[1:])
        return seen and len(self._ratios[0]) < MIN_SEEN  # ever seen (not only lately)

    def wants_rows(self, rows: int) -> bool:
        """Live timings correct the curve, but none lately of a verify of ``rows`` rows
        (a row count of the curve): the planner should verify one that size now and
        then. A prior that prices it too high is otherwise never corrected, as the
        planner never picks it (seen: 2 rows stored at 3.8 ms, 1.5x the one-row step,
        where live steps of 2 rows took 2.9; the planner drafted nothing, or 3 nodes)."""
        hit = np.flatnonzero(self.rows == rows)
        if not hit.size or max(self._fresh_n) < MIN_SEEN:
            return False
        return self._fresh_n[int(hit[0])] < MIN_SEEN

    def plausible(self) -> bool:
        """Whether the curve could be a quiet machine's: never much cheaper with more
        rows (a profile measured while the machine was busy often is).

        Example::

            >>> CostModel(rows=[1, 8, 16], ms=[40.0, 30.1, 55.9]).plausible()
            False
        """
        return bool(np.all(self.prior[:, 1:] >= NOISE * np.maximum.accumulate(self.prior, axis=1)[:, :-1]))

    def observe(self, rows: int, context_len: int, ms: float) -> None:
        """One verify of ``rows`` rows at ``context_len`` took ``ms``: update the
        correction of the nearest row count of the curve."""
        if rows < 1 or not ms > 0:
            return
        j = self._nearest.get(rows)
        if j is None:  # nearest, in log rows (a per-step path: once per row count)
            j = self._nearest[rows] = int(np.argmin(np.abs(self._logr - np.log(rows))))
        dense = self._prior_dense  # the prior as lists, sampled once at 1..R' rows
        if dense is None or len(dense[0]) < rows:
            grid = np.arange(1, max(rows, 128) + 1, dtype=np.float64)
            dense = self._curves_of(self.prior, grid).tolist()
            self._prior_dense = dense
        predicted = self._blend_at(dense, rows - 1, context_len)
        self._count += 1
        self._ratios[j].append((self._count, ms / predicted))
        self._all.append((self._count, j, math.log(ms / predicted)))
        self._unapplied += 1
        # re-derive the curve every REFRESH steps (and when a row count first counts):
        # a per-step hot path, and medians of 15 move slowly anyway
        if self._unapplied < REFRESH and len(self._ratios[j]) != MIN_SEEN:
            return
        self._unapplied = 0
        fresh = self._fresh()
        self._fresh_n = [len(r) for r in fresh]
        seen = [i for i, r in enumerate(fresh) if len(r) >= MIN_SEEN]
        if not seen:
            return
        med = self._joint(seen)
        logr = self._logr
        for i in range(self.rows.size):
            lo = max((k for k in seen if k <= i), default=None)
            hi = min((k for k in seen if k >= i), default=None)
            if lo is None or hi is None or lo == hi:  # outside the seen ones: the nearest
                self._scale[i] = med[lo if hi is None else hi]
            else:  # between two seen row counts: interpolated in log rows
                w = (logr[i] - logr[lo]) / (logr[hi] - logr[lo])
                self._scale[i] = (1 - w) * med[lo] + w * med[hi]
        # corrected, then non-decreasing in rows (more rows never cost less) and growing
        # at most STEEP x in proportion to them
        ms = np.maximum.accumulate(self.prior * self._scale[None, :], axis=1)
        grow = STEEP * self.rows[1:] / self.rows[:-1]  # (R-1,)
        for k in range(1, ms.shape[1]):
            ms[:, k] = np.minimum(ms[:, k], grow[k - 1] * ms[:, k - 1])
        self.ms = ms
        self._dense = None
        self._dense_lists = None

    def _joint(self, seen: list[int]) -> dict[int, float]:
        """Per seen row count, measured / prior now: log ratio = a(block) + b(rows),
        fitted by medians (robust to outliers) over the fresh verifies. a is the machine's
        speed in each block of BLOCK consecutive verifies, b a row count's correction
        against the others timed in the same blocks, so a row count timed mostly while
        the machine was slow is not priced as if its extra rows cost that; the result is
        b at the newest block's speed. A row count never timed beside another keeps the
        prior's shape (its b from its own blocks alone is 0). Example: one row timed on
        a quiet machine and two rows just after, twice as slow for everything, give
        two rows the prior's price ratio to one at the slow speed (``observe``)."""
        newest, keep = self._count, set(seen)
        cols: dict[int, list[int]] = {j: [] for j in seen}
        blocks: dict[int, list[int]] = {}
        blk_of: list[int] = []
        y: list[float] = []
        rows_of: list[int] = []
        for n, j, v in self._all:
            if j in keep:
                k = len(y)
                blk = (newest - n) // BLOCK
                cols[j].append(k)
                blocks.setdefault(blk, []).append(k)
                blk_of.append(blk)
                y.append(v)
                rows_of.append(j)
        median = statistics.median
        b = dict.fromkeys(seen, 0.0)
        a: dict[int, float] = {}
        for _ in range(2):  # alternating medians: a from b, then b from a
            a = {blk: median([y[k] - b[rows_of[k]] for k in ks]) for blk, ks in blocks.items()}
            b = {j: median([y[k] - a[blk_of[k]] for k in ks]) if ks else 0.0 for j, ks in cols.items()}
        now = a[min(a)]  # the newest block's speed
        return {j: math.exp(now + b.get(j, 0.0)) for j in seen}

    def _fresh(self) -> list[list[float]]:
        """Per row count, its ratios among the last ``FRESH`` verifies of any size."""
        oldest = self._count - FRESH
        return [[r for n, r in q if n > oldest] for q in self._ratios]

    @property
    def drifted(self) -> bool:
        """Live timings disagree with the stored curve by more than ``DRIFT`` at some
        row count seen ``MIN_SEEN`` times, or the stored curve is implausible."""
        seen = [i for i, r in enumerate(self._fresh()) if len(r) >= MIN_SEEN]
        far = any(not 1 / DRIFT <= self._scale[i] <= DRIFT for i in seen)
        return far or (bool(seen) and not self.plausible())

    def rebase(self) -> None:
        """Take the corrected curve as the prior (after ``corrected()`` was stored)."""
        self.prior = self.ms.copy()
        self._prior_dense = None
        for q in self._ratios:
            q.clear()
        self._all.clear()
        self._scale = np.ones(self.rows.size)

    def corrected(self) -> CostModel:
        """The curve as planned with now, as a new prior (what replaces a stale file)."""
        meta = {**self.meta, "corrected": "online, from live verify timings"}
        return CostModel(self.rows.astype(int).tolist(), self.ms.tolist(), self.contexts.astype(int).tolist(), meta)

    def _curves(self, r: np.ndarray) -> np.ndarray:
        """(C, ...) latency of ``r`` rows on each context's curve (linear past the end)."""
        return self._curves_of(self.ms, r)

    def _curves_of(self, table: np.ndarray, r: np.ndarray) -> np.ndarray:
        per_ctx = []
        for curve in table:
            slope = (curve[-1] - curve[-2]) / (self.rows[-1] - self.rows[-2])
            inside = np.interp(r, self.rows, curve)
            per_ctx.append(np.where(r > self.rows[-1], curve[-1] + slope * (r - self.rows[-1]), inside))
        return np.stack(per_ctx)

    def _context_weight(self, context_len: int) -> tuple[int, float]:
        """(j, w): ``context_len`` (clamped) lies between contexts j and j + 1, at weight
        w toward j + 1 (j = 0, w = 0 with one context)."""
        ctx = self._ctx_list
        if len(ctx) == 1:
            return 0, 0.0
        c = float(min(max(context_len, ctx[0]), ctx[-1]))
        j = min(max(bisect.bisect_left(ctx, c) - 1, 0), len(ctx) - 2)
        return j, (c - ctx[j]) / (ctx[j + 1] - ctx[j])

    def _blend(self, stacked: np.ndarray, context_len: int) -> np.ndarray:
        """Interpolate (C, ...) per-context values at ``context_len`` (clamped)."""
        if stacked.shape[0] == 1:
            return stacked[0]
        j, w = self._context_weight(context_len)
        return (1 - w) * stacked[j] + w * stacked[j + 1]

    def _blend_at(self, dense: list[list[float]], k: int, context_len: int) -> float:
        """``_blend`` of column ``k`` of per-context lists, in Python floats (without
        numpy's per-call cost on a per-step path)."""
        if len(dense) == 1:
            return dense[0][k]
        j, w = self._context_weight(context_len)
        return (1 - w) * dense[j][k] + w * dense[j + 1][k]

    def cost(self, rows: int | np.ndarray, context_len: int) -> np.ndarray:
        """Latency (ms) of verifying ``rows`` rows (vectorised) at ``context_len``."""
        return self._blend(self._curves(np.asarray(rows, np.float64)), context_len)

    def cost_upto(self, n: int, context_len: int) -> np.ndarray:
        """(n,) ``cost(np.arange(1, n + 1), context_len)``, from curves sampled once at
        every row count (the auto drafter asks each step).

        Example::

            >>> cm = CostModel(rows=[1, 16], ms=[10.0, 25.0])
            >>> cm.cost_upto(3, context_len=100).tolist()
            [10.0, 11.0, 12.0]
        """
        return self._blend(self._dense_upto(n)[:, :n], context_len)

    def costs_to(self, n: int, context_len: int) -> list[float]:
        """``cost_upto`` as Python floats, for the per-step paths that want a few of them
        (a numpy call costs ~5 us right after a verify; this, about one).

        Example::

            >>> CostModel(rows=[1, 16], ms=[10.0, 25.0]).costs_to(2, context_len=100)
            [10.0, 11.0]
        """
        dense = self._dense_lists
        if dense is None or len(dense[0]) < n:
            dense = self._dense_lists = self._dense_upto(n).tolist()
        if len(dense) == 1:
            return dense[0][:n]
        # ``_blend_at`` of each column with the context's weight found once (the same
        # floats: a per-step path, asked several times a step)
        j, w = self._context_weight(context_len)
        lo, hi, v = dense[j], dense[j + 1], 1 - w
        return [v * lo[k] + w * hi[k] for k in range(n)]

    def _dense_upto(self, n: int) -> np.ndarray:
        """(C, R') the corrected curves at 1..R' rows, R' >= max(n, 128) (made once per
        correction)."""
        dense = self._dense
        if dense is None or dense.shape[1] < n:
            dense = self._curves(np.arange(1, max(n, 128) + 1, dtype=np.float64))  # (C, R')
            self._dense, self._dense_lists = dense, None
        return dense

    def to_json(self) -> dict[str, object]:
        return {"version": 1, "rows": self.rows.astype(int).tolist(), "contexts":
                self.contexts.astype(int).tolist(), "ms": self.prior.tolist(), "meta": self.meta}

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write atomically (temp file + rename)."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CostModel:
        try:
            data = json.loads(Path(path).read_text())
            if data.get("version") != 1:
                raise ValueError(f"version {data.get('version')!r}")
            return cls(data["rows"], data["ms"], data["contexts"], data.get("meta"))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DraftwiseError(f"bad cost profile '{path}': {exc} (re-run 'draftwise tune')") from None
