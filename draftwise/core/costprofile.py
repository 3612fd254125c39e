"""Measure a backend's verify latency against row count and context length.

The result is the ``CostModel`` the auto drafter plans with. Each point is the median
wall time of ``verify`` on a draft chain of ``rows - 1`` nodes (a tree with the same row
count costs the same: the mask differs, the work does not), after the cache holds
``context`` tokens. ``verify`` returns host arrays, so the device is synchronised.

Example::

    cost = measure_cost_curve(backend, rows=(1, 2, 4, 8), contexts=(128,), reps=3)
    cost.cost(6, context_len=128)   # interpolated ms for 6 rows
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np

from draftwise.core.backend import Backend, SamplingVerifier
from draftwise.core.costmodel import CostModel
from draftwise.core.sampling import SamplingParams, recent_windows
from draftwise.core.tree import DraftTree
from draftwise.errors import DraftwiseError

DEFAULT_ROWS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_CONTEXTS = (256, 1024)


def measure_cost_curve(
    backend: Backend,
    rows: Sequence[int] = DEFAULT_ROWS,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    reps: int = 3,
    progress: Callable[[int, int], None] | None = None,
    meta: dict[str, str] | None = None,
    time_budget_s: float | None = None,
    need_logits: bool = False,
) -> CostModel:
    """Median verify ms for every (context, rows) pair; the cache is emptied after.

    ``need_logits``: time the sampling path's verify (as at temperature > 0: every row's
    logits brought to the host, or every row sampled on the device where the backend
    does that) instead of the greedy one (argmax only).

    ``time_budget_s`` bounds a first-use measurement on a slow device (mlx[cpu] takes
    seconds per wide verify): the first context is always measured whole, with fewer
    repeats (down to the warm-up alone) when the repeats would not fit; later contexts
    are measured only while time is left. ``None``: every point, ``reps`` times."""
    limit = backend.context_limit
    ctxs = sorted({min(c, limit - max(rows) - 1) for c in contexts})
    if reps < 1 or not rows or ctxs[0] < 1:
        raise DraftwiseError(f"cannot profile: reps={reps}, rows={list(rows)}, context limit {limit}")
    rng = np.random.default_rng(0)
    tokens = rng.integers(100, min(backend.vocab_size, 20000), max(ctxs) + max(rows) + 1)
    table = np.zeros((len(ctxs), len(rows)))
    total, done = len(ctxs) * len(rows), 0
    deadline = None if time_budget_s is None else time.perf_counter() + time_budget_s
    measured = 0  # contexts fully measured
    try:
        for i, ctx in enumerate(ctxs):
            if i > 0 and deadline is not None and time.perf_counter() > deadline:
                break  # the first context's curve is enough to plan with
            backend.reset()
            backend.prefill(tokens[:ctx])
            for j, r in enumerate(rows):
                tree = DraftTree.chain(tokens[ctx + 1 : ctx + r].tolist())
                step = _step(backend, tree, int(tokens[ctx]), need_logits, tokens[:ctx])
                t0 = time.perf_counter()
                step()  # warm-up
                warm = [(time.perf_counter() - t0) * 1e3]
                n = reps
                if deadline is not None:
                    left = deadline - time.perf_counter()
                    n = min(reps, int(left * 1e3 / max(warm[0], 1e-3) / (len(rows) - j)))
                times = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    step()
                    times.append((time.perf_counter() - t0) * 1e3)
                table[i, j] = statistics.median(times or warm)
                done += 1
                if progress is not None:
                    progress(done, total)
            measured = i + 1
    finally:
        backend.reset()
    if progress is not None and done < total:
        progress(total, total)  # the skipped contexts: close the bar
    return CostModel(rows, table[:measured], ctxs[:measured], meta)


def _step(
    backend: Backend, tree: DraftTree, root: int, need_logits: bool, context: np.ndarray
) -> Callable[[], object]:
    """One timed verify of ``tree``: the greedy one, or what sampling runs per step."""
    if need_logits and isinstance(backend, SamplingVerifier) and backend.device_sampling:
        params = SamplingParams(temperature=1.0, top_p=0.95)  # the full per-row work
        recent = recent_windows(
            np.concatenate([context, [root]]), tree.tokens, tree.parents, tree.depth,
            params.repetition_context,
        )
        u = np.full(len(tree) + 1, 0.5)
        return lambda: backend.verify_sampled(root, tree, params, u, recent)
    return lambda: backend.verify(root, tree, need_logits=need_logits)
