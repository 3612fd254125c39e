"""The measured cost of verifying ``r`` rows at context length ``c`` on one device.

``draftwise tune`` measures it (``core.costprofile``); the auto drafter plans with it.

Example::

    >>> cm = CostModel(rows=[1, 16], ms=[10.0, 25.0])
    >>> float(cm.cost(8, context_len=100))
    17.0
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from draftwise.core.atomic import atomic_file
from draftwise.errors import DraftwiseError


class CostModel:
    """Verify latency in ms for ``rows`` rows, per context length (piecewise linear)."""

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
        if self.rows.size < 2 or np.any(np.diff(self.rows) <= 0) or np.any(self.ms <= 0):
            raise DraftwiseError("a cost curve needs >= 2 increasing row counts and positive times")

    def _curves(self, r: np.ndarray) -> np.ndarray:
        """(C, ...) latency of ``r`` rows on each context's curve (linear past the end)."""
        per_ctx = []
        for curve in self.ms:
            slope = (curve[-1] - curve[-2]) / (self.rows[-1] - self.rows[-2])
            inside = np.interp(r, self.rows, curve)
            per_ctx.append(np.where(r > self.rows[-1], curve[-1] + slope * (r - self.rows[-1]), inside))
        return np.stack(per_ctx)

    def _blend(self, stacked: np.ndarray, context_len: int) -> np.ndarray:
        """Interpolate (C, ...) per-context values at ``context_len`` (clamped)."""
        if stacked.shape[0] == 1:
            return stacked[0]
        ctx = self._ctx_list
        c = float(min(max(context_len, ctx[0]), ctx[-1]))
        j = min(max(bisect.bisect_left(ctx, c) - 1, 0), len(ctx) - 2)
        w = (c - ctx[j]) / (ctx[j + 1] - ctx[j])
        return (1 - w) * stacked[j] + w * stacked[j + 1]

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
        dense = self._dense
        if dense is None or dense.shape[1] < n:
            dense = self._curves(np.arange(1, max(n, 128) + 1, dtype=np.float64))  # (C, R')
            self._dense = dense
        return self._blend(dense[:, :n], context_len)

    def to_json(self) -> dict[str, object]:
        return {"version": 1, "rows": self.rows.astype(int).tolist(), "contexts":
                self.contexts.astype(int).tolist(), "ms": self.ms.tolist(), "meta": self.meta}

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
