"""Measuring a backend's verify cost curve, in full or within a time budget."""

from __future__ import annotations

import time

import numpy as np

from draftwise.core.costprofile import measure_cost_curve
from tests.fakes import FakeBackend, SlowFake


def test_full_curve_grows_with_rows():
    be = SlowFake(vocab_size=128, context_limit=512)
    cost = measure_cost_curve(be, rows=(1, 4, 16), contexts=(64, 128), reps=1)
    assert cost.ms.shape == (2, 3) and (np.diff(cost.ms, axis=1) > 0).all()
    assert be.cache_len == 0


def test_time_budget_keeps_the_first_context_and_fewer_repeats():
    be = SlowFake(vocab_size=128, context_limit=512)
    done: list[tuple[int, int]] = []
    t0 = time.perf_counter()
    cost = measure_cost_curve(be, rows=(1, 4, 16), contexts=(64, 128), reps=50,
                              time_budget_s=0.05, progress=lambda d, t: done.append((d, t)))
    took = time.perf_counter() - t0
    assert cost.ms.shape == (1, 3) and cost.contexts.tolist() == [64.0]  # second context skipped
    assert took < 1.0  # 50 repeats of every point would take ~3.6 s
    assert (np.diff(cost.ms[0]) > 0).all() and done[-1] == (6, 6)  # the bar is closed
    assert float(cost.cost(8, context_len=500)) > 0  # plans at any context


class LogitsCostly(FakeBackend):
    """Bringing logits to the host costs 1 ms per row; sampling on the device 0.2 ms."""

    device_sampling = False

    def verify(self, root, tree, need_logits):  # type: ignore[no-untyped-def]
        self.calls.append(("verify", need_logits))
        time.sleep(0.001 * (len(tree) + 1) if need_logits else 0.0)
        return super().verify(root, tree, need_logits)

    def verify_sampled(self, root, tree, params, u, recent):  # type: ignore[no-untyped-def]
        self.calls.append(("sampled", recent.shape == (len(tree) + 1, params.repetition_context)))
        time.sleep(0.0002 * (len(tree) + 1))
        return super().verify(root, tree, True).argmax


def test_sampling_curve_times_what_sampling_runs():
    be = LogitsCostly(vocab_size=128, context_limit=512)
    be.calls = []
    greedy = measure_cost_curve(be, rows=(1, 16), contexts=(64,), reps=1)
    assert set(be.calls) == {("verify", False)}
    be.calls = []
    host = measure_cost_curve(be, rows=(1, 16), contexts=(64,), reps=1, need_logits=True)
    assert set(be.calls) == {("verify", True)} and host.ms[0, 1] > greedy.ms[0, 1] + 10
    be.device_sampling, be.calls = True, []
    dev = measure_cost_curve(be, rows=(1, 16), contexts=(64,), reps=1, need_logits=True)
    assert set(be.calls) == {("sampled", True)} and dev.ms[0, 1] < host.ms[0, 1]
