"""``training/distill.py``: new training data is computed in bfloat16 only where the CPU
has bf16 instructions, and greedy shards keep the dtype they were made in (the shards
themselves: tests/backends/cuda/redrafter/test_redrafter_net.py and
tests/apps/test_train_drafter.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from draftwise.errors import DraftwiseError  # noqa: E402
from draftwise.training import distill  # noqa: E402


@pytest.mark.parametrize(
    "flags, want",
    [({"avx2", "avx512_bf16"}, "bfloat16"), ({"avx2", "amx_bf16"}, "bfloat16"),
     ({"avx2", "fma"}, "float32")],
)
def test_new_data_takes_bfloat16_only_where_the_cpu_computes_it(monkeypatch, flags, want):
    from draftwise.backends.cuda import modes

    monkeypatch.setattr(modes, "cpu_flags", lambda: frozenset(flags))
    assert distill.data_dtype() == getattr(torch, want)


def test_new_data_on_a_gpu_takes_bfloat16(monkeypatch):
    from draftwise.backends.cuda import modes

    monkeypatch.setattr(modes, "cpu_flags", lambda: frozenset({"avx2"}))
    assert distill.data_dtype("cuda") == torch.bfloat16
    assert distill.shards_dtype(Path("/nonexistent"), "cuda") == torch.bfloat16


def test_greedy_shards_keep_the_dtype_they_were_made_in(monkeypatch, tmp_path):
    from draftwise.backends.cuda import modes

    monkeypatch.setattr(modes, "cpu_flags", lambda: frozenset({"avx2"}))
    assert distill.shards_dtype(tmp_path) == torch.float32  # none yet: this CPU's
    meta = tmp_path / "data.json"
    meta.write_text(json.dumps({"batch": 4}))  # made before the dtype was recorded
    assert distill.shards_dtype(tmp_path) == torch.bfloat16
    meta.write_text(json.dumps({"batch": 4, "dtype": "float32"}))
    assert distill.shards_dtype(tmp_path) == torch.float32
    meta.write_text(json.dumps({"dtype": "int8"}))
    with pytest.raises(DraftwiseError, match="records dtype 'int8'"):
        distill.shards_dtype(tmp_path)
