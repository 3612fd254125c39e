"""Triton kernels whose result for a row never depends on how many rows the call carries.

cuBLAS picks a GEMM kernel by shape: for the Llama-3.1-8B shape on an H200 it takes a
split-K kernel at some row counts, and a row's logits then round differently in a
1-row step than inside a 16-row tree (measured: ``device_check.py --only buckets``), so
every step had to run the 64-row bucket (7.1 ms against a 3.65 ms bandwidth floor).
These kernels fix the reduction order by construction, as batch-invariant kernels do:

- ``_mm``: ``x (M, K) @ w (N, K).T`` in tiles of ``BM`` = 16 rows. Each program owns
  one row tile and ``BN`` outputs and walks K in ``BK`` steps, always in the same order,
  with the same tile shapes whatever M is: a row's sum is the same sequence of float32
  additions in a 1-row call as in a 64-row one (the padding rows are zeros, and rows
  never mix in a matrix product). No split-K. The config is chosen by (N, K) only
  (``config``). Epilogues fused (one launch instead of two to four): a bias, the
  gated MLP's ``act(gate) * up`` (``w`` holds the gate rows, then the up rows), and the
  residual add. The input may be attention's output in its grouped-heads layout
  (``A_HEADS``), so no copy precedes the output projection.
- ``_rope_kv``: RoPE of q and k (rotate-half, full or partial), q written in the
  grouped layout attention reads, k and v written into the cache at their slots: one
  launch where the torch step takes five to seven.

Rounding follows the torch step's bf16 order where it is cheap to (the gate and up
rounded before the activation, the projection before the residual add), so results are
close to eager; equality is only ever required between buckets, which all run these.

``UPCAST`` converts the operands to float32 before ``tl.dot``: Triton's CPU interpreter
(``TRITON_INTERPRET=1``, the CI tests) computes bf16 dots wrongly; on a GPU it is off.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _a_tile(x_ptr, rm, kk, m_ok, k_ok, M, sxm, sxg, sxr, nw_ptr, rstd,
            A_HEADS: tl.constexpr, HD: tl.constexpr, REP: tl.constexpr,
            NORM: tl.constexpr, EVEN_K: tl.constexpr):
    """The (BM, BK) input tile of rows ``rm`` at columns ``kk`` (normed when NORM)."""
    if A_HEADS:
        # attention's output (G, REP*M, HD) grouped per kv head: column k of a row
        # is head k // HD (group head // REP, block head % REP), dim k % HD
        head = kk // HD
        x_off = (head // REP) * sxg + ((head % REP) * M)[None, :] * sxr + rm[:, None] * sxr + (kk % HD)[None, :]
    else:
        x_off = rm[:, None] * sxm + kk[None, :]
    if EVEN_K:
        a = tl.load(x_ptr + x_off, mask=m_ok[:, None], other=0.0)
    else:
        a = tl.load(x_ptr + x_off, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
    if NORM:  # RMSNorm of the row (rstd from the prologue) times the norm's weight
        if EVEN_K:
            nw = tl.load(nw_ptr + kk).to(tl.float32)
        else:
            nw = tl.load(nw_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
        a = (a.to(tl.float32) * rstd[:, None] * nw[None, :]).to(a.dtype)
    return a


@triton.jit
def _rstd(x_ptr, rm, m_ok, sxm, K: tl.constexpr, eps, BK: tl.constexpr):
    """1 / sqrt(mean(x^2) + eps) of rows ``rm`` (float32, K in BK steps: a fixed order)."""
    ss = tl.zeros((rm.shape[0],), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + tl.arange(0, BK)
        x = tl.load(x_ptr + rm[:, None] * sxm + kk[None, :], mask=m_ok[:, None] & (kk < K)[None, :],
                    other=0.0).to(tl.float32)
        ss += tl.sum(x * x, axis=1)
    return 1.0 / tl.sqrt(ss / K + eps)


@triton.jit
def _epilogue(acc, acc_up, rm, rn, m_ok, n_ok, out_ptr, res_ptr, bias_ptr, som, srm,
              HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr):
    dt = out_ptr.dtype.element_ty
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    y = acc
    if ACT != 0:
        g = acc.to(dt).to(tl.float32)  # the gate as the torch step rounds it
        if ACT == 1:
            g = g / (1.0 + tl.exp(-g))  # silu
        else:
            z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
            g = g / (1.0 + tl.exp(-2.0 * z))  # gelu (tanh): 0.5 g (1 + tanh z) = g sigmoid(2 z)
        y = g.to(dt).to(tl.float32) * acc_up.to(dt).to(tl.float32)
    if HAS_RES:
        r = tl.load(res_ptr + rm[:, None] * srm + rn[None, :], mask=m_ok[:, None] & n_ok[None, :], other=0.0)
        y = r.to(tl.float32) + y.to(dt).to(tl.float32)
    tl.store(out_ptr + rm[:, None] * som + rn[None, :], y.to(dt), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _mm(
    x_ptr, w_ptr, out_ptr, res_ptr, bias_ptr, nw_ptr,
    M, N, K: tl.constexpr,
    sxm, sxg, sxr,  # x strides: rows (plain) or kv-group and grouped-row (A_HEADS)
    swn, som, srm,
    up_off,  # GLU: the first up row of w (= N)
    eps,
    A_HEADS: tl.constexpr, HD: tl.constexpr, REP: tl.constexpr,
    NORM: tl.constexpr, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
    EVEN_K: tl.constexpr, UPCAST: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, MT: tl.constexpr,
):
    """out (M, N) = epilogue(norm(x) (M, K) @ w[:N] (N, K).T); see the module docstring.
    A program owns BN outputs of MT row tiles of BM rows (MT in 1..4): it reads each
    weight tile once and multiplies it into every row tile separately, so a row's
    arithmetic is the same whatever MT is. ACT: 0 none, 1 silu, 2 gelu (tanh); with ACT
    the up half is w[up_off : up_off + N]. NORM: x is RMS-normed first (weight
    ``nw``, ``eps``)."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM * MT)
    pid_m = pid % num_m
    pid_n = pid // num_m
    rn = pid_n * BN + tl.arange(0, BN)  # (BN,)
    rk = tl.arange(0, BK)  # (BK,)
    n_ok = rn < N
    r0 = pid_m * BM * MT + tl.arange(0, BM)  # (BM,) each row tile: r0 + t BM
    m0 = r0 < M
    m1 = r0 + BM < M
    m2 = r0 + 2 * BM < M
    m3 = r0 + 3 * BM < M
    rs0 = tl.zeros((BM,), dtype=tl.float32)
    rs1 = rs0
    rs2 = rs0
    rs3 = rs0
    if NORM:
        rs0 = _rstd(x_ptr, r0, m0, sxm, K, eps, BK)
        if MT > 1:
            rs1 = _rstd(x_ptr, r0 + BM, m1, sxm, K, eps, BK)
        if MT > 2:
            rs2 = _rstd(x_ptr, r0 + 2 * BM, m2, sxm, K, eps, BK)
        if MT > 3:
            rs3 = _rstd(x_ptr, r0 + 3 * BM, m3, sxm, K, eps, BK)
    acc0 = tl.zeros((BM, BN), dtype=tl.float32)
    acc1 = acc0
    acc2 = acc0
    acc3 = acc0
    up0 = acc0
    up1 = acc0
    up2 = acc0
    up3 = acc0
    w_rows = w_ptr + rn[None, :] * swn  # (1, BN)
    for k0 in range(0, K, BK):
        kk = k0 + rk  # (BK,)
        k_ok = kk < K
        if EVEN_K:
            b = tl.load(w_rows + kk[:, None], mask=n_ok[None, :], other=0.0)  # (BK, BN)
        else:
            b = tl.load(w_rows + kk[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)
        if UPCAST:
            b = b.to(tl.float32)
        if ACT != 0:
            if EVEN_K:
                bu = tl.load(w_rows + up_off * swn + kk[:, None], mask=n_ok[None, :], other=0.0)
            else:
                bu = tl.load(w_rows + up_off * swn + kk[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)
            if UPCAST:
                bu = bu.to(tl.float32)
        a = _a_tile(x_ptr, r0, kk, m0, k_ok, M, sxm, sxg, sxr, nw_ptr, rs0, A_HEADS, HD, REP, NORM, EVEN_K)
        if UPCAST:
            a = a.to(tl.float32)
        acc0 = tl.dot(a, b, acc0)
        if ACT != 0:
            up0 = tl.dot(a, bu, up0)
        if MT > 1:
            a = _a_tile(x_ptr, r0 + BM, kk, m1, k_ok, M, sxm, sxg, sxr, nw_ptr, rs1, A_HEADS, HD, REP, NORM, EVEN_K)
            if UPCAST:
                a = a.to(tl.float32)
            acc1 = tl.dot(a, b, acc1)
            if ACT != 0:
                up1 = tl.dot(a, bu, up1)
        if MT > 2:
            a = _a_tile(x_ptr, r0 + 2 * BM, kk, m2, k_ok, M, sxm, sxg, sxr, nw_ptr, rs2, A_HEADS, HD, REP, NORM, EVEN_K)
            if UPCAST:
                a = a.to(tl.float32)
            acc2 = tl.dot(a, b, acc2)
            if ACT != 0:
                up2 = tl.dot(a, bu, up2)
        if MT > 3:
            a = _a_tile(x_ptr, r0 + 3 * BM, kk, m3, k_ok, M, sxm, sxg, sxr, nw_ptr, rs3, A_HEADS, HD, REP, NORM, EVEN_K)
            if UPCAST:
                a = a.to(tl.float32)
            acc3 = tl.dot(a, b, acc3)
            if ACT != 0:
                up3 = tl.dot(a, bu, up3)
    _epilogue(acc0, up0, r0, rn, m0, n_ok, out_ptr, res_ptr, bias_ptr, som, srm, HAS_BIAS, ACT, HAS_RES)
    if MT > 1:
        _epilogue(acc1, up1, r0 + BM, rn, m1, n_ok, out_ptr, res_ptr, bias_ptr, som, srm, HAS_BIAS, ACT, HAS_RES)
    if MT > 2:
        _epilogue(acc2, up2, r0 + 2 * BM, rn, m2, n_ok, out_ptr, res_ptr, bias_ptr, som, srm, HAS_BIAS, ACT, HAS_RES)
    if MT > 3:
        _epilogue(acc3, up3, r0 + 3 * BM, rn, m3, n_ok, out_ptr, res_ptr, bias_ptr, som, srm, HAS_BIAS, ACT, HAS_RES)


@triton.jit
def _rope_kv(
    qk_ptr, v_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr, q_ptr, cache_ptr,
    B, spos, sqk, sv, scos, sqg, sqr, sckv, sch, scs,
    H: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, R: tl.constexpr,
    REP: tl.constexpr, BD: tl.constexpr,
):
    """Program (row b, head j): j < H a q head, H <= j < H + HKV a k head, then the v
    heads. q and k turn by RoPE at the row's position (the first R dims; cos and the
    signed sin from the (S, R) tables), as ``x cos + roll(x) sin`` rounded as the torch
    step does; q goes to ``q`` (G, REP*B, D) grouped per kv head, k and v to the cache
    (2, HKV, S, D) at the row's slot."""
    b = tl.program_id(0)
    j = tl.program_id(1)
    d = tl.arange(0, BD)
    d_ok = d < D
    slot = tl.load(slot_ptr + b)
    dt = cache_ptr.dtype.element_ty
    if j < H + HKV:
        row = qk_ptr + b * sqk + j * D
        x = tl.load(row + d, mask=d_ok, other=0.0)
        turn = d < R
        rolled = tl.where(turn, (d + R // 2) % R, d)
        xr = tl.load(row + rolled, mask=d_ok, other=0.0).to(tl.float32)
        pos = tl.load(pos_ptr + b * spos)
        c = tl.load(cos_ptr + pos * scos + d, mask=turn & d_ok, other=1.0).to(tl.float32)
        s = tl.load(sin_ptr + pos * scos + d, mask=turn & d_ok, other=0.0).to(tl.float32)
        t = (x.to(tl.float32) * c).to(x.dtype).to(tl.float32)  # torch: x * cos, rounded
        y = tl.where(turn, (t + xr * s).to(x.dtype), x)  # then addcmul, rounded
        if j < H:
            dst = q_ptr + (j // REP) * sqg + ((j % REP) * B + b) * sqr + d
            tl.store(dst, y.to(q_ptr.dtype.element_ty), mask=d_ok)
        else:
            tl.store(cache_ptr + (j - H) * sch + slot * scs + d, y.to(dt), mask=d_ok)
    else:
        hv = j - H - HKV
        x = tl.load(v_ptr + b * sv + hv * D + d, mask=d_ok, other=0.0)
        tl.store(cache_ptr + sckv + hv * sch + slot * scs + d, x.to(dt), mask=d_ok)


@triton.jit
def _attn(
    q_ptr, kv_ptr, bias_ptr, o_ptr,
    B, R, sqg, sqr, skv, skg, sks, sbr, sor, scale, cap,
    S: tl.constexpr, D: tl.constexpr, REP: tl.constexpr, BD: tl.constexpr,
    BQ: tl.constexpr, BS: tl.constexpr, SOFTCAP: tl.constexpr, UPCAST: tl.constexpr,
):
    """Softmax attention of BQ query rows of kv group g over all S cache slots, in BS
    slot blocks in a fixed order (online softmax): a row's result depends on its own
    query, the cache and its bias row only. q (G, R = REP*B, D) grouped (row j B + b is
    head g REP + j of step row b); bias (B, S) float, additive; o (B, H D)."""
    g = tl.program_id(0)
    r = tl.program_id(1) * BQ + tl.arange(0, BQ)  # (BQ,)
    r_ok = r < R
    b = r % B
    d = tl.arange(0, BD)
    d_ok = d < D
    q = tl.load(q_ptr + g * sqg + r[:, None] * sqr + d[None, :], mask=r_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full((BQ,), -1e30, dtype=tl.float32)
    l_i = tl.zeros((BQ,), dtype=tl.float32)
    acc = tl.zeros((BQ, BD), dtype=tl.float32)
    for s0 in range(0, S, BS):
        cols = s0 + tl.arange(0, BS)  # (BS,)
        c_ok = cols < S
        k = tl.load(kv_ptr + g * skg + cols[None, :] * sks + d[:, None], mask=c_ok[None, :] & d_ok[:, None],
                    other=0.0)  # (BD, BS)
        if UPCAST:
            k = k.to(tl.float32)
        sc = tl.dot(q, k) * scale  # (BQ, BS)
        if SOFTCAP:  # gemma2: cap tanh(s / cap), tanh z = 2 sigmoid(2 z) - 1
            sc = cap * (2.0 / (1.0 + tl.exp(-2.0 * sc / cap)) - 1.0)
        sc += tl.load(bias_ptr + b[:, None] * sbr + cols[None, :], mask=r_ok[:, None] & c_ok[None, :],
                      other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        p = tl.exp(sc - m_new[:, None])  # (BQ, BS)
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(kv_ptr + skv + g * skg + cols[:, None] * sks + d[None, :], mask=c_ok[:, None] & d_ok[None, :],
                    other=0.0)  # (BS, BD)
        if UPCAST:
            v = v.to(tl.float32)
            pv = p
        else:
            pv = p.to(v.dtype)
        acc = acc * alpha[:, None] + tl.dot(pv, v)
        m_i = m_new
    o = acc / l_i[:, None]
    head = g * REP + r // B
    tl.store(o_ptr + b[:, None] * sor + head[:, None] * D + d[None, :], o.to(o_ptr.dtype.element_ty),
             mask=r_ok[:, None] & d_ok[None, :])
