"""GGUF -> HF conversion: reuse, locking, atomicity and fidelity of the converted weights."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from draftwise.errors import DraftwiseError
from draftwise.models import convert as convert_mod
from draftwise.models import convert_gguf, ensure_default_model
from draftwise.models.default import default_gguf_path


def test_converted_files(default_model_dir: Path) -> None:
    names = {p.name for p in default_model_dir.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    } <= names
    tok_config = json.loads((default_model_dir / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_config["chat_template"]
    assert not list(default_model_dir.parent.glob(".SmolLM2-135M-Instruct.tmp-*"))


def test_second_call_reuses(default_model_dir: Path) -> None:
    messages: list[str] = []
    weights = default_model_dir / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    start = time.perf_counter()
    assert ensure_default_model(progress=messages.append) == default_model_dir
    assert time.perf_counter() - start < 0.5
    assert messages == []
    assert weights.stat().st_mtime_ns == mtime


def test_fast_path_imports_no_torch(default_model_dir: Path) -> None:
    code = (
        "import sys; from draftwise.models import resolve_model; resolve_model(None); "
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "False"]


def test_plain_safetensors_reader(default_model_dir: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(default_model_dir / "model.safetensors"), framework="numpy") as f:
        keys = set(f.keys())
        assert "model.embed_tokens.weight" in keys
        assert "lm_head.weight" not in keys
        assert str(f.get_tensor("model.norm.weight").dtype) == "float32"


@pytest.mark.torch
def test_same_logits_as_gguf(default_model_dir: Path) -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    gguf = default_gguf_path()
    ref = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    ours = AutoModelForCausalLM.from_pretrained(default_model_dir)
    assert ours.dtype == torch.float32
    assert ours.lm_head.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor([[1, 4093, 198, 19556, 28, 638, 359, 346, 47, 2, 198]])
    with torch.no_grad():
        expected = ref(ids).logits
        got = ours(ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def _fake_writer(calls: list[int]):  # type: ignore[no-untyped-def]
    def write(source: Path, out: Path) -> None:
        calls.append(1)
        time.sleep(0.3)
        (out / "config.json").write_text("{}")

    return write


def test_concurrent_conversions_run_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTWISE_CACHE_DIR", str(tmp_path / "cache"))
    calls: list[int] = []
    monkeypatch.setattr(convert_mod, "_write_hf_dir", _fake_writer(calls))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(convert_gguf(gguf, lambda m: None)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(set(results)) == 1 and (results[0] / "config.json").is_file()
    assert [p.name for p in results[0].parent.iterdir() if ".tmp-" in p.name] == []
    # the converted directory names its GGUF: the 4bit mode reads the codes from it
    from draftwise.backends.gguf_q4 import gguf_source

    assert gguf_source(results[0]) == gguf.resolve()


def test_failed_conversion_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTWISE_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "bad.gguf"
    gguf.write_bytes(b"not a gguf file at all" * 10)
    messages: list[str] = []
    with pytest.raises(DraftwiseError, match="cannot convert GGUF file"):
        convert_gguf(gguf, messages.append)
    assert messages and "converting bad.gguf" in messages[0]
    models = tmp_path / "cache" / "models"
    assert [p.name for p in models.iterdir() if not p.name.endswith(".lock")] == []


def test_missing_gguf_file(tmp_path: Path) -> None:
    with pytest.raises(DraftwiseError, match="GGUF file not found"):
        convert_gguf(tmp_path / "nope.gguf")


def test_changed_gguf_gets_new_name(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    first = convert_mod.gguf_cache_name(gguf)
    gguf.write_bytes(b"GGUF-v2")
    assert convert_mod.gguf_cache_name(gguf) != first


def test_default_cache_from_before_gets_its_source_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A default-model cache converted before ``source.json`` existed gets it on the next
    load, so the 4bit mode finds the GGUF's codes; nothing is converted again."""
    from draftwise.backends.gguf_q4 import gguf_source
    from draftwise.models.default import DEFAULT_MODEL_NAME

    monkeypatch.setenv("DRAFTWISE_CACHE_DIR", str(tmp_path / "cache"))
    old = tmp_path / "cache" / "models" / DEFAULT_MODEL_NAME
    old.mkdir(parents=True)
    (old / "config.json").write_text("{}")
    assert gguf_source(old) is None
    assert ensure_default_model() == old
    assert gguf_source(old) == default_gguf_path().resolve()
    assert sorted(p.name for p in old.iterdir()) == ["config.json", "source.json"]
