"""float32 linear weights through the compiled AVX2 matmul (``csrc/f32.c``).

On a CPU with AVX2 and FMA, torch's float32 matmul of a few rows can run far below the
hardware: measured on an AMD EPYC Zen 1 (AVX2 only),
2 threads (``tests/backends/cuda/test_f32.py`` checks the bits, the README the speed), a
(3072, 576) weight took 364 / 734 / 1360 / 1982 us at 1 / 2 / 4 / 16 rows in torch and
66 / 116 / 166 / 749 us here; the (49152, 576) head 9.7 / 18.5 / 31.0 / 46.0 ms against
3.9 / 4.9 / 5.7 / 13.5 ms (at 1 row the time the weight takes to stream from memory).
So the float32 mode verifies a tree of 4 to 8 rows for little more than one row. On an
AMD EPYC Zen 4 (AVX-512, avx512_bf16) the whole float32 verify at context 256 took 59.0 /
97.7 / 93.6 / 105.1 / 124.6 / 162.4 ms at 1 / 2 / 4 / 8 / 16 / 32 rows with torch's matmul
and 23.4 / 25.5 / 26.7 / 36.3 / 44.9 / 76.0 ms with this kernel (``profile_forward``).

The kernel computes each output element as one chain of fused multiply-adds in input order,
whatever the rows: row-invariant, so a row's matmul outputs are the same alone or in a
tree (the batch-invariant mode then needs no padding rows; its attention is invariant too).
Its sums differ from torch's in the last bits (another order), so the choice is made once
per process (``native.f32_lib()``: by default wherever the kernel exists;
``DRAFTWISE_F32_KERNEL=0`` keeps torch's matmul) and every float32 weight of the process
takes it.

Example::

    w = F32Weight.from_dense(torch.randn(960, 576))    # packed (60, 576, 16)
    y = w(torch.randn(4, 576))                         # (4, 960) float32
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from draftwise.backends.cuda.cpu import native
from draftwise.errors import DraftwiseError

TILE = 16  # outputs per packed tile


def available(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether float32 weights on ``device`` take the compiled kernel in this process
    (``native.f32_lib()``: by default on any CPU with AVX2 and FMA)."""
    return dtype == torch.float32 and device.type == "cpu" and native.f32_lib() is not None


def pack(w: torch.Tensor) -> torch.Tensor:
    """A dense (N, K) weight into the kernel's (ceil(N / 16), K, 16) float32 tiles (rows
    past N are zeros).

    Example: ``pack(torch.ones(20, 3)).shape == (2, 3, 16)``."""
    n, k = w.shape
    pad = (-n) % TILE
    w = w.detach().to(torch.float32)
    if pad:
        w = torch.cat([w, w.new_zeros((pad, k))])  # (N', K)
    return w.view(-1, TILE, k).transpose(1, 2).contiguous()  # (N' / 16, K, 16)


@dataclass
class F32Weight:
    """A packed float32 linear weight (no bias): ``w(x)`` is ``x @ W^T``."""

    packed: torch.Tensor  # (N' / 16, K, 16) float32
    out_features: int
    in_features: int
    lib: ctypes.CDLL

    @classmethod
    def from_dense(cls, w: torch.Tensor) -> F32Weight:
        """From a dense (N, K) float CPU weight (copied; ``w`` may be freed after)."""
        lib = native.f32_kernel()
        if lib is None:
            raise DraftwiseError(
                "the native float32 kernel is not available here (no C compiler, no AVX2/FMA, "
                "or DRAFTWISE_NATIVE=0)"
            )
        if w.dim() != 2 or w.device.type != "cpu":
            raise DraftwiseError(
                f"a float32 weight must be a 2-D CPU tensor, got {tuple(w.shape)} on {w.device}"
            )
        return cls(pack(w), int(w.shape[0]), int(w.shape[1]), lib)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    def rows(self, n: int) -> F32Weight:
        """The first ``n`` output rows (a cut head), sharing this weight's tiles (no copy).

        Example: ``F32Weight.from_dense(w).rows(20)(x)`` equals ``x @ w[:20].T``."""
        if not 1 <= n <= self.out_features:
            raise DraftwiseError(f"rows must be in 1..{self.out_features}, got {n}")
        return F32Weight(self.packed[: -(-n // TILE)], n, self.in_features, self.lib)

    def data_ptr(self) -> int:
        """The packed storage's address (shared weights share it, as a tensor's would)."""
        return self.packed.data_ptr()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(..., K) float32 -> (..., N) float32."""
        lead = x.shape[:-1]
        y = native.native_f32_mm(self.lib, x.reshape(-1, self.in_features), self.packed)
        if y.shape[1] != self.out_features:
            y = y[:, : self.out_features]  # (T, N)
        return y.reshape(*lead, self.out_features)
