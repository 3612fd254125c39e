"""scripts/bench_headroom.py: its measured columns must be the bench's own (the same
definitions on the same records), and its what-ifs the arithmetic it says: a method at the
MAT it names for a target reaches that target."""

from dataclasses import asdict

import pytest

from draftwise.apps.bench.metrics import mark_identical, summarize
from draftwise.apps.bench.records import BASELINE, DRAFTER, TurnRecord
from tests.scripts import load_script


def _mod():
    return load_script("bench_headroom")


def _rec(method, kind, pid, tokens, steps, wall, prefill, draft_ms, verify_ms):
    return TurnRecord(method, kind, pid, "qa", 1, 10, tokens, steps, [1] * steps, wall, prefill,
                      wall - prefill, draft_ms, verify_ms, "length", list(range(tokens)))


def _records():
    """Two turns; the drafter twice as many tokens a step, drafting 1 ms and other host
    work 0.5 ms a step, the baseline 0.1 ms of other host work a step."""
    recs = []
    for pid, tokens, prefill in (("a", 100, 0.05), ("b", 60, 0.02)):
        recs.append(_rec("none", BASELINE, pid, tokens, tokens, prefill + tokens * 4.1e-3,
                         prefill, 0.0, tokens * 4.0))
        steps = tokens // 2
        recs.append(_rec("d", DRAFTER, pid, tokens, steps, prefill + steps * 6.5e-3, prefill,
                         steps * 1.0, steps * 5.0))
    return recs


def test_the_measured_columns_are_the_bench_summary_of_the_same_records():
    recs = _records()
    mark_identical(recs)
    row = next(r for r in summarize(recs) if r.method == "d" and r.category == "overall")
    got = _mod().headroom({"records": [asdict(r) for r in recs]}, "none", [1.5])[0]
    assert got["speedup"] == pytest.approx(row.speedup)
    assert got["median"] == pytest.approx(row.speedup_median)
    assert got["decode"] == pytest.approx(row.decode_speedup)
    assert got["mat"] == pytest.approx(row.mat)
    assert got["draft_ms"] == pytest.approx(1.0) and got["other_ms"] == pytest.approx(0.5)
    assert got["base_other_ms"] == pytest.approx(0.1) and got["identical"] == 2


def test_free_drafting_takes_the_drafting_out_of_every_turn():
    recs = [asdict(r) for r in _records()]
    got = _mod().headroom({"records": recs}, "none", [1.5])[0]
    lean = [dict(r, wall_s=r["wall_s"] - r["draft_ms"] / 1e3) if r["method"] == "d" else r
            for r in recs]
    again = _mod().headroom({"records": lean}, "none", [1.5])[0]
    assert got["free_draft"] == pytest.approx(again["speedup"])
    # and with the extra host work gone too (steps of 5.0 + the baseline's 0.1 ms)
    assert got["free_host"] > got["free_draft"] > got["speedup"]


@pytest.mark.parametrize("target", [1.2, 1.5, 2.0])
def test_at_the_mat_it_names_a_method_reaches_the_target(target):
    mod = _mod()
    recs = [asdict(r) for r in _records()]
    got = mod.headroom({"records": recs}, "none", [target])[0]
    need, _ = got["needed"][target]
    k = got["mat"] / need  # every turn's steps x k at the same per-step cost
    scaled = []
    for r in recs:
        if r["method"] == "d":
            step = (r["wall_s"] - r["prefill_s"]) / r["steps"]
            r = dict(r, wall_s=r["prefill_s"] + k * r["steps"] * step)
        scaled.append(r)
    again = mod.headroom({"records": scaled}, "none", [target])[0]
    assert again["speedup"] == pytest.approx(target)


def test_a_target_beyond_the_prefill_alone_has_no_mat():
    """Turns whose prefill takes longer than the target allows the whole turn."""
    mod = _mod()
    assert mod.mat_needed([0.9], [10], [0.01], [100], [(100, 1.0)], 1.2) is None
    got = mod.mat_needed([0.2], [50], [0.012], [100], [(100, 1.0)], 1.5)
    assert got == pytest.approx(2.5714, abs=1e-3)


def test_an_unknown_baseline_is_a_one_line_error():
    with pytest.raises(SystemExit, match="no records of the baseline 'x'"):
        _mod().headroom({"records": [asdict(r) for r in _records()]}, "x", [1.5])
