"""The fused forward (``csrc/forward.c``) written out eagerly, one torch op at a time.

``eager_forward`` computes what ``FusedForward.__call__`` computes, with the same compiled
matmul and attention kernels but every norm, RoPE, SwiGLU, rounding and residual add as
separate float32 torch ops in the order ``forward.c`` performs them, so the two must agree
bit for bit: ``tests/backends/cuda/test_fused.py`` checks logits, hidden states and the
K/V cache. It is the readable reference of the compiled path (and the test that its C
glue, slots and offsets are right), not a path the backend decodes with: it is ~80 ops a
layer slower.

Example::

    last_x, xn = eager_forward(model.fused, tokens, positions, start, plan, n_write)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from draftwise.backends.cuda.cpu.bounds import check_cache, check_slots, check_write
from draftwise.backends.cuda.cpu.native import kernel_threads, native_int4_mm

if TYPE_CHECKING:
    from draftwise.backends.cuda.cpu.fused import FusedForward, NativePlan

LANES = 16
F32 = torch.float32


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded float32 square root, as C's ``sqrtf``: torch's vectorised float32
    sqrt is off by an ulp now and then (measured), the float64 one rounded to float32 is
    exact (double has more than 2 x 24 + 2 bits)."""
    return torch.sqrt(x.double()).to(F32)


def _rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """forward.c's rms_norm: 16-lane sums of squares in order, lanes combined pairwise.
    (T, C) float32 -> (T, C) bfloat16."""
    t, c = x.shape
    sq = (x * x).view(t, c // LANES, LANES)  # (T, C/16, 16)
    acc = torch.zeros(t, LANES, dtype=F32)
    for i in range(c // LANES):
        acc = acc + sq[:, i]
    w2 = LANES // 2
    while w2:
        acc = torch.cat([acc[:, :w2] + acc[:, w2 : 2 * w2], acc[:, 2 * w2 :]], dim=1)
        w2 //= 2
    ss = acc[:, :1]  # (T, 1)
    r = torch.tensor(1.0, dtype=F32) / _sqrt(ss / torch.tensor(float(c), dtype=F32) + torch.tensor(eps, dtype=F32))
    y = (x * r).to(torch.bfloat16).to(F32)
    return (w.to(F32) * y).to(torch.bfloat16)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """(T, n, D) bfloat16 heads -> float32: x cos + rotate_half(x) sin, no fused multiply-add."""
    xf = x.to(F32)
    half = xf.shape[-1] // 2
    rot = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return xf * cos[:, None] + rot * sin[:, None]


def _exp16(x: torch.Tensor) -> torch.Tensor:
    """vec.h's dw_exp16, op for op."""
    f = lambda v: torch.tensor(v, dtype=F32)  # noqa: E731
    x = torch.maximum(x, f(-87.0))
    shift = f(12582912.0)
    n = (x * f(1.44269504088896341) + shift) - shift
    r = x - n * f(0.693359375)
    r = r - n * f(-2.12194440e-4)
    p = f(1.9875691500e-4).expand_as(x)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * r + f(c)
    p = ((p * r) * r + r) + f(1.0)
    scale = ((n.to(torch.int32) + 127) << 23).view(F32)
    return p * scale


def _swiglu(gu: torch.Tensor, f: int) -> torch.Tensor:
    """(T, 2F) bfloat16 -> (T, F) bfloat16: silu(gate) * up as forward.c's swiglu."""
    g, u = gu[:, :f].to(F32), gu[:, f:].to(F32)
    e = _exp16(torch.zeros((), dtype=F32) - g.abs())
    inv = torch.tensor(1.0, dtype=F32) / (torch.tensor(1.0, dtype=F32) + e)
    sig = torch.where(g < 0, inv * e, inv)
    return ((g * sig) * u).to(torch.bfloat16)


def eager_forward(
    fused: FusedForward,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    start: int,
    plan: NativePlan,
    n_write: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """What ``fused(tokens, positions, start, plan, n_write)`` returns (and writes to the
    cache), one op at a time. (last_x, xn): (T, C) bfloat16 each."""
    m, cfg, lib = fused.model, fused.model.cfg, fused.lib
    t = tokens.shape[0]
    h, hkv, d, f = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
    cos, sin = fused._cos[positions], fused._sin[positions]  # (T, D) float32
    scale = torch.tensor(1.0, dtype=F32) / _sqrt(torch.tensor(float(d), dtype=F32))
    x = m.embed[tokens].to(torch.bfloat16).to(F32)  # (T, C) residual
    extra, n_extra = plan.extra, plan.n_extra
    check_cache("cache", m.cache, 5)  # dw_attention_kv reads it by these sizes
    if tuple(m.cache.shape[2:]) != (hkv, m.cache.shape[3], d):
        raise ValueError(f"cache of shape {tuple(m.cache.shape)} for {hkv} heads of size {d}")
    check_write(start, n_write, m.cache.shape[3], rows=t)
    check_slots(extra, n_extra, t, m.cache.shape[3], plan.committed)
    for li, layer in enumerate(m.layers):
        kv = m.cache[li]  # (2, H_kv, T_max, D)
        hn = _rms_norm(x, fused._norms[0][li], cfg.norm_eps)
        qkv = native_int4_mm(lib, hn, layer.wqkv.packed)  # (T, (H + 2 H_kv) D)
        q = _rope(qkv[:, : h * d].view(t, h, d), cos, sin) * scale  # (T, H, D)
        k = _rope(qkv[:, h * d : (h + hkv) * d].view(t, hkv, d), cos, sin)  # (T, H_kv, D)
        v = qkv[:, (h + hkv) * d :].view(t, hkv, d).to(F32)
        # into the cache's dtype: a bfloat16 cache rounds the rotated key to nearest even
        # and holds the value as the projection gave it (as forward.c)
        kv[0, :, start : start + n_write] = k[:n_write].transpose(0, 1)
        kv[1, :, start : start + n_write] = v[:n_write].transpose(0, 1)
        o = torch.empty(t, h, d, dtype=F32)
        q = q.contiguous()
        if lib.dw_attention_kv(
            q.data_ptr(), kv.data_ptr(), int(kv.dtype == torch.bfloat16), kv.shape[2], h, hkv, d,
            plan.committed,
            extra.data_ptr(), n_extra.data_ptr(), t, extra.shape[1], o.data_ptr(),
            kernel_threads(),
        ):  # fmt: skip
            raise MemoryError("native attention could not allocate its buffers")
        a = native_int4_mm(lib, o.view(t, h * d).to(torch.bfloat16), layer.wo.packed)
        x = x + a.to(F32)
        hn = _rms_norm(x, fused._norms[1][li], cfg.norm_eps)
        act = _swiglu(native_int4_mm(lib, hn, layer.w13.packed), f)  # (T, F)
        x = x + native_int4_mm(lib, act, layer.w2.packed).to(F32)
    return x.to(torch.bfloat16), _rms_norm(x, fused._final, cfg.norm_eps)
