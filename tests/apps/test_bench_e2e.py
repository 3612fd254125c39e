"""`draftwise bench` end to end on the real default model (slow: minutes on a busy CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.torch]
pytest.importorskip("torch")
pytest.importorskip("matplotlib")

PROMPTS = [
    {"id": "qa-1", "category": "qa", "turns": ["Who wrote the play Hamlet?"]},
    {"id": "qa-2", "category": "qa", "turns": ["What is the capital of France?"]},
    {"id": "w-1", "category": "writing", "turns": ["Write a haiku.", "Another one."]},
]


def test_bench_writes_four_files(default_model_dir: Path, tmp_path: Path) -> None:
    from matplotlib.image import imread

    from draftwise.apps.bench.records import read_results

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps(r) for r in PROMPTS) + "\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text("{}")  # an older run's plain records: replaced
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "draftwise",
            "bench",
            "--prompts",
            str(prompts),
            "--limit",
            "1",
            "--categories",
            "qa",
            "--max-tokens",
            "8",
            "--drafters",
            "none,cacheback,cacheback:budget=2,redrafter:bw=2,t=3",
            "--peers",
            "hf,llama.cpp",
            "--reference-dtype",
            "float32",
            "--backend",
            "torch",
            "--no-progress",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert r.returncode == 0, r.stderr
    for name in ("results.json.gz", "results.md", "speedup.png", "accept_hist.png"):
        assert (out / name).is_file(), name
    assert not (out / "results.json").exists()
    for name in ("speedup.png", "accept_hist.png"):
        img = imread(out / name)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    res = read_results(out)
    assert res["complete"] is True
    recs = res["records"]
    methods = sorted(x["method"] for x in recs if x["method"] != "llama.cpp")
    assert methods == [
        "cacheback", "cacheback:budget=2", "hf", "none", "none@float32", "redrafter:bw=2,t=3"
    ]
    # llama.cpp runs when llama-cpp-python is installed, else it is skipped with the reason
    assert "llama.cpp" in {x["method"] for x in recs} or "llama.cpp" in res["skipped_peers"]
    assert all(x["prompt_id"] == "qa-1" and 0 < x["tokens"] <= 8 for x in recs)
    assert all(x["identical"] for x in recs if x["kind"] == "drafter")  # lossless
    # the float32 reference of a float32 run: plain decoding again, the same tokens
    ref = next(x for x in recs if x["method"] == "none@float32")
    assert ref["kind"] == "reference" and ref["identical"] and res["config"]["reference"] == "none@float32"
    # The tree size used per step is recorded; a per-method budget caps it.
    trees = {x["method"]: x["tree_sizes"] for x in recs}
    assert set(trees["none"]) == {0} and max(trees["cacheback:budget=2"]) <= 2
    assert max(trees["cacheback"]) > 2  # the shipped frozen table fills more of the 16-node budget
    rows = {r["method"]: r for r in res["summary"] if r["category"] == "overall"}
    assert rows["none"]["tree_per_step"] == 0 and rows["hf"]["tree_per_step"] is None
    # a beam drafter's beam width x length is recorded per step and averaged per row
    rd = next(x for x in recs if x["method"] == "redrafter:bw=2,t=3")
    assert rd["beams"] and len(rd["beams"]) == rd["steps"] and {tuple(b) for b in rd["beams"]} <= {
        (2, 3), (0, 0)
    }
    assert 0 < rows["redrafter:bw=2,t=3"]["beam_width_per_step"] <= 2
    assert rows["cacheback"]["beam_width_per_step"] is None
    assert all(rows[m]["speedup_vs_reference"] > 0 for m in ("none", "cacheback", "hf"))
    md = (out / "results.md").read_text()
    assert "| cacheback |" in md and "prefill included" in md and "vs reference" in md
    assert "| beam bw x t |" in md
