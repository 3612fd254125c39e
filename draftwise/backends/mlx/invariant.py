"""Batch-invariant verification on MLX: a row's logits do not depend on the other rows.

Plain decoding (a one-row ``verify``) and tree verification become two schedules of ONE
deterministic computation, so speculative output is bit-identical to plain output.

Measured on the Linux CPU (mlx 0.32.4, netlib reference BLAS for float32, MLX's own
``simd_gemm`` for float16/bfloat16; SmolLM2-135M shapes; ``/tmp/mlxinv/*.py`` in the
issue-10 report): row 0 of ``nn.Linear``, ``nn.QuantizedLinear`` (4-bit, group 64), the
tied (quantized) embedding's ``as_linear`` (lm_head), ``mx.fast.rms_norm`` and
``mx.fast.rope`` with a vector of offsets is bit-identical for M = 1 .. 257 rows, and the
CPU fallback of ``mx.fast.scaled_dot_product_attention`` is unchanged by extra query
rows, masked keys between visible ones and masked keys appended (float16, bfloat16,
float32; 11 .. 701 keys). So on that CPU even the normal mode is invariant, by the
accident of sequential reductions in those kernels. Neither holds by construction: a
fused CPU SDPA (online softmax, one kernel for one query row and another for several)
appears in MLX's repository (``mlx/backend/cpu/sdpa.cpp``), and on Metal (not measured
here) a one-row matmul is a gemv while a many-row one is a gemm.

This mode therefore does not rely on SDPA, and pads rows where that is not measured:

- attention is written out here, in float32 (``block_attention``): each row attends over
  its own *logical* key list (cache slots ``0 .. L-1``, then its tree ancestors and
  itself in depth order: exactly what a plain step at that position sees), cut into
  blocks of ``BLOCK`` logical positions. Blocks fully inside the committed cache are
  shared by all rows (one matmul); the rest (the "tail") is gathered per row and padded
  with masked keys at its end. Every block yields an exp-sum and a ``p @ V`` partial
  against the row's global max; the partials are summed over the block axis, to which
  trailing padding blocks add exact zeros. All measured invariant on the CPU.
- row-wise ops (projections, norms, RoPE, MLP, lm_head) need nothing on the CPU. On a GPU
  (not measured here) every forward runs exactly ``MAX_ROWS`` rows, padded with copies
  of its first row that write no K/V, so every matmul has one shape and one kernel.

Example::

    plan = make_plan(committed=40, rows=[[40], [40, 41]])
    o = block_attention(q, keys, values, plan, scale)   # (1, H, T, D) -> (1, T, H D) f32
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from draftwise.core.keyplan import BLOCK, key_blocks
from draftwise.errors import DraftwiseError

MAX_ROWS = 32  # rows per forward where rows are padded (GPU)
# Where "auto" turns the mode on: (gpu, dtype) pairs measured cheap. Plain decoding of
# SmolLM2-135M on a 2-core CPU (mlx 0.32.4), invariant vs normal time per token: float16
# +0..2% (its own SDPA runs float16 matmuls, as slow as this float32 attention),
# bfloat16 +4..9%, float32 +6%, 4bit +10%. Not measured on a GPU (there every forward
# would also be padded to MAX_ROWS rows).
INVARIANT_AUTO = frozenset({(False, "float16")})


def resolve_invariant(invariant: bool | str, gpu: bool, dtype: str) -> bool:
    """``True``/``False`` as given; ``"auto"``: on where it is measured cheap."""
    if invariant == "auto":
        return (gpu, dtype) in INVARIANT_AUTO
    if not isinstance(invariant, bool):
        raise DraftwiseError(f"invariant must be True, False or 'auto', got {invariant!r}")
    return invariant


def rows_per_forward(gpu: bool) -> int | None:
    """Rows every invariant forward is padded to (None: no padding, one forward)."""
    return MAX_ROWS if gpu else None


@dataclass(frozen=True)
class Plan:
    """Which keys each row attends to, split into shared blocks and a gathered tail."""

    shared: int  # keys in full blocks below the committed length: slots 0 .. shared-1
    tail_idx: mx.array  # (T, nT * BLOCK) int32 cache slots of the rest of each list
    tail_ok: mx.array  # (T, nT * BLOCK) bool, False = padding
    # sliding-window layers (gemma): keys in the row's window, shared (T, shared) and
    # tail (T, nT * BLOCK) bool; None: no such layers
    window: tuple[mx.array, mx.array] | None = None


def make_plan(
    committed: int, rows: Sequence[Sequence[int]],
    window: tuple[int, np.ndarray, np.ndarray] | None = None,
) -> Plan:
    """``rows[i]``: the cache slots at or after ``committed`` that row i sees (its tree
    ancestors and itself, in depth order); every row also sees slots ``0..committed-1``.
    ``window``: (W, the rows' positions (T,), every slot's position (S,)): a
    sliding-window layer's row at p sees a key at k when k > p - W."""
    shared, idx, ok = key_blocks(committed, rows, BLOCK)
    win = None
    if window is not None:
        w, row_pos, slot_pos = window
        low = np.asarray(row_pos, np.int64)[:, None] - w  # (T, 1)
        win = (mx.array(np.arange(shared)[None, :] > low), mx.array(np.asarray(slot_pos)[idx] > low))
    return Plan(shared, mx.array(idx.astype(np.int32)), mx.array(ok), win)


