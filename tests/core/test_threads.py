"""The thread count re-chosen from the decoder's own step timings (``core/threads.py``):
it moves to one thread when two turn slow (a busy core), back when two are faster again,
probes rarely on a quiet machine, and never changes what is generated."""

from __future__ import annotations

import pytest

from draftwise.core.threads import ThreadTuner


def run(tuner: ThreadTuner, ms_of: dict[int, float], steps: int, rows: int = 1) -> list[int]:
    used = []
    for _ in range(steps):
        n = tuner.current()
        used.append(n)
        tuner.record(n, rows, ms_of[n])
    return used


def test_moves_to_one_thread_when_two_are_slow_and_back_when_they_are_fast():
    t = ThreadTuner((2, 1), probe_every=32, probe_len=4)
    run(t, {2: 2.4, 1: 3.6}, 40)  # quiet: two threads win the first probe
    assert t.best == 2 and t.switches == 0
    run(t, {2: 6.4, 1: 3.6}, 8)  # a busy core: slow steps trigger a probe at once
    assert t.best == 1 and t.switches == 1
    used = run(t, {2: 2.4, 1: 3.6}, 300)  # quiet again: the next regular probe wins
    assert t.best == 2 and t.switches == 2
    assert used.count(1) <= 32 + 8  # one regular interval at one thread, then back


def test_a_quiet_machine_probes_less_and_less():
    t = ThreadTuner((2, 1), probe_every=32, probe_len=4)
    used = run(t, {2: 2.4, 1: 3.6}, 2000)
    assert t.best == 2
    assert used.count(1) <= 4 * 10  # probes back off: then one every 256 steps
    assert used[-256:].count(1) <= 4


def test_bimodal_slow_steps_count_as_slow():
    """On a busy core two threads are sometimes fast, mostly slow: still a trigger."""
    t = ThreadTuner((2, 1), probe_every=1000, probe_len=4)
    for i in range(24):
        n = t.current()
        t.record(n, 1, (2.4 if i % 3 == 0 else 6.4) if n == 2 else 3.6)
    assert t.best == 1


def test_wide_steps_are_not_compared():
    t = ThreadTuner((2, 1), probe_every=8, probe_len=2)
    for _ in range(50):
        t.record(t.current(), 16, 100.0)  # 16-row verifies: not timed against 1-row ones
    assert t.best == 2 and not any(t.times.values())


def test_one_count_never_probes():
    t = ThreadTuner((1,))
    assert run(t, {1: 3.0}, 100) == [1] * 100
    with pytest.raises(ValueError):
        ThreadTuner(())


@pytest.mark.slow
@pytest.mark.serial  # two threads to switch between: alone on the machine (scripts/test.sh)
def test_switching_threads_every_step_changes_nothing_generated(default_model_dir, monkeypatch):
    """On the real default model (the fused 4bit forward): kernel and torch thread
    counts alternating 2, 1, 2, ... step by step give the same tokens as a fixed count,
    with and without drafting, greedy and seeded; torch's count is restored after."""
    torch = pytest.importorskip("torch")
    import draftwise

    model = draftwise.load(default_model_dir)
    if len(model.backend.thread_counts) < 2:
        pytest.skip("no fused 4bit forward or a single thread here")
    prompt = "Write a short story about a lighthouse keeper who finds a message in a bottle."

    def ids(drafter, **kw):
        return draftwise.generate(model, prompt, drafter=drafter, max_tokens=48, **kw)

    monkeypatch.setenv("DRAFTWISE_ADAPT_THREADS", "0")
    fixed = {d: ids(d) for d in ("none", "auto")}
    hot = ids("none", temp=0.8, seed=2)
    monkeypatch.delenv("DRAFTWISE_ADAPT_THREADS")
    before = torch.get_num_threads()
    flips = iter(range(10**6))
    monkeypatch.setattr(ThreadTuner, "current", lambda self: (2, 1)[next(flips) % 2])
    for d in ("none", "auto"):
        assert ids(d) == fixed[d], d
    assert ids("auto", temp=0.8, seed=2) == hot
    assert torch.get_num_threads() == before


@pytest.mark.slow
def test_a_count_set_by_the_caller_is_kept(default_model_dir):
    """``model.set_threads(1)`` (the bench's thread splits): nothing left to tune."""
    torch = pytest.importorskip("torch")
    import draftwise

    model = draftwise.load(default_model_dir)
    old = model.set_threads(1)
    try:
        draftwise.generate(model, "Say hello.", max_tokens=4, drafter="none")
        assert model.decoder.threads is None and torch.get_num_threads() == 1
    finally:
        model.set_threads(old)
