"""A model directory is user input: a config whose sizes do not fit its tensors, or are
out of range, is refused in one line (naming the tensor, its shape and the expected one)
before anything is built or packed; never an out-of-bounds read in a kernel."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from draftwise.backends.cuda.llama import LlamaConfig, read_llama_config  # noqa: E402
from draftwise.errors import DraftwiseError  # noqa: E402
from tests.backends.cuda.test_torch_backend import _save_tiny  # noqa: E402


def with_config(src: Path, dst: Path, **changes) -> Path:
    """A copy of model directory ``src`` (files linked) whose config has ``changes``."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "config.json":
            (dst / f.name).symlink_to(f.resolve())
    cfg = json.loads((src / "config.json").read_text()) | changes
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_a_config_that_does_not_fit_its_tensors_names_the_tensor(tmp_path):
    import draftwise

    src, _ = _save_tiny(tmp_path / "tiny", "llama")
    bad = with_config(src, tmp_path / "bad", head_dim=32)  # 64 / 4 heads = 16 in the tensors
    with pytest.raises(DraftwiseError) as e:
        draftwise.load(bad, backend="torch", dtype="float32")
    msg = str(e.value)
    assert "\n" not in msg
    assert "model.layers.0.self_attn.q_proj.weight" in msg and "(64, 64)" in msg and "(128, 64)" in msg


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"hidden_size": -64}, "hidden_size must be an integer in 1.."),
        ({"num_attention_heads": 0}, "num_attention_heads must be an integer in 1.."),
        ({"vocab_size": 10**12}, "vocab_size must be an integer in 1.."),
        ({"num_hidden_layers": "2"}, "num_hidden_layers must be an integer"),
        ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
        ({"hidden_size": 66, "head_dim": None}, "hidden_size 66 is not a multiple of num_attention_heads 4"),
        ({"head_dim": 15}, "head_dim 15 must be even"),
    ],
)
def test_config_sizes_are_bounded_and_fit_together(tmp_path, changes, needle):
    src, _ = _save_tiny(tmp_path / "tiny", "llama")
    bad = with_config(src, tmp_path / "bad", **changes)
    with pytest.raises(DraftwiseError, match="config.json: ") as e:
        read_llama_config(bad)
    assert needle in str(e.value)


def test_a_valid_config_still_loads(tmp_path):
    src, _ = _save_tiny(tmp_path / "tiny", "qwen2")
    cfg = read_llama_config(src)
    assert isinstance(cfg, LlamaConfig) and cfg.head_dim == 16


@pytest.mark.slow
def test_the_default_model_with_head_dim_80(default_model_dir, tmp_path):
    """The issue's case: 4bit mode, a one-token prompt (no torch prefill to fail first)."""
    import draftwise

    bad = with_config(default_model_dir, tmp_path / "hd80", head_dim=80)
    with pytest.raises(DraftwiseError, match=r"q_proj.weight' has shape \(576, 576\), the config implies \(720, 576\)"):
        draftwise.load(bad)
    exe = shutil.which("draftwise", path=str(Path(sys.executable).parent))
    out = subprocess.run(
        [exe, "generate", "--model", str(bad), "--prompt", "a", "--max-tokens", "2"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "the config implies (720, 576)" in out.stderr