def block_attention(
    q: mx.array, keys: mx.array, values: mx.array, plan: Plan, scale: float,
    softcap: float | None = None, window: bool = False,
) -> mx.array:
    """Attention of ``q`` (1, H, T, D) over one layer's cache ``keys``/``values``
    (1, H_kv, T_alloc, D) following ``plan``; returns (1, T, H D) float32. ``softcap``
    (gemma2): scores become ``tanh(s / cap) * cap``, elementwise; ``window``: a
    sliding-window layer (the plan's window masks apply)."""
    _, h, t, d = q.shape
    hkv = keys.shape[1]
    rep = h // hkv  # query head j reads kv head j // rep
    f32 = mx.float32
    # Scale q first (elementwise), so the score matmuls are plain q @ K^T.
    qf = (q[0].astype(f32) * scale).reshape(hkv, rep, t, d)  # (H_kv, rep, T, D)
    k0, v0 = keys[0], values[0]  # (H_kv, T_alloc, D)
    kt = mx.take(k0, plan.tail_idx, axis=1).astype(f32)  # (H_kv, T, nT B, D)
    vt = mx.take(v0, plan.tail_idx, axis=1).astype(f32)  # (H_kv, T, nT B, D)
    st = qf.transpose(0, 2, 1, 3) @ kt.swapaxes(-1, -2)  # (H_kv, T, rep, nT B)
    if softcap is not None:
        st = mx.tanh(st / softcap) * softcap
    ok = plan.tail_ok
    if window and plan.window is not None:
        ok = ok & plan.window[1]
    st = mx.where(ok[None, :, None, :], st, -mx.inf)
    m = st.max(-1, keepdims=True)  # (H_kv, T, rep, 1)
    ns = plan.shared // BLOCK
    if ns:
        ks = k0[:, : plan.shared].astype(f32)  # (H_kv, S, D)
        vs = v0[:, : plan.shared].astype(f32).reshape(hkv, ns, BLOCK, d)  # (H_kv, nS, B, D)
        ss = qf.reshape(hkv, rep * t, d) @ ks.swapaxes(-1, -2)  # (H_kv, rep T, S)
        ss = ss.reshape(hkv, rep, t, plan.shared).transpose(0, 2, 1, 3)  # (H_kv, T, rep, S)
        if softcap is not None:
            ss = mx.tanh(ss / softcap) * softcap
        if window and plan.window is not None:
            ss = mx.where(plan.window[0][None, :, None, :], ss, -mx.inf)
        m = mx.maximum(m, ss.max(-1, keepdims=True))  # (H_kv, T, rep, 1)
    nt = st.shape[-1] // BLOCK
    et = mx.exp(st - m).reshape(hkv, t, rep, nt, BLOCK)  # (H_kv, T, rep, nT, B)
    lsum = et.sum(-1).transpose(3, 0, 1, 2)  # (nT, H_kv, T, rep)
    # (H_kv, T, nT, rep, B) @ (H_kv, T, nT, B, D) -> (nT, H_kv, T, rep, D)
    osum = (et.transpose(0, 1, 3, 2, 4) @ vt.reshape(hkv, t, nt, BLOCK, d)).transpose(2, 0, 1, 3, 4)
    if ns:
        es = mx.exp(ss - m).reshape(hkv, t, rep, ns, BLOCK)  # (H_kv, T, rep, nS, B)
        ls = es.sum(-1).transpose(3, 0, 1, 2)  # (nS, H_kv, T, rep)
        # (H_kv, nS, T rep, B) @ (H_kv, nS, B, D) -> (nS, H_kv, T, rep, D)
        es = es.transpose(0, 3, 1, 2, 4).reshape(hkv, ns, t * rep, BLOCK)
        os_ = (es @ vs).reshape(hkv, ns, t, rep, d).transpose(1, 0, 2, 3, 4)
        # Logical block order: shared blocks first, then the tail (whose padding is zeros).
        lsum = mx.concatenate([ls, lsum])  # (nb, H_kv, T, rep)
        osum = mx.concatenate([os_, osum])  # (nb, H_kv, T, rep, D)
    # Sums over the leading block axis: one sequential pass per output element on the
    # CPU, so zero (padding) blocks at the end change nothing.
    o = osum.sum(0) / lsum.sum(0)[..., None]  # (H_kv, T, rep, D)
    return o.transpose(1, 0, 2, 3).reshape(1, t, h * d)  # (1, T, H D): head = kv * rep + r
