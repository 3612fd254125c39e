"""Hugging Face Hub names as ``--model``: resolved from a hub cache laid out on disk
(``models--ORG--NAME/snapshots/<commit>/``), offline, in the CLI, ``draftwise.load`` and
``draftwise.mlx_lm.load``; a download only where allowed; an unknown name is one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from draftwise.errors import DraftwiseError
from draftwise.models.hub import is_hub_name, resolve_hub
from draftwise.models.resolve import resolve_model

pytest.importorskip("huggingface_hub")
COMMIT = "0123456789abcdef0123456789abcdef01234567"
FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json", "chat_template.jinja")


def hub_cache(root: Path, repo: str, model_dir: Path) -> Path:
    """The layout huggingface_hub writes: refs/main names the commit of a snapshot."""
    base = root / f"models--{repo.replace('/', '--')}"
    snap = base / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text(COMMIT)
    for name in FILES:
        if (model_dir / name).exists():
            (snap / name).symlink_to((model_dir / name).resolve())
    return snap


@pytest.fixture
def cache(tmp_path, monkeypatch, default_model_dir):
    root = tmp_path / "hub"
    snap = hub_cache(root, "acme/smol-135m", default_model_dir)
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return snap


@pytest.mark.parametrize(
    "text, want",
    [("Qwen/Qwen2.5-1.5B-Instruct", True), ("mlx-community/Llama-3.2-1B-Instruct-4bit", True),
     ("a/b/c", False), ("/abs/path", False), ("./x/y", False), ("org/..", False), ("name", False)],
)
def test_what_counts_as_a_hub_name(text, want):
    assert is_hub_name(text) is want


def test_a_cached_name_resolves_offline(cache):
    assert resolve_model("acme/smol-135m") == cache
    assert resolve_hub("acme/smol-135m", download=False) == cache


def test_an_unknown_name_is_one_line(cache):
    with pytest.raises(DraftwiseError) as e:
        resolve_model("acme/nothing-here")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("model not found: 'acme/nothing-here'")
    assert "downloads are off" in msg


def test_a_download_only_where_allowed(tmp_path, monkeypatch):
    """Not cached: ``download=False`` never asks the Hub; allowed, it asks for the model's
    files only, and a missing repository is one line."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError

    calls = []

    class Missing(RepositoryNotFoundError):  # what the Hub answers for an unknown name
        def __init__(self) -> None:
            Exception.__init__(self, "404 Client Error: Repository Not Found")

    def fake(repo_id, **kw):
        calls.append(kw)
        if kw.get("local_files_only"):
            raise LocalEntryNotFoundError("not cached")
        raise Missing()

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(DraftwiseError, match="downloads are off"):
        resolve_hub("acme/x", download=False)
    assert [c["local_files_only"] for c in calls] == [True]
    with pytest.raises(DraftwiseError, match=r"^model not found: 'acme/x' \(no such model on the Hugging Face Hub"):
        resolve_hub("acme/x")
    assert calls[-1].get("local_files_only", False) is False
    assert "*.safetensors" in calls[-1]["allow_patterns"] and "*.bin" not in calls[-1]["allow_patterns"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    calls.clear()
    with pytest.raises(DraftwiseError, match="downloads are off"):
        resolve_hub("acme/x")
    assert [c["local_files_only"] for c in calls] == [True]


@pytest.mark.slow
def test_load_and_mlx_lm_load_take_a_hub_name(cache):
    pytest.importorskip("torch")
    import draftwise
    from draftwise import mlx_lm

    model = draftwise.load("acme/smol-135m", backend="torch", dtype="float32", download=False)
    assert model.model_dir == cache
    assert draftwise.generate(model, "Say hello.", max_tokens=4)
    m2, tok = mlx_lm.load("acme/smol-135m", backend="torch", dtype="float32")
    assert m2.model_dir == cache and tok.encode("hi")


@pytest.mark.slow
def test_the_cli_takes_a_hub_name_and_no_download(cache, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.delenv("HF_HUB_OFFLINE")  # --no-download alone keeps it offline
    base = [sys.executable, "-m", "draftwise", "generate", "--no-download", "--dtype", "float32",
            "--max-tokens", "4", "--prompt", "Say hello."]
    ok = subprocess.run([*base, "--model", "acme/smol-135m"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip()
    bad = subprocess.run([*base, "--model", "acme/unknown"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "model not found: 'acme/unknown'" in bad.stderr
