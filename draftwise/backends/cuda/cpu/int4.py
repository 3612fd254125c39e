"""4-bit weights for the torch backend on CPU: the ``4bit`` mode's linear layers.

A weight is ``scale * (code - 8) + zero`` per block of 32 inputs (``backends/gguf_q4.py``):
a Q4_0 / Q4_1 / Q4_K GGUF's own codes, exactly, or, for a model with no GGUF, round-to-nearest
codes between each block's min and max (what ``mlx_lm.convert -q`` does, with groups of
32: a slightly different model).

Two kernels, one chosen per process (``native.int4_lib()``):

- **native** (a C compiler, and a CPU with avx512_bf16 and avx512_vnni, or AVX2, FMA and
  F16C): ``csrc/int4.c``.
  Each row's activations are quantised per block of 32 to int8 with one float scale (as
  llama.cpp's Q8_1 for a Q4_1 weight), multiplied by the codes in exact int32 sums
  (``vpdpbusd``), and the per-block float16 scale and min applied in float32. A Q8_0 head
  handed over as ``split_q8``'s two 4-bit halves is recognised and multiplied as Q8_0 the
  same way. Each weight tile is unpacked once for up to 8 rows, so extra rows cost dot
  products only: measured on the AMD EPYC Zen 5 VM (2 threads, the default model's 120
  4-bit matmuls in sequence) 1.22 / 1.41 / 1.96 / 3.79 ms at 1 / 4 / 8 / 16 rows, against
  1.30 / 2.01 / 3.23 / 5.39 with the bfloat16 dot products (``vdpbf16ps``) it used before.
  On a CPU with AVX2, FMA and F16C but not AVX-512 VNNI the same kernel takes ``vpmaddubsw``
  products (4 rows a pass) and gives the same bits; on an AMD EPYC Zen 3 (2026-11-27) the
  120 matmuls took about 5 / 6 / 11 / 22 ms at 1 / 4 / 8 / 16 rows.
- **torch**: ``_weight_int4pack_mm_for_cpu``: bfloat16 scales, the weights dequantised in
  float32 inside the kernel, cost linear in the rows past 4.

Both read a quarter of float32's bytes. Row invariance (the batch-invariant mode relies on
it): each kernel computes each output element with the same arithmetic whatever the
number of rows; ``tests/backends/cuda/test_int4.py`` checks rows 1..64 on the model's
shapes, for each kernel.

Example::

    w = Int4Weight.from_codes(codes, scale, zero)     # codes (N, K) uint8, scale (N, K/32)
    y = w(x)                                           # x (T, K) bfloat16 -> (T, N)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from draftwise.backends.cuda.cpu import native
from draftwise.backends.cuda.cpu.f32 import F32Weight
from draftwise.backends.gguf_q4 import GROUP, Q4
from draftwise.errors import DraftwiseError

N_MULTIPLE = 16  # both kernels take output rows 16 at a time
FP16_MAX = 65504.0


def int4_available() -> bool:
    """Whether a CPU 4-bit kernel is here: the compiled one or torch's (torch >= 2.5)."""
    return native.int4_lib() is not None or hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")


