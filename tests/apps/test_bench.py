"""`draftwise bench` without a model: prompt files, metric arithmetic, identity, the run
loop on a fake method, the report and the charts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftwise.apps.bench.metrics import OVERALL, mark_identical, summarize
from draftwise.apps.bench.prompts import BenchItem, read_prompts, select_items
from draftwise.apps.bench.records import BASELINE, DRAFTER, PEER, TurnRecord, TurnResult
from draftwise.apps.bench.report import render_markdown
from draftwise.apps.bench.runner import BenchConfig, Chat, run_bench
from draftwise.apps.cli import main as cli_main
from draftwise.errors import DraftwiseError

ROWS = [
    {"id": "w1", "category": "writing", "turns": ["Write a poem.", "Make it shorter."]},
    {"id": "q1", "category": "qa", "turns": ["Who?"]},
    {"id": "q2", "category": "qa", "turns": ["What?"]},
    {"id": "q3", "category": "qa", "turns": ["Where?"]},
]


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n")
    return path


def rec(
    method: str,
    kind: str,
    pid: str,
    cat: str,
    wall: float,
    lengths: list[int],
    ids: list[int] | None = None,
    turn: int = 1,
    pass_no: int = 1,
    prefill: float = 0.0,
) -> TurnRecord:
    n = sum(lengths)
    res = TurnResult(
        token_ids=ids if ids is not None else list(range(n)),
        wall_s=wall,
        prefill_s=prefill,
        accept_lengths=lengths if kind != PEER else [],
        draft_ms=None if kind == PEER else 1.0 * len(lengths),
        verify_ms=None if kind == PEER else 10.0 * len(lengths),
    )
    return TurnRecord.from_result(
        res,
        method=method,
        kind=kind,
        prompt_id=pid,
        category=cat,
        turn=turn,
        prompt_tokens=5,
        pass_no=pass_no,
    )


# -- prompt files ---------------------------------------------------------------------------


def test_read_filter_limit(prompts: Path) -> None:
    items = read_prompts(prompts)
    assert [i.id for i in items] == ["w1", "q1", "q2", "q3"]
    assert items[0].turns == ("Write a poem.", "Make it shorter.")
    assert [i.id for i in select_items(items, ["qa"], 2)] == ["q1", "q2"]
    assert [i.id for i in select_items(items, None, 1)] == ["w1", "q1"]
    assert [i.id for i in select_items(items, ["writing", "qa"], None)] == ["w1", "q1", "q2", "q3"]


def test_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(DraftwiseError, match="prompts file not found: .*nope.jsonl"):
        read_prompts(tmp_path / "nope.jsonl")


@pytest.mark.parametrize(
    "bad, needle",
    [
        ("{not json", "not valid JSON"),
        ('{"id": "x", "category": "qa"}', "missing field 'turns'"),
        ('{"id": "x", "category": "qa", "turns": []}', "'turns' must be"),
        ("[1, 2]", "expected a JSON object"),
        ('{"id": "q1", "category": "qa", "turns": ["dup"]}', "duplicate id 'q1'"),
    ],
)
def test_bad_line_names_file_and_line(prompts: Path, bad: str, needle: str) -> None:
    prompts.write_text(prompts.read_text().rstrip("\n") + "\n" + bad + "\n")
    with pytest.raises(DraftwiseError) as exc:
        read_prompts(prompts)
    msg = str(exc.value)
    assert f"{prompts}:5:" in msg and needle in msg and "\n" not in msg


def test_unknown_category_and_bad_limit(prompts: Path) -> None:
    items = read_prompts(prompts)
    with pytest.raises(DraftwiseError, match="unknown category 'code' .*qa, writing"):
        select_items(items, ["code"], None)
    with pytest.raises(DraftwiseError, match="--limit must be >= 1, got 0"):
        select_items(items, None, 0)


# -- metrics ----------------------------------------------------------------------------------


def test_speedup_mat_and_step_times() -> None:
    # baseline: 10 tokens in 1 s (qa) and 10 tokens in 2 s (writing): 10 and 5 tok/s
    # drafter:  10 tokens in 0.5 s and 10 tokens in 0.5 s: 20 and 20 tok/s
    records = [
        rec("none", BASELINE, "q", "qa", 1.0, [1] * 10),
        rec("none", BASELINE, "w", "writing", 2.0, [1] * 10),
        rec("cb", DRAFTER, "q", "qa", 0.5, [4, 4, 2]),
        rec("cb", DRAFTER, "w", "writing", 0.5, [3, 3, 3, 1]),
    ]
    mark_identical(records)
    rows = {(r.category, r.method): r for r in summarize(records)}
    assert rows[("qa", "cb")].speedup == pytest.approx(2.0)
    assert rows[("writing", "cb")].speedup == pytest.approx(4.0)
    overall = rows[(OVERALL, "cb")]
    assert overall.tokens_per_s == pytest.approx(20.0)
    assert overall.speedup == pytest.approx(20.0 / 7.5)  # mean tok/s ratio, not mean of ratios
    assert overall.speedup_median == pytest.approx(3.0)  # median of per-turn ratios 2 and 4
    assert overall.mat == pytest.approx(20 / 7)
    assert overall.draft_ms_per_step == pytest.approx(1.0)
    assert overall.verify_ms_per_step == pytest.approx(10.0)
    assert rows[(OVERALL, "none")].speedup == pytest.approx(1.0)
    assert rows[(OVERALL, "none")].mat == pytest.approx(1.0)
    assert [r.category for r in summarize(records)][-1] == OVERALL


def test_decode_speedup_leaves_prefill_out() -> None:
    records = [
        rec("none", BASELINE, "q", "qa", 2.0, [1] * 10, prefill=1.0),
        rec("cb", DRAFTER, "q", "qa", 1.5, [5, 5], prefill=1.0),
    ]
    mark_identical(records)
    row = [r for r in summarize(records) if r.method == "cb"][0]
    assert row.speedup == pytest.approx(2.0 / 1.5)
    assert row.decode_speedup == pytest.approx(2.0)


def test_identical_finds_planted_mismatch() -> None:
    records = [
        rec("none", BASELINE, "q", "qa", 1.0, [1] * 4, ids=[1, 2, 3, 4]),
        rec("none", BASELINE, "q", "qa", 1.0, [1] * 3, ids=[5, 6, 7], turn=2),
        rec("cb", DRAFTER, "q", "qa", 1.0, [2, 2], ids=[1, 2, 3, 4]),
        rec("cb", DRAFTER, "q", "qa", 1.0, [2, 1], ids=[5, 9, 7], turn=2),  # planted
        rec("hf", PEER, "q", "qa", 1.0, [4], ids=[1, 2, 30, 4]),  # same text, other ids
    ]
    decode = lambda ids: "".join("x" if t in (3, 30) else str(t) for t in ids)  # noqa: E731
    mark_identical(records, decode)
    assert [r.identical for r in records] == [True, True, True, False, True]
    rows = {r.method: r for r in summarize(records) if r.category == OVERALL}
    assert (rows["cb"].identical, rows["cb"].identical_rate) == (1, 0.5)
    assert rows["hf"].mat is None and rows["hf"].draft_ms_per_step is None


# -- the run loop on a fake method ------------------------------------------------------------


class FakeTokenizer:
    has_chat_template = True

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        return [len(m["content"]) for m in messages]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return " ".join(map(str, ids))


class FakeMethod:
    kind = DRAFTER

    def __init__(self, name: str, walls: list[float]) -> None:
        self.name, self.walls, self.resets, self.prompts = name, list(walls), 0, []

    def reset_state(self) -> None:
        self.resets += 1

    def generate(self, ids: list[int], max_tokens: int) -> TurnResult:
        self.prompts.append(ids)
        wall = self.walls.pop(0) if self.walls else 1.0
        return TurnResult(
            token_ids=[7] * max_tokens, wall_s=wall, prefill_s=0.0, accept_lengths=[max_tokens]
        )


def test_multi_turn_history_and_resets() -> None:
    m = FakeMethod("cb", [])
    items = [BenchItem("w", "writing", ("abc", "de")), BenchItem("q", "qa", ("xyz",))]
    records = run_bench([m], items, Chat(FakeTokenizer()), BenchConfig(max_tokens=2))
    assert [(r.prompt_id, r.turn) for r in records] == [("w", 1), ("w", 2), ("q", 1)]
    # turn 2 sees turn 1, the method's own answer ("7 7"), then the new turn
    assert m.prompts[1:4] == [[3], [3, 3, 2], [3]]
    assert m.resets == 1 + 2  # after the warm-up, then before each prompt


def test_repeats_keep_median_and_lifetime_passes() -> None:
    m = FakeMethod("cb", [9.0, 3.0, 1.0, 2.0])  # warm-up, then three repeats
    item = [BenchItem("q", "qa", ("xyz",))]
    (r,) = run_bench([m], item, Chat(FakeTokenizer()), BenchConfig(max_tokens=2, repeats=3))
    assert r.wall_s == 2.0 and r.wall_s_repeats == [3.0, 1.0, 2.0]
    m = FakeMethod("cb", [])
    recs = run_bench([m], item, Chat(FakeTokenizer()), BenchConfig(max_tokens=2, lifetime=True))
    assert [x.pass_no for x in recs] == [1, 2] and m.resets == 1  # only after the warm-up


# -- report, charts, flags --------------------------------------------------------------------


def test_report_and_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    from draftwise.apps.bench.plots import plot_accept_hist, plot_speedup

    records = [
        rec("none", BASELINE, "q", "qa", 1.0, [1] * 10),
        rec("cb", DRAFTER, "q", "qa", 0.5, [4, 4, 2]),
        rec("hf", PEER, "q", "qa", 0.8, [10]),
    ]
    mark_identical(records)
    rows = summarize(records)
    md = render_markdown(
        {
            "config": {},
            "summary": [r.to_json() for r in rows],
            "skipped_peers": {"mlx-lm": "not installed"},
        }
    )
    assert "| cb | 1 | 10 | 20.0 | 2.00x |" in md and "mlx-lm: not installed" in md
    plot_speedup(rows, tmp_path / "speedup.png")
    plot_accept_hist(records, tmp_path / "accept_hist.png")
    for name in ("speedup.png", "accept_hist.png"):
        assert imread(tmp_path / name).ndim == 3
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temp files


def test_records_are_gzipped_and_read_back_old_folders_too(tmp_path: Path) -> None:
    import gzip

    from draftwise.apps.bench.records import read_results, results_path
    from draftwise.apps.bench.report import write_json_gz

    data = {"complete": True, "summary": [], "records": [{"method": "none", "text": "é"}]}
    new, old = tmp_path / "new", tmp_path / "old"
    new.mkdir()
    old.mkdir()
    write_json_gz(new / "results.json.gz", data)
    assert json.loads(gzip.decompress((new / "results.json.gz").read_bytes())) == data
    assert read_results(new) == data and not list(new.glob(".*.tmp"))
    before = (new / "results.json.gz").read_bytes()
    write_json_gz(new / "results.json.gz", data)  # no timestamp: the same data, the same bytes
    assert (new / "results.json.gz").read_bytes() == before
    (old / "results.json").write_text(json.dumps(data, indent=1))  # a folder from before gzip
    assert read_results(old) == data and results_path(old) == old / "results.json"
    with pytest.raises(FileNotFoundError, match="no results.json.gz or results.json"):
        read_results(tmp_path)


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--peers", "vllm"], "unknown peer 'vllm'"),
        (["--drafters", "none,bogus"], "unknown drafter 'bogus'"),
        (["--lifetime", "--repeats", "2"], "--repeats must be 1 with --lifetime"),
        (["--peers", "hf", "--temp", "0.7"], "--peers run greedy"),
        (["--categories", "code"], "unknown category 'code'"),
        (["--limit", "0"], "--limit must be >= 1, got 0"),
        (["--drafters", "none,card@x"], "'@' must be followed by a thread count"),
        (["--drafters", "none,bogus@1"], "unknown drafter 'bogus'"),
    ],
)
def test_cli_flag_errors(
    prompts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    rc = cli_main(["bench", "--prompts", str(prompts), "--out", str(tmp_path / "o"), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0]


def test_cli_missing_prompts_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["bench", "--prompts", str(tmp_path / "none.jsonl"), "--out", str(tmp_path)])
    assert rc == 2 and "none.jsonl" in capsys.readouterr().err


def test_method_order_rotates() -> None:
    from draftwise.apps.bench.runner import rotated

    a, b = FakeMethod("a", []), FakeMethod("b", [])
    order: list[str] = []
    for m in (a, b):
        m.generate = lambda ids, n, name=m.name: (
            order.append(name) or TurnResult([1], 1.0, 0.0, [1])
        )  # type: ignore[method-assign]
    items = [BenchItem("q1", "qa", ("x",)), BenchItem("q2", "qa", ("y",))]
    run_bench([a, b], items, Chat(FakeTokenizer()), BenchConfig(max_tokens=1))
    assert order == ["a", "b", "a", "b", "b", "a"]  # warm-up, prompt 1, prompt 2 (rotated)
    assert [m.name for m in rotated([a, b], 3)] == ["b", "a"]


def test_thread_split_methods_set_their_threads_and_record_the_layout() -> None:
    """``name@N`` runs the model with N threads for that method, the others with the
    default; the layout (threads, CARD's worker) is what the bench records."""
    import types

    from draftwise.apps.bench.report import _layout_lines
    from draftwise.apps.bench.runner import DraftwiseMethod, split_threads

    assert split_threads("card:layers=8,correct=false@1") == ("card:layers=8,correct=false", 1)
    calls: list[int] = []
    card = types.SimpleNamespace(layout="draft worker: own thread, torch 1 thread(s), cpu",
                                 stats=lambda: {"forwards": 3, "hits": 1, "misses": 2})
    model = types.SimpleNamespace(
        backend=types.SimpleNamespace(name="torch-cpu-float32"),
        set_threads=calls.append,
        drafter=lambda spec: card if spec.startswith("card") else object(),
    )
    seq = DraftwiseMethod(model, "draft:layers=8", {}, default_threads=2)
    par = DraftwiseMethod(model, "card:layers=8,threads=1@1", {}, default_threads=2)
    assert (seq.spec, seq.threads, par.spec, par.threads) == (
        "draft:layers=8", 2, "card:layers=8,threads=1", 1)
    assert par.layout() == {"model_threads": 1, "draft_worker": card.layout}
    assert seq.layout() == {"model_threads": 2, "draft_worker": None}
    assert par.stats() == {"forwards": 3, "hits": 1, "misses": 2} and seq.stats() == {}
    lines = _layout_lines({m.name: m.layout() for m in (seq, par)})
    assert "`card:layers=8,threads=1@1`: model 1 thread(s), draft worker" in lines[1]
    assert DraftwiseMethod(model, "none", {}).threads is None  # no split asked: untouched
