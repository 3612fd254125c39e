"""Triton kernels whose result for a row never depends on how many rows the call carries.

cuBLAS picks a GEMM kernel by shape: for the Llama-3.1-8B shape on an H200 it takes a
split-K kernel at some row counts, and a row's logits then round differently in a
1-row step than inside a 16-row tree (measured: ``device_check.py --only buckets``), so
every step had to run the 64-row bucket (7.1 ms against a 3.65 ms bandwidth floor).
These kernels fix the reduction order by construction, as batch-invariant kernels do:

- ``_mm``: ``x (M, K) @ w (N, K).T`` in tiles of ``BM`` rows (``rowinv.config``: 16 up
  to 16 rows, 64 above, the same K steps either way). Each program owns
  one row tile and ``BN`` outputs and walks K in ``BK`` steps, always in the same order,
  with the same tile shapes whatever M is: a row's sum is the same sequence of float32
  additions in a 1-row call as in a 64-row one (the padding rows are zeros, and rows
  never mix in a matrix product). Split-K only in fixed parts of K, added in order by
  ``_mm_reduce`` (``rowinv.config``). The config is chosen by (N, K) only
  (``config``). Epilogues fused (one launch instead of two to four): a bias, the
  gated MLP's ``act(gate) * up`` (``w`` holds the gate rows, then the up rows), and the
  residual add. The input may be attention's output in its grouped-heads layout
  (``A_HEADS``), so no copy precedes the output projection.
- ``_attn`` (``DRAFTWISE_TRITON_ATTN=0`` for SDPA): attention over the cache in fixed
  slot blocks with an online softmax, up to the step's last row slot, each query row
  alone (its bias row selects its slots), written as plain rows for the output
  projection; with ``DRAFTWISE_ATTN_CHUNK`` in fixed chunks of slots side by side,
  merged in chunk order by ``_attn_combine``.
- ``_rope_kv``: RoPE of q and k (rotate-half, full or partial), q written in the
  grouped layout attention reads, k and v written into the cache at their slots: one
  launch where the torch step takes five to seven.
- ``_rmsnorm``: one program a row, its sum in one fixed order.

``PDL`` (Hopper, ``DRAFTWISE_PDL``): each kernel is launched with programmatic dependent
launch and first waits (``gdc_wait``) for the kernel before it, so its launch overlaps
that kernel's tail and it never reads or writes before that kernel's writes are done.

Rounding follows the torch step's bf16 order where it is cheap to (the gate and up
rounded before the activation, the projection before the residual add), so results are
close to eager; equality is only ever required between buckets, which all run these.

``UPCAST`` converts the operands to float32 before ``tl.dot``: Triton's CPU interpreter
(``TRITON_INTERPRET=1``, the CI tests) computes bf16 dots wrongly; on a GPU it is off.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait


@triton.jit
def _mm(
    x_ptr,
    w_ptr,
    out_ptr,
    res_ptr,
    bias_ptr,
    g_ptr,
    ws_ptr,
    eps,
    M,
    N,
    K: tl.constexpr,
    sxm,
    sxg,
    sxr,  # x strides: rows (plain) or kv-group and grouped-row (A_HEADS)
    swn,
    som,
    srm,
    up_off,  # GLU: the first up row of w (= N)
    A_HEADS: tl.constexpr,
    HD: tl.constexpr,
    REP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    HAS_RES: tl.constexpr,
    NORM: tl.constexpr,
    EVEN_K: tl.constexpr,
    UPCAST: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    SPLIT: tl.constexpr,
    PDL: tl.constexpr,
):
    """out (M, N) = epilogue(x (M, K) @ w[:N] (N, K).T); see the module docstring.
    ACT: 0 none, 1 silu, 2 gelu (tanh); with ACT the up half is w[up_off : up_off + N].
    NORM: x is RMSNorm's input: each A tile is scaled by the norm's weight g (K,) on its
    way to the dot, its rows' squares summed in the same K loop (the tile is loaded
    anyway: no extra pass), and the products scaled by rsqrt(mean square + eps) before
    the bias: RMSNorm(x) @ w.T without a launch of its own. Each row's sum runs in the
    same K order whatever M is.
    SPLIT > 1: program (tile, s) walks only the s-th of SPLIT equal parts of K (K a
    multiple of SPLIT BK) and writes its float32 sums to ``ws`` (SPLIT, M, WN) (WN = N, or
    2 N with ACT: the up sums after the gate's; the rows' squares, NORM, in a last
    (SPLIT, M) block), for ``_mm_reduce``, which adds the parts in order 0..SPLIT-1 and
    applies the epilogue. More programs, each a shorter walk: a one-row GEMM whose few
    weight tiles leave SMs idle or waiting reads its weight sooner. The split depends on
    (N, K) only, so a row's sum is still the same additions whatever M is."""
    if PDL:  # launched while the previous kernel drains: wait for its writes first
        gdc_wait()
    pid = tl.program_id(0)
    pid_k = 0
    if SPLIT > 1:
        pid_k = pid % SPLIT
        pid = pid // SPLIT
    KS: tl.constexpr = K // SPLIT
    num_m = tl.cdiv(M, BM)
    pid_m = pid % num_m  # the row tiles of one weight tile run side by side (L2 reuse)
    pid_n = pid // num_m
    rm = pid_m * BM + tl.arange(0, BM)  # (BM,)
    rn = pid_n * BN + tl.arange(0, BN)  # (BN,)
    rk = tl.arange(0, BK)  # (BK,)
    m_ok = rm < M
    n_ok = rn < N
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc_up = tl.zeros((BM, BN), dtype=tl.float32)
    ss = tl.zeros((BM,), dtype=tl.float32)  # NORM: the rows' sums of squares
    w_rows = w_ptr + rn[None, :] * swn  # (1, BN)
    for i in range(0, KS, BK):
        kk = pid_k * KS + i + rk  # (BK,)
        if A_HEADS:
            # attention's output (G, REP*M, HD) grouped per kv head: column k of a row
            # is head k // HD (group head // REP, block head % REP), dim k % HD
            head = kk // HD
            x_off = (
                (head // REP) * sxg
                + ((head % REP) * M)[None, :] * sxr
                + rm[:, None] * sxr
                + (kk % HD)[None, :]
            )
        else:
            x_off = rm[:, None] * sxm + kk[None, :]
        if EVEN_K:
            a = tl.load(x_ptr + x_off, mask=m_ok[:, None], other=0.0)  # (BM, BK)
            b = tl.load(w_rows + kk[:, None], mask=n_ok[None, :], other=0.0)  # (BK, BN)
        else:
            k_ok = kk < K
            a = tl.load(x_ptr + x_off, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(w_rows + kk[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)
        if NORM:
            af = a.to(tl.float32)
            ss += tl.sum(af * af, axis=1)
            if EVEN_K:
                g = tl.load(g_ptr + kk).to(tl.float32)  # (BK,)
            else:
                g = tl.load(g_ptr + kk, mask=kk < K, other=0.0).to(tl.float32)
            a = (af * g[None, :]).to(a.dtype)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)
        if ACT != 0:
            if EVEN_K:
                bu = tl.load(w_rows + up_off * swn + kk[:, None], mask=n_ok[None, :], other=0.0)
            else:
                bu = tl.load(
                    w_rows + up_off * swn + kk[:, None],
                    mask=n_ok[None, :] & k_ok[:, None],
                    other=0.0,
                )
            if UPCAST:
                bu = bu.to(tl.float32)
            acc_up = tl.dot(a, bu, acc_up)
    if SPLIT > 1:
        wn = N * (2 if ACT != 0 else 1)
        base = ws_ptr + pid_k * M * wn
        ok = m_ok[:, None] & n_ok[None, :]
        tl.store(base + rm[:, None] * wn + rn[None, :], acc, mask=ok)
        if ACT != 0:
            tl.store(base + rm[:, None] * wn + N + rn[None, :], acc_up, mask=ok)
        if NORM:
            if pid_n == 0:  # every weight tile sums the same squares: one writes them
                tl.store(ws_ptr + SPLIT * M * wn + pid_k * M + rm, ss, mask=m_ok)
    else:
        _mm_epilogue(acc, acc_up, ss, rm, rn, m_ok, n_ok, out_ptr, res_ptr, bias_ptr, eps, K, som,
                     srm, HAS_BIAS, ACT, HAS_RES, NORM)


@triton.jit
def _mm_reduce(
    ws_ptr,
    out_ptr,
    res_ptr,
    bias_ptr,
    eps,
    M,
    N,
    K: tl.constexpr,
    som,
    srm,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    HAS_RES: tl.constexpr,
    NORM: tl.constexpr,
    SPLIT: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    PDL: tl.constexpr,
):
    """``_mm``'s SPLIT parts of K added in order 0..SPLIT-1 (element by element: the tile
    shape here changes no bit), then its epilogue."""
    if PDL:  # launched while the previous kernel drains: wait for its writes first
        gdc_wait()
    rm = tl.program_id(0) * BM + tl.arange(0, BM)  # (BM,)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)  # (BN,)
    m_ok = rm < M
    n_ok = rn < N
    ok = m_ok[:, None] & n_ok[None, :]
    wn = N * (2 if ACT != 0 else 1)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc_up = tl.zeros((BM, BN), dtype=tl.float32)
    ss = tl.zeros((BM,), dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        base = ws_ptr + s * M * wn
        acc += tl.load(base + rm[:, None] * wn + rn[None, :], mask=ok, other=0.0)
        if ACT != 0:
            acc_up += tl.load(base + rm[:, None] * wn + N + rn[None, :], mask=ok, other=0.0)
        if NORM:
            ss += tl.load(ws_ptr + SPLIT * M * wn + s * M + rm, mask=m_ok, other=0.0)
    _mm_epilogue(acc, acc_up, ss, rm, rn, m_ok, n_ok, out_ptr, res_ptr, bias_ptr, eps, K, som, srm,
                 HAS_BIAS, ACT, HAS_RES, NORM)


@triton.jit
def _mm_epilogue(acc, acc_up, ss, rm, rn, m_ok, n_ok, out_ptr, res_ptr, bias_ptr, eps, K: tl.constexpr,
                 som, srm, HAS_BIAS: tl.constexpr, ACT: tl.constexpr, HAS_RES: tl.constexpr,
                 NORM: tl.constexpr):
    """``_mm``'s epilogue on the float32 sums acc (and acc_up, the GLU's up half; ss, the
    rows' squares with NORM): the norm's scale, the bias, act(gate) * up, the residual,
    rounded as the torch step rounds, stored."""
    dt = out_ptr.dtype.element_ty
    if NORM:
        inv = 1.0 / tl.sqrt(ss / K + eps)  # (BM,)
        acc = acc * inv[:, None]
        acc_up = acc_up * inv[:, None]
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
        r = tl.load(
            res_ptr + rm[:, None] * srm + rn[None, :], mask=m_ok[:, None] & n_ok[None, :], other=0.0
        )
        y = r.to(tl.float32) + y.to(dt).to(tl.float32)
    tl.store(
        out_ptr + rm[:, None] * som + rn[None, :], y.to(dt), mask=m_ok[:, None] & n_ok[None, :]
    )


@triton.jit
def _rope_kv(
    qk_ptr,
    v_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    slot_ptr,
    q_ptr,
    cache_ptr,
    B,
    spos,
    sqk,
    sv,
    scos,
    sqg,
    sqr,
    sckv,
    sch,
    scs,
    H: tl.constexpr,
    HKV: tl.constexpr,
    D: tl.constexpr,
    R: tl.constexpr,
    REP: tl.constexpr,
    BD: tl.constexpr,
    PDL: tl.constexpr,
):
    """Program (row b, head j): j < H a q head, H <= j < H + HKV a k head, then the v
    heads. q and k turn by RoPE at the row's position (the first R dims; cos and the
    signed sin from the (S, R) tables), as ``x cos + roll(x) sin`` rounded as the torch
    step does; q goes to ``q`` (G, REP*B, D) grouped per kv head, k and v to the cache
    (2, HKV, S, D) at the row's slot."""
    if PDL:  # launched while the previous kernel drains: wait for its writes first
        gdc_wait()
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
    q_ptr,
    kv_ptr,
    bias_ptr,
    o_ptr,
    slots_ptr,
    part_ptr,
    B,
    R,
    sqg,
    sqr,
    skv,
    skg,
    sks,
    sbr,
    sor,
    scale,
    cap,
    S: tl.constexpr,
    D: tl.constexpr,
    REP: tl.constexpr,
    BD: tl.constexpr,
    BQ: tl.constexpr,
    BS: tl.constexpr,
    CHUNK: tl.constexpr,
    SOFTCAP: tl.constexpr,
    UPCAST: tl.constexpr,
    BOUNDED: tl.constexpr,
    SPLIT: tl.constexpr,
    PIPE: tl.constexpr,
    PDL: tl.constexpr,
):
    """Softmax attention of BQ query rows of kv group g over the cache slots, in BS
    slot blocks always in the same order (online softmax): a row's result depends on its
    own query, the cache and its bias row only, never on the other rows or their count.
    BOUNDED: the blocks end at the step's last row slot (``slots_ptr[B - 1]``, read on
    the device, so a captured graph walks only the filled part of the cache); the bias
    hides every later slot, and a block it hides entirely changes nothing (its scores are
    -inf: p = 0, alpha = 1), so the bits are those of walking all S slots.
    SPLIT: program (g, t, c) walks only chunk c (slots c CHUNK .. (c + 1) CHUNK) and
    writes its running max, sum and unnormalised output to ``part_ptr`` for
    ``_attn_combine`` (flash decoding, with chunks fixed in the slots so that a row's
    bits still cannot depend on the other rows); without it CHUNK = S, one program walks
    all. PIPE > 0 (GPU only: the interpreter needs constant loop bounds): the same blocks
    in a loop bounded by values, its loads pipelined PIPE stages deep. q (G, R = REP*B,
    D) grouped (row j B + b is head g REP + j of step row b, as ``_rope_kv`` writes it); bias (B, S) additive; o (B, H D): the layout the output
    projection reads as plain rows. Gemma-2's soft-capping: cap tanh(s / cap), with
    tanh z = 2 sigmoid(2 z) - 1."""
    if PDL:  # launched while the previous kernel drains: wait for its writes first
        gdc_wait()
    g = tl.program_id(0)
    t = tl.program_id(1)
    c = tl.program_id(2)
    r = t * BQ + tl.arange(0, BQ)  # (BQ,)
    r_ok = r < R
    b = r % B
    d = tl.arange(0, BD)
    d_ok = d < D
    q = tl.load(q_ptr + g * sqg + r[:, None] * sqr + d[None, :],
                mask=r_ok[:, None] & d_ok[None, :], other=0.0)  # (BQ, BD)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full((BQ,), -1e30, dtype=tl.float32)
    l_i = tl.zeros((BQ,), dtype=tl.float32)
    acc = tl.zeros((BQ, BD), dtype=tl.float32)
    end = S  # (a loop bound read from memory would do, but Triton's CPU interpreter cannot)
    if BOUNDED:
        end = tl.load(slots_ptr + B - 1).to(tl.int32) + 1
    if PIPE > 0:
        # the same blocks in the same order (s0 < end, inside chunk c), in a loop whose
        # bounds are values, so Triton can pipeline the K and V loads PIPE stages deep
        lo = c * CHUNK
        hi = tl.minimum(end, lo + CHUNK)
        for s0 in tl.range(lo, hi, BS, num_stages=PIPE):
            m_i, l_i, acc = _attn_block(q, kv_ptr, bias_ptr, s0, b, r_ok, d, d_ok, m_i, l_i, acc, g, skv, skg,
                                        sks, sbr, scale, cap, S, BS, SOFTCAP, UPCAST)
    else:
        for i in range(0, CHUNK, BS):
            s0 = c * CHUNK + i
            if s0 < end:
                m_i, l_i, acc = _attn_block(q, kv_ptr, bias_ptr, s0, b, r_ok, d, d_ok, m_i, l_i, acc, g, skv,
                                            skg, sks, sbr, scale, cap, S, BS, SOFTCAP, UPCAST)
    if SPLIT:
        # part (G, T, NC, BQ, BD + 2) float32: acc, then m and l in the last two columns
        base = part_ptr + ((g * tl.num_programs(1) + t) * tl.num_programs(2) + c) * (BQ * (BD + 2))
        q_rows = tl.arange(0, BQ)
        tl.store(base + q_rows[:, None] * (BD + 2) + d[None, :], acc)
        tl.store(base + q_rows * (BD + 2) + BD, m_i)
        tl.store(base + q_rows * (BD + 2) + BD + 1, l_i)
    else:
        _write_rows(o_ptr, acc, l_i, g, t, B, R, sor, D, REP, BD, BQ)


@triton.jit
def _attn_block(q, kv_ptr, bias_ptr, s0, b, r_ok, d, d_ok, m_i, l_i, acc, g, skv, skg, sks, sbr, scale, cap,
                S: tl.constexpr, BS: tl.constexpr, SOFTCAP: tl.constexpr, UPCAST: tl.constexpr):
    """One block of BS slots from slot s0 folded into the online softmax of ``_attn``:
    returns the new running max m_i (BQ,), sum l_i (BQ,) and output acc (BQ, BD)."""
    cols = s0 + tl.arange(0, BS)  # (BS,)
    c_ok = cols < S
    k = tl.load(kv_ptr + g * skg + cols[None, :] * sks + d[:, None],
                mask=c_ok[None, :] & d_ok[:, None], other=0.0)  # (BD, BS)
    if UPCAST:
        k = k.to(tl.float32)
    sc = tl.dot(q, k) * scale  # (BQ, BS)
    if SOFTCAP:
        sc = cap * (2.0 / (1.0 + tl.exp(-2.0 * sc / cap)) - 1.0)
    sc += tl.load(bias_ptr + b[:, None] * sbr + cols[None, :],
                  mask=r_ok[:, None] & c_ok[None, :], other=float("-inf")).to(tl.float32)
    m_new = tl.maximum(m_i, tl.max(sc, axis=1))
    p = tl.exp(sc - m_new[:, None])  # (BQ, BS)
    alpha = tl.exp(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(kv_ptr + skv + g * skg + cols[:, None] * sks + d[None, :],
                mask=c_ok[:, None] & d_ok[None, :], other=0.0)  # (BS, BD)
    if UPCAST:
        v = v.to(tl.float32)
        pv = p
    else:
        pv = p.to(v.dtype)
    acc = acc * alpha[:, None] + tl.dot(pv, v)
    return m_new, l_i, acc


@triton.jit
def _write_rows(o_ptr, acc, l_sum, g, t, B, R, sor, D: tl.constexpr, REP: tl.constexpr,
                BD: tl.constexpr, BQ: tl.constexpr):
    """The BQ query rows of tile t of group g normalised (acc / l_sum) and written as
    (B, H D) rows: query row j B + b is head g REP + j of step row b."""
    r = t * BQ + tl.arange(0, BQ)  # (BQ,)
    b = r % B
    d = tl.arange(0, BD)
    head = g * REP + r // B
    o = acc / l_sum[:, None]
    tl.store(o_ptr + b[:, None] * sor + head[:, None] * D + d[None, :], o.to(o_ptr.dtype.element_ty),
             mask=(r < R)[:, None] & (d < D)[None, :])


@triton.jit
def _attn_combine(
    part_ptr,
    o_ptr,
    slots_ptr,
    B,
    R,
    sor,
    S: tl.constexpr,
    D: tl.constexpr,
    REP: tl.constexpr,
    BD: tl.constexpr,
    BQ: tl.constexpr,
    CHUNK: tl.constexpr,
    NC: tl.constexpr,
    BOUNDED: tl.constexpr,
    PDL: tl.constexpr,
):
    """The NC chunks ``_attn`` (SPLIT) wrote for BQ query rows of group g, merged in
    chunk order, always the same order. A chunk past the step's last row slot was not
    written and is skipped; that changes no bit, since its weight would be
    exp(-1e30 - m) = 0 (the bias hides all of its slots)."""
    if PDL:  # launched while the previous kernel drains: wait for its writes first
        gdc_wait()
    g = tl.program_id(0)
    t = tl.program_id(1)
    d = tl.arange(0, BD)
    q_rows = tl.arange(0, BQ)
    end = S
    if BOUNDED:
        end = tl.load(slots_ptr + B - 1).to(tl.int32) + 1
    m = tl.full((BQ,), -1e30, dtype=tl.float32)
    l_sum = tl.zeros((BQ,), dtype=tl.float32)
    acc = tl.zeros((BQ, BD), dtype=tl.float32)
    for c in range(0, NC):
        if c * CHUNK < end:
            base = part_ptr + ((g * tl.num_programs(1) + t) * NC + c) * (BQ * (BD + 2))
            m_c = tl.load(base + q_rows * (BD + 2) + BD)  # (BQ,)
            l_c = tl.load(base + q_rows * (BD + 2) + BD + 1)  # (BQ,)
            a_c = tl.load(base + q_rows[:, None] * (BD + 2) + d[None, :])  # (BQ, BD)
            m_new = tl.maximum(m, m_c)
            alpha = tl.exp(m - m_new)
            beta = tl.exp(m_c - m_new)
            l_sum = l_sum * alpha + l_c * beta
            acc = acc * alpha[:, None] + a_c * beta[:, None]
            m = m_new
    _write_rows(o_ptr, acc, l_sum, g, t, B, R, sor, D, REP, BD, BQ)


@triton.jit
def _rmsnorm(x_ptr, w_ptr, out_ptr, eps, C: tl.constexpr, sx, so, BC: tl.constexpr, PDL: tl.constexpr):
    """Program b: RMSNorm of row b of x (B, C) with weight w (C,): x / sqrt(mean(x^2) + eps)
    * w in float32, rounded once, as torch's fused ``F.rms_norm`` computes it. A row's
    sum runs in one fixed order (BC, a power of two >= C, depends on C only)."""
    if PDL:  # launched while the previous kernel drains: wait for its writes first
        gdc_wait()
    b = tl.program_id(0)
    c = tl.arange(0, BC)
    ok = c < C
    x = tl.load(x_ptr + b * sx + c, mask=ok, other=0.0).to(tl.float32)  # (BC,)
    w = tl.load(w_ptr + c, mask=ok, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / C + eps)
    tl.store(out_ptr + b * so + c, (x * inv * w).to(out_ptr.dtype.element_ty), mask=ok)
