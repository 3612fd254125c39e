"""The torch backend's default mode: the CPU-flag rule, the measured pick, and its record."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

import draftwise.api as api  # noqa: E402
from draftwise.backends.cuda import modes  # noqa: E402
from draftwise.drafting.assets import record_mode, recorded_mode  # noqa: E402


def test_default_dtype_follows_the_bf16_flags(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(modes, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    assert modes.default_dtype(cpu) == "bfloat16"
    assert modes.default_dtype(cuda) == "float32"
    monkeypatch.setattr(modes, "cpu_flags", lambda: frozenset({"avx2", "amx_bf16"}))
    assert modes.default_dtype(cpu) == "bfloat16"
    monkeypatch.setattr(modes, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    assert modes.default_dtype(cpu) == "float32"


def test_the_compiled_4bit_kernel_makes_4bit_the_default_for_a_gguf_model(monkeypatch, default_model_dir):
    """Without bf16 instructions (an AVX2-only CPU) the compiled kernel's AVX2 path still
    makes the Q4 GGUF's own codes the fastest lossless mode; without it, float32."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(modes, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    monkeypatch.setattr(modes, "exact_4bit", lambda model_dir, device: True)
    monkeypatch.setattr(modes, "native_4bit", lambda: True)
    assert modes.default_dtype(cpu, default_model_dir) == "4bit"
    monkeypatch.setattr(modes, "native_4bit", lambda: False)
    assert modes.default_dtype(cpu, default_model_dir) == "float32"
    monkeypatch.setattr(modes, "exact_4bit", lambda model_dir, device: False)
    monkeypatch.setattr(modes, "native_4bit", lambda: True)
    assert modes.default_dtype(cpu, default_model_dir) == "float32"  # not a Q4 GGUF's model


def test_pick_mode_takes_the_cheaper_plain_step_plus_tree():
    ms = {"float32": {1: 30.0, 8: 90.0}, "bfloat16-invariant": {1: 35.0, 8: 45.0}}
    assert modes.pick_mode(ms) == "bfloat16-invariant"
    ms["float32"] = {1: 20.0, 8: 40.0}
    assert modes.pick_mode(ms) == "float32"
    with pytest.raises(ValueError):
        modes.pick_mode({})


def test_record_round_trip_and_a_corrupt_record_is_ignored(tmp_path):
    assert recorded_mode("cpu|X|x2", root=tmp_path) is None
    path = record_mode("cpu|X|x2", {"dtype": "bfloat16", "invariant": True}, root=tmp_path)
    record_mode("cpu|Y|x1", {"dtype": "float32", "invariant": False}, root=tmp_path)
    assert recorded_mode("cpu|X|x2", root=tmp_path) == {"dtype": "bfloat16", "invariant": True}
    assert json.loads(path.read_text())["cpu|Y|x1"]["dtype"] == "float32"
    assert not list(path.parent.glob("*.tmp"))  # written atomically
    path.write_text("{not json")
    assert recorded_mode("cpu|X|x2", root=tmp_path) is None
    path.write_text(json.dumps({"cpu|X|x2": {"dtype": 3}}))
    assert recorded_mode("cpu|X|x2", root=tmp_path) is None


def test_load_honours_a_recorded_mode(monkeypatch, default_model_dir):
    import draftwise.drafting.assets as assets

    record = {"dtype": "float32", "invariant": True}
    monkeypatch.setattr(assets, "recorded_mode", lambda key: record)
    m = api.load(default_model_dir, backend="torch")
    assert m.backend.device_info().dtype == "float32"
    assert m.backend.device_info().mode == "invariant"
    # a record naming a mode that is not lossless here (float32 without the mode on a
    # CPU, as records before 2026-11-29 could) is ignored: the rule applies
    stale = {"dtype": "float32", "invariant": False}
    monkeypatch.setattr(assets, "recorded_mode", lambda key: stale)
    info = api.load(default_model_dir, backend="torch").backend.device_info()
    assert info.mode == "invariant"
    assert info.dtype == modes.default_dtype(torch.device("cpu"), default_model_dir)
    monkeypatch.setattr(assets, "recorded_mode", lambda key: None)
    monkeypatch.setattr(modes, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    m = api.load(default_model_dir, backend="torch")
    # the default model comes from a Q4_1 GGUF: 4bit computes with its own weights
    want = "4bit" if modes.exact_4bit(default_model_dir, torch.device("cpu")) else "bfloat16"
    assert (m.backend.device_info().dtype, m.backend.device_info().mode) == (want, "invariant")
    # an explicit dtype always wins over the record and the rule
    m = api.load(default_model_dir, backend="torch", dtype="float32")
    assert m.backend.device_info().dtype == "float32"


def test_4bit_is_the_default_only_where_it_is_exact(monkeypatch, tmp_path):
    """A model not converted from a Q4 GGUF never gets 4bit by default (it would round
    the weights): not from the flag rule, not from a recorded 4bit choice."""
    import draftwise.drafting.assets as assets
    from tests.backends.cuda.test_torch_backend import _save_tiny

    cpu = torch.device("cpu")
    model_dir, _ = _save_tiny(tmp_path / "m", "llama")
    assert not modes.exact_4bit(model_dir, cpu)
    assert modes.lossless_modes(model_dir, cpu) == modes.CPU_LOSSLESS_MODES
    monkeypatch.setattr(modes, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    assert modes.default_dtype(cpu, model_dir) == "bfloat16"
    monkeypatch.setattr(assets, "recorded_mode", lambda key: {"dtype": "4bit", "invariant": True})
    assert api._recorded_torch_mode("auto", model_dir) == (None, "auto")
    # asked for by name, 4bit rounds any model's weights (as mlx-lm's 4-bit conversion)
    from draftwise.backends.cuda import TorchBackend

    be = TorchBackend.from_pretrained(model_dir, dtype="4bit", device="cpu", max_cache_len=64)
    assert be.name == "torch-cpu-4bit-invariant"
    # the source record the converter writes makes a GGUF's codes exact
    (model_dir / "source.json").write_text(json.dumps({"gguf": str(tmp_path / "gone.gguf")}))
    assert not modes.exact_4bit(model_dir, cpu)  # the file is gone: not exact