def pack_native(codes: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> torch.Tensor:
    """Codes (N, K) in 0..15, ``scale``, ``zero`` (N, K / 32), N a multiple of 16, into
    ``csrc/int4.c``'s tiles: (N / 16, K / 32, 320) uint8, each 256 bytes of codes (byte
    4 i + e of 64-byte group g: output i, input 8 g + e in the low nibble, 8 g + 4 + e in
    the high one), 16 float16 scales, 16 float16 mins (``zero - 8 scale``).

    Example: ``pack_native(np.full((16, 32), 8, np.uint8), s, z).shape == (1, 1, 320)``."""
    n, k = codes.shape
    nt, nb = n // 16, k // GROUP
    c = codes.astype(np.uint8).reshape(nt, 16, nb, 4, 2, 4)  # (tile, i, block, g, half, e)
    c = c.transpose(0, 2, 3, 4, 1, 5).reshape(nt, nb, 4, 2, 64)  # (tile, block, g, half, p)
    nibbles = (c[:, :, :, 0] | (c[:, :, :, 1] << 4)).reshape(nt, nb, 256)
    mins = zero.astype(np.float64) - 8.0 * scale.astype(np.float64)
    parts = [nibbles]
    for name, v in (("scale", scale.astype(np.float64)), ("min", mins)):
        if not np.all(np.isfinite(v)) or np.abs(v).max(initial=0.0) > FP16_MAX:
            raise DraftwiseError(f"4-bit {name}s must be finite and within float16's range (|x| <= {FP16_MAX:g})")
        h = np.ascontiguousarray(v.reshape(nt, 16, nb).transpose(0, 2, 1), np.float16)
        parts.append(h.view(np.uint8).reshape(nt, nb, 32))  # (tile, block, 16 x float16)
    return torch.from_numpy(np.ascontiguousarray(np.concatenate(parts, axis=-1)))


def q8_of_split(
    codes: np.ndarray, scale: np.ndarray, zero: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """The Q8_0 codes (N, K) int8 and scales (N, K / 32) behind ``gguf_q4.split_q8``'s two
    4-bit halves over ``[x, x]`` (codes (N, 2K)), or None when these are not such halves.

    Example: ``q8_of_split(*split_q8(q8, d))`` gives back ``(q8, d)``."""
    n, k2 = codes.shape
    if k2 % (2 * GROUP):
        return None
    k, b = k2 // 2, k2 // 2 // GROUP
    d = scale[:, b:]
    if not (
        np.array_equal(scale[:, :b], np.float32(16) * d)
        and not np.any(zero[:, :b])
        and np.array_equal(zero[:, b:], np.float32(8) * d)
    ):
        return None
    u = (codes[:, :k].astype(np.int16) << 4) | codes[:, k:]  # (N, K) in 0..255
    return (u - 128).astype(np.int8), d


def pack_q8(q8: np.ndarray, d: np.ndarray) -> torch.Tensor:
    """Q8_0 codes (N, K) int8 and scales (N, K / 32), N a multiple of 16, into
    ``csrc/int4.c``'s Q8 tiles: (N / 16, K / 32, 576) uint8, 8 groups of 64 codes (byte
    4 i + e of group p: output i, input 4 p + e), 16 float16 scales and 16 int16 code sums
    (the kernel takes 128 times a sum off its unsigned-by-signed products).

    Example: ``pack_q8(np.ones((16, 32), np.int8), np.ones((16, 1))).shape == (1, 1, 576)``."""
    n, k = q8.shape
    nt, nb = n // 16, k // GROUP
    q = q8.astype(np.int8).reshape(nt, 16, nb, 8, 4)  # (tile, i, block, p, e)
    codes = np.ascontiguousarray(q.transpose(0, 2, 3, 1, 4)).view(np.uint8).reshape(nt, nb, 512)
    sums = q.astype(np.int16).sum(axis=(3, 4)).transpose(0, 2, 1)  # (tile, block, i)
    sums = np.ascontiguousarray(sums, np.int16).view(np.uint8).reshape(nt, nb, 32)
    dd = d.astype(np.float64)
    if not np.all(np.isfinite(dd)) or np.abs(dd).max(initial=0.0) > FP16_MAX:
        raise DraftwiseError(f"Q8 scales must be finite and within float16's range (|x| <= {FP16_MAX:g})")
    h = np.ascontiguousarray(dd.reshape(nt, 16, nb).transpose(0, 2, 1), np.float16)
    scales = h.view(np.uint8).reshape(nt, nb, 32)
    return torch.from_numpy(np.ascontiguousarray(np.concatenate([codes, scales, sums], axis=-1)))


@dataclass
class Int4Weight:
    """A packed 4-bit linear weight (no bias): ``w(x)`` is ``x @ W^T``. ``repeat`` > 1: the
    codes span ``repeat`` copies of the input (a Q8_0 head split into two 4-bit halves,
    ``gguf_q4.split_q8``), so ``w(x)`` reads ``[x, x]`` and sums in float32."""

    packed: torch.Tensor  # torch: (N, K / 2) uint8, its CPU int4 layout; native: pack_native's
    scales_zeros: torch.Tensor  # torch: (K / 32, N, 2) bfloat16; native: empty
    out_features: int
    in_features: int  # K: repeat x the input size
    repeat: int = 1
    lib: Any = None  # the compiled kernel (native layout), or None (torch's)

    @classmethod
    def from_codes(
        cls,
        codes: np.ndarray,
        scale: np.ndarray,
        zero: np.ndarray,
        repeat: int = 1,
        kernel: str = "auto",
    ) -> Int4Weight:
        """From codes (N, K) in 0..15 and per-block ``scale``, ``zero`` (N, K / 32).
        ``kernel``: "native", "torch", or "auto" (native where ``native.int4_lib()`` has
        it: the same choice for every weight of a process)."""
        if kernel not in ("auto", "native", "torch"):
            raise DraftwiseError(f"4-bit kernel must be auto, native or torch, got {kernel!r}")
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
        lib = native.int4_lib() if kernel != "torch" else None
        if kernel == "native" and lib is None:
            raise DraftwiseError("the native 4-bit kernel is not available here (no C compiler, neither AVX-512 VNNI nor AVX2 and FMA, or DRAFTWISE_NATIVE=0)")
        if lib is not None:
            empty = torch.empty(0, dtype=torch.bfloat16)
            q8 = q8_of_split(codes, scale, zero) if repeat == 2 else None
            if q8 is not None:  # a split Q8_0 head: one dot product per code, not two
                return cls(pack_q8(*q8), empty, n, k // 2, 1, lib)
            return cls(pack_native(codes, scale, zero), empty, n, k, repeat, lib)
        c = torch.from_numpy(np.ascontiguousarray(codes, np.int32))  # (N', K)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(c, 1)  # (N', K/2)
        sz = np.stack([scale, zero], axis=-1).transpose(1, 0, 2)  # (K/32, N', 2)
        sz_t = torch.from_numpy(np.ascontiguousarray(sz, np.float32)).to(torch.bfloat16)
        return cls(packed, sz_t.contiguous(), n, k, repeat)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(T, K / repeat) bfloat16 -> (T, N) bfloat16."""
        if self.repeat > 1:
            x = x.repeat(1, self.repeat)  # (T, K)
        if self.lib is not None:
            y = native.native_int4_mm(self.lib, x, self.packed)  # (T, N')
            return y if y.shape[1] == self.out_features else y[:, : self.out_features]
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, GROUP, self.scales_zeros)
        return y if y.shape[1] == self.out_features else y[:, : self.out_features]  # (T, N)


Weight = torch.Tensor | Int4Weight | F32Weight


def linear(x: torch.Tensor, w: Weight, b: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` for a dense, a 4-bit or a packed float32 weight. (T, K) -> (T, N)."""
    if isinstance(w, (Int4Weight, F32Weight)):
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
