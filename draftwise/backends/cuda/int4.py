"""4-bit weights for the torch backend on CPU: the ``4bit`` mode's linear layers.

A weight is ``scale * (code - 8) + zero`` per block of 32 inputs (``backends/gguf_q4.py``):
a Q4_0 / Q4_1 / Q4_K GGUF's own codes, exactly, or, for a model with no GGUF, round-to-nearest
codes between each block's min and max (what ``mlx_lm.convert -q`` does, with groups of
32: a slightly different model). The matmul is torch's ``_weight_int4pack_mm_for_cpu``:
bfloat16 activations and scales, the weights dequantised in float32 inside the kernel. It
reads a quarter of float32's bytes, and measured on this project's CPU (AMD EPYC,
avx512_bf16, 2 threads) all the block linears of SmolLM2-135M cost 3.4 ms for one row
against bfloat16 ``F.linear``'s 11.8 (4 rows 4.4 vs 11.9; 16 rows 13.8 vs 15.7).

Row invariance (the batch-invariant mode relies on it): the kernel computes each output
element with the same arithmetic whatever the number of rows; ``tests/backends/cuda/
test_int4.py`` checks rows 1..64 on the model's shapes.

Example::

    w = Int4Weight.from_codes(codes, scale, zero)     # codes (N, K) uint8, scale (N, K/32)
    y = w(x)                                           # x (T, K) bfloat16 -> (T, N)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from draftwise.backends.gguf_q4 import GROUP, Q4
from draftwise.errors import DraftwiseError

N_MULTIPLE = 16  # torch's CPU int4 packing takes output rows 16 at a time


def int4_available() -> bool:
    """Whether this torch has the CPU 4-bit kernel (torch >= 2.5)."""
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


@dataclass
class Int4Weight:
    """A packed 4-bit linear weight (no bias): ``w(x)`` is ``x @ W^T``. ``repeat`` > 1: the
    codes span ``repeat`` copies of the input (a Q8_0 head split into two 4-bit halves,
    ``gguf_q4.split_q8``), so ``w(x)`` reads ``[x, x]`` and sums in float32."""

    packed: torch.Tensor  # (N, K / 2) uint8, torch's CPU int4 layout
    scales_zeros: torch.Tensor  # (K / 32, N, 2) bfloat16
    out_features: int
    in_features: int  # K: repeat x the input size
    repeat: int = 1

    @classmethod
    def from_codes(
        cls, codes: np.ndarray, scale: np.ndarray, zero: np.ndarray, repeat: int = 1
    ) -> Int4Weight:
        """From codes (N, K) in 0..15 and per-block ``scale``, ``zero`` (N, K / 32)."""
        n, k = codes.shape
        if k % GROUP or scale.shape != (n, k // GROUP) or zero.shape != scale.shape:
            raise DraftwiseError(
                f"4-bit weight needs codes (N, K) with K a multiple of {GROUP} and "
                f"(N, K/{GROUP}) scales, got {codes.shape} and {scale.shape}"
            )
        pad = (-n) % N_MULTIPLE  # the kernel packs N in multiples of 16: zero rows after
        if pad:
            codes = np.concatenate([codes, np.full((pad, k), 8, codes.dtype)])
            scale = np.concatenate([scale, np.zeros((pad, k // GROUP), scale.dtype)])
            zero = np.concatenate([zero, np.zeros((pad, k // GROUP), zero.dtype)])
        c = torch.from_numpy(np.ascontiguousarray(codes, np.int32))  # (N', K)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(c, 1)  # (N', K/2)
        sz = np.stack([scale, zero], axis=-1).transpose(1, 0, 2)  # (K/32, N', 2)
        sz_t = torch.from_numpy(np.ascontiguousarray(sz, np.float32)).to(torch.bfloat16)
        return cls(packed, sz_t.contiguous(), n, k, repeat)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(T, K / repeat) bfloat16 -> (T, N) bfloat16."""
        if self.repeat > 1:
            x = x.repeat(1, self.repeat)  # (T, K)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, GROUP, self.scales_zeros)
        return y if y.shape[1] == self.out_features else y[:, : self.out_features]  # (T, N)


Weight = torch.Tensor | Int4Weight


def linear(x: torch.Tensor, w: Weight, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` for a dense or a 4-bit weight. (T, K) -> (T, N)."""
    if isinstance(w, Int4Weight):
        y = w(x)
        return y if b is None else y + b
    return F.linear(x, w, b)


def quantize_rtn(w: torch.Tensor) -> Q4:
    """Round-to-nearest 4-bit codes of a dense (N, K) weight, per block of 32 inputs
    between the block's min and max (asymmetric, as GGUF's Q4_1): codes, scale, zero."""
    n, k = w.shape
    if k % GROUP:
        raise DraftwiseError(f"4bit needs input sizes that are multiples of {GROUP}, got {k}")
    b = w.detach().float().reshape(n, k // GROUP, GROUP).numpy()  # (N, B, 32)
    lo, hi = b.min(axis=2), b.max(axis=2)  # (N, B)
    scale = (hi - lo) / np.float32(15)
    safe = np.where(scale > 0, scale, np.float32(1))
    codes = np.clip(np.rint((b - lo[..., None]) / safe[..., None]), 0, 15).astype(np.uint8)
    return codes.reshape(n, k), scale.astype(np.float32), (lo + 8 * scale).astype(np.float32)


def fuse_q4(parts: list[Q4]) -> Q4:
    """Stack several weights' codes along the output rows (q/k/v, gate/up)."""
    return (
        np.concatenate([p[0] for p in parts]),
        np.concatenate([p[1] for p in parts]),
        np.concatenate([p[2] for p in parts]),
    )
