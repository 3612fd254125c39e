"""``training/distill.py``: the teacher-forced data's dtype follows the CPU's bf16
instructions (the shards themselves: tests/backends/cuda/redrafter/test_redrafter_net.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from draftwise.training import distill  # noqa: E402


@pytest.mark.parametrize(
    "flags, want",
    [({"avx2", "avx512_bf16"}, "bfloat16"), ({"avx2", "amx_bf16"}, "bfloat16"), ({"avx2", "fma"}, "float32")],
)
def test_the_forced_forward_takes_bfloat16_only_where_the_cpu_computes_it(monkeypatch, flags, want):
    import draftwise.core.device as device

    monkeypatch.setattr(device, "cpu_flags", lambda: frozenset(flags))
    assert distill.forced_dtype() == getattr(torch, want)
