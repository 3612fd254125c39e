"""Batch-invariant verification: a row's logits do not depend on the other rows.

In low precision a many-row forward otherwise runs different kernels (and reduction
orders) than a one-row forward, so near-tied argmaxes flip and speculative output drifts
from plain decoding. In this mode plain decoding and tree verification are two schedules
of ONE deterministic computation. What was measured on CPU (torch 2.13, oneDNN/MKL;
``/tmp/dw10/measure*.py`` in the issue-10 report) and what this module relies on:

- bf16 ``F.linear``: row 0 is bit-identical for every M in 1..256 for the layer shapes,
  and for M in 1..32 for the lm_head (M >= 33 switches kernel), on the Intel Xeon (AMX)
  of the first measurements. On an AMD EPYC (avx512_bf16, no AMX) M = 1 takes another
  kernel than M >= 2 for the 1536-wide down projection (M = 2..48 is one class, 1 and 2
  threads). So rows are processed in chunks of at most ``MAX_ROWS`` = 32 and padded to
  ``min_rows("bfloat16")`` = 2.
- float32 ``F.linear``: M = 1 (gemv) differs from M >= 2, and M in 2..15 differs from
  16..56. So float32 chunks are padded to ``min_rows("float32")`` = 16 rows.
- SDPA differs as soon as masked keys sit between visible ones (a tree's siblings), so
  attention is written out here, in float32, from primitives that measured invariant:
  ``q @ K^T`` (any M >= 4, any N, batched or not), ``p @ V`` over a fixed block of
  ``BLOCK`` keys (any M >= 4; queries are padded to ``MIN_GEMM_ROWS`` rows per kv head), a sum over the contiguous last dim of fixed size, a max,
  and sums over the "block" dim to which trailing all-zero blocks add nothing (see
  ``block_attention`` for why the exp-sums are reduced along a contiguous last dim).

Each row attends over its own *logical* key list: cache slots ``0 .. L-1`` then the slots
of its tree ancestors and itself, in depth order: exactly the list a plain step at that
position sees. The list is cut into blocks of ``BLOCK`` logical positions: blocks fully
inside the committed cache are shared by all rows (one GEMM); the rest (the "tail") is
gathered per row and padded with masked keys. Every block yields exp-sums and ``p @ V``
partials against the row's global max; the partials are summed in block order, so a
padding block adds exact zeros.

Example::

    plan = make_plan(committed=40, rows=[[40], [40, 41]], device=torch.device("cpu"))
    o = block_attention(q, cache_layer, plan, rep=3)   # q (H, T, D) -> (T, H D) float32
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from draftwise.backends.cuda.cpu.native import native_attention
from draftwise.core.keyplan import BLOCK, key_blocks

MAX_ROWS = 32  # rows per forward: the bf16 lm_head GEMM is row-invariant only up to 32
# float32 GEMMs give a row the same bits for every M >= 4 rows, but other bits at M = 1
# and M = 2..3 (measured on an AMD EPYC with torch 2.13: /tmp probes in the issue-15 note;
# on the Intel Xeon of the first measurements M >= 3 was one class). The attention GEMMs
# have M = (query heads per kv head) x rows, 3 x 1 for SmolLM2's plain step, so the query
# heads are padded with zero heads to at least this many.
MIN_GEMM_ROWS = 4
# pad to this many rows (see the module doc). 4bit: the int4 kernel and the bf16 lm_head
# (49152 x 576) measured row-invariant from M = 1 on the AMD EPYC (tests/backends/cuda/
# test_int4.py, test_invariant.py); padding to 2 cost 0.7 ms of a 12 ms step
_MIN_ROWS = {"float32": 16, "bfloat16": 2, "4bit": 1}
# A forward whose rows together see at most this many keys gathers every row's whole key
# list (one index_select, no shared GEMM). The blocks, and the arithmetic per block, are
# the same as with a shared part, so the choice never changes a row's bits (tested). On
# the AMD EPYC here it did not pay at any size (``draftwise tune``, context 256: 1 row
# 34.7 ms shared vs 38.0 gathered, 8 rows 42.9 vs 65.0), so it is off.
GATHER_ALL_KEYS = 0


def min_rows(dtype: str) -> int:
    """Rows every invariant forward is padded to for ``dtype`` (1 = no padding)."""
    return _MIN_ROWS.get(dtype, 1)


@dataclass(frozen=True)
class Plan:
    """Which keys each row attends to: for ``block_attention`` split into shared blocks
    and a gathered tail; for the native kernel (``native.py``) the committed length and
    each row's extra slots."""

    shared: int  # keys in full blocks below the committed length: slots 0 .. shared-1
    tail_idx: torch.Tensor  # (T, nT * BLOCK) int64 cache slots of the rest of each list
    tail_bias: torch.Tensor  # (1, T, 1, nT * BLOCK) float32: 0, or -inf on padding
    committed: int = 0
    extra: torch.Tensor | None = None  # (T, E) int64: row i's slots from ``committed`` on
    n_extra: torch.Tensor | None = None  # (T,) int32: how many of them
    native: Any = None  # the compiled kernel (``native.attention_lib()``), or None
    # sliding-window layers (gemma): -inf on keys too far back for the row, for the shared
    # keys (1, T, 1, shared) and the tail (1, T, 1, nT * BLOCK); None: no such layers
    window: tuple[torch.Tensor, torch.Tensor] | None = None


def make_plan(
    committed: int, rows: Sequence[Sequence[int]], device: torch.device, native: Any = None,
    window: tuple[int, np.ndarray, np.ndarray] | None = None,
) -> Plan:
    """``rows[i]``: the cache slots at or after ``committed`` that row i sees (its tree
    ancestors and itself, in depth order); every row also sees slots ``0..committed-1``.
    ``native``: the compiled kernel, which attends from the row lists as they are.
    ``window``: (W, the rows' positions (T,), every slot's position (S,)) for
    sliding-window layers: a key at position k is seen by a row at p when k > p - W."""
    if native is not None:
        n = np.array([len(r) for r in rows], np.int32)  # (T,)
        extra = np.zeros((len(rows), int(n.max())), np.int64)  # (T, E)
        for i, r in enumerate(rows):
            extra[i, : n[i]] = r
        empty = torch.empty(0)
        return Plan(0, empty, empty, committed, torch.from_numpy(extra), torch.from_numpy(n), native)
    keys = len(rows) * (committed + max(len(r) for r in rows))
    shared, idx, ok = key_blocks(committed, rows, BLOCK, share=keys > GATHER_ALL_KEYS)
    bias = np.where(ok, np.float32(0), np.float32(-np.inf))[None, :, None, :]
    win = None
    if window is not None:
        w, row_pos, slot_pos = window
        low = np.asarray(row_pos, np.int64)[:, None] - w  # (T, 1): keys must lie above
        inf = np.float32(-np.inf)
        ws = np.where(np.arange(shared)[None, :] > low, np.float32(0), inf)[None, :, None, :]
        wt = np.where(np.asarray(slot_pos)[idx] > low, np.float32(0), inf)[None, :, None, :]
        win = (torch.from_numpy(ws).to(device), torch.from_numpy(wt).to(device))
    return Plan(shared, torch.from_numpy(idx).to(device), torch.from_numpy(bias).to(device), window=win)


def slot_table(committed: int, visible: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``make_plan``'s native tables straight from a verify's visibility mask, without a
    Python loop over rows: ``visible`` (T, T) 0/1, row i sees new slot j when
    ``visible[i, j]`` (its tree ancestors and itself, which precede it). Returns
    ``extra`` (T, E) int64 (row i's slots from ``committed`` on, in order, 0-padded) and
    ``n_extra`` (T,) int32, E = the longest list.

    Example::

        >>> e, n = slot_table(40, np.array([[1, 0, 0], [1, 1, 0], [1, 0, 1]]))
        >>> e.tolist(), n.tolist()
        ([[40, 0], [40, 41], [40, 42]], [1, 2, 2])
    """
    t = visible.shape[0]
    if t == 1 and visible[0, 0]:  # a plain step: the row sees its own slot
        return np.array([[committed]], np.int64), np.ones(1, np.int32)
    r, c = np.nonzero(visible)  # row-major: each row's slots in increasing order
    n = np.bincount(r, minlength=t)  # (T,)
    extra = np.zeros((t, int(n.max())), np.int64)  # (T, E)
    first = np.cumsum(n) - n  # (T,) each row's first entry in r, c
    extra[r, np.arange(r.size) - first[r]] = committed + c
    return extra, n.astype(np.int32)


# chain_slots' tables for each row count: (T, T) slot offsets, (T, T) 0/1 visibility and
# (T,) counts, made once (read-only; T <= the verify's row cap)
_CHAIN: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


def chain_tables(t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``t`` rows of a chain (the root, then drafts each the child of the one before):
    ``(offsets, visible, counts)``, row i seeing new slots 0..i: offsets (t, t) int64
    ``j`` where ``j <= i`` else 0, visible (t, t) int64 the same 0/1, counts (t,) int32
    ``i + 1``. Made once per ``t`` and read-only.

    Example::

        >>> off, vis, n = chain_tables(3)
        >>> off.tolist(), vis.tolist(), n.tolist()
        ([[0, 0, 0], [0, 1, 0], [0, 1, 2]], [[1, 0, 0], [1, 1, 0], [1, 1, 1]], [1, 2, 3])
    """
    got = _CHAIN.get(t)
    if got is None:
        if t < 1:
            raise ValueError(f"a chain's tables need t >= 1 rows, got {t}")
        ar = np.arange(t, dtype=np.int64)
        low = ar[None, :] <= ar[:, None]  # (t, t)
        got = (np.where(low, ar[None, :], 0), low.astype(np.int64), (ar + 1).astype(np.int32))
        for a in got:
            a.flags.writeable = False
        _CHAIN[t] = got
    return got


def chain_slots(committed: int, t: int) -> tuple[np.ndarray, np.ndarray]:
    """``slot_table(committed, visible)`` for a chain's lower-triangular ``visible``
    (``chain_tables``), in one numpy operation instead of six: right after a verify each
    costs several microseconds (a live decode, AMD EPYC Zen 4, alternating: a verify's
    Python time 0.174 -> 0.144 ms a step, median).

    Example::

        >>> e, n = chain_slots(40, 3)
        >>> e.tolist(), n.tolist()
        ([[40, 0, 0], [40, 41, 0], [40, 41, 42]], [1, 2, 3])
    """
    off, vis, n = chain_tables(t)
    return off + committed * vis, n


def causal_plan(start: int, t: int, native: Any) -> Plan:
    """The native kernel's plan for ``t`` prompt rows at slots ``start ..``: row i sees
    the cache below ``start`` and slots ``start .. start + i`` (what ``make_plan`` gives
    for those lists, built without a Python loop).

    Example::

        >>> p = causal_plan(5, 3, native=None)
        >>> p.extra.tolist(), p.n_extra.tolist()
        ([[5, 0, 0], [5, 6, 0], [5, 6, 7]], [1, 2, 3])
    """
    if t < 1 or start < 0:
        raise ValueError(f"a causal plan needs t >= 1 rows at start >= 0, got t={t}, start={start}")
    ar = np.arange(t, dtype=np.int64)  # (t,)
    extra = np.where(ar[None, :] <= ar[:, None], start + ar[None, :], 0)  # (t, t)
    n = np.arange(1, t + 1, dtype=np.int32)  # (t,)
    empty = torch.empty(0)
    return Plan(0, empty, empty, start, torch.from_numpy(extra), torch.from_numpy(n), native)


def plan_attention(
    q: torch.Tensor, kv: torch.Tensor, plan: Plan, rep: int,
    scale: float | None = None, softcap: float | None = None,
    window: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """(H, T, D) queries over one layer's cache following ``plan``: the native kernel when
    the plan carries it (plain attention only), else ``block_attention``. Returns (T, H D)
    float32."""
    if plan.native is not None:
        assert plan.extra is not None and plan.n_extra is not None
        assert scale is None and softcap is None and window is None
        return native_attention(plan.native, q, kv, plan.committed, plan.extra, plan.n_extra)
    return block_attention(q, kv, plan, rep, scale, softcap, window)


def block_attention(
    q: torch.Tensor, kv: torch.Tensor, plan: Plan, rep: int,
    scale: float | None = None, softcap: float | None = None,
    window: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Attention of ``q`` (H, T, D) over one layer's cache ``kv`` (2, H_kv, T_max, D)
    following ``plan``; returns (T, H D) float32. Row-invariant: see the module doc.
    ``scale``: of the scores (None: D ** -0.5); ``softcap``: scores become
    ``tanh(s / cap) * cap`` (gemma2), elementwise, so rows stay invariant. ``window``:
    the plan's sliding-window biases (shared, tail), for a sliding-window layer: a row's
    bias depends on its position and the keys' only, so rows stay invariant.

    Rows of ``q`` beyond the plan's are padding (copies of row 0 that only keep the
    linear layers' row count at ``min_rows``): they get row 0's output, uncomputed."""
    h, t_all, d = q.shape
    t = plan.tail_idx.shape[0]  # rows with a key list
    q = q[:, :t]  # (H, T, D)
    hkv = h // rep
    heads = rep  # the query heads per kv head that are real; the rest is padding
    # Scale q first (elementwise), so the score GEMMs are plain q @ K^T.
    qf = q.float().mul(d**-0.5 if scale is None else scale).view(hkv, rep, t, d)  # (H_kv, rep, T, D)
    if rep < MIN_GEMM_ROWS:  # every GEMM below then has M >= MIN_GEMM_ROWS rows
        qf, rep = F.pad(qf, (0, 0, 0, 0, 0, MIN_GEMM_ROWS - rep)), MIN_GEMM_ROWS  # zero heads
    qt = qf.transpose(1, 2)  # (H_kv, T, rep, D)
    # K and V in one gather; index_select on the flat slot list is several times faster
    # on a CPU than advanced indexing with the (T, nT B) index.
    kvt = kv.index_select(2, plan.tail_idx.view(-1)).float()  # (2, H_kv, T nT B, D)
    kvt = kvt.view(2, hkv, t, -1, d)  # (2, H_kv, T, nT B, D)
    kt, vt = kvt[0], kvt[1]  # (H_kv, T, nT B, D)
    st = qt @ kt.transpose(-1, -2)  # (H_kv, T, rep, nT B)
    if softcap is not None:
        st = torch.tanh(st / softcap) * softcap
    st = st + plan.tail_bias  # padding -> -inf (adding 0 changes nothing)
    if window is not None:
        st = st + window[1]  # keys before the row's window -> -inf
    m = st.amax(-1, keepdim=True)  # (H_kv, T, rep, 1)
    ns = plan.shared // BLOCK
    if ns:
        ks = kv[0, :, : plan.shared].float()  # (H_kv, S, D)
        vs = kv[1, :, : plan.shared].float().view(hkv, ns, BLOCK, d)  # (H_kv, nS, B, D)
        ss = qf.reshape(hkv, rep * t, d) @ ks.transpose(-1, -2)  # (H_kv, rep T, S)
        ss = ss.view(hkv, rep, t, plan.shared).transpose(1, 2)  # (H_kv, T, rep, S)
        if softcap is not None:
            ss = torch.tanh(ss / softcap) * softcap
        if window is not None:
            ss = ss + window[0]
        m = torch.maximum(m, ss.amax(-1, keepdim=True))  # (H_kv, T, rep, 1)
    nt = st.shape[-1] // BLOCK
    et = torch.exp(st - m).view(hkv, t, rep, nt, BLOCK)  # (H_kv, T, rep, nT, B)
    lsum = et.sum(-1).permute(3, 0, 1, 2)  # (nT, H_kv, T, rep)
    # (H_kv, T, nT, rep, B) @ (H_kv, T, nT, B, D) -> (nT, H_kv, T, rep, D)
    osum = (et.transpose(2, 3) @ vt.view(hkv, t, nt, BLOCK, d)).permute(2, 0, 1, 3, 4)
    if ns:
        es = torch.exp(ss - m).view(hkv, t, rep, ns, BLOCK)  # (H_kv, T, rep, nS, B)
        ls = es.sum(-1).permute(3, 0, 1, 2)  # (nS, H_kv, T, rep)
        # (H_kv, nS, T rep, B) @ (H_kv, nS, B, D) -> (nS, H_kv, T, rep, D)
        es = es.permute(0, 3, 1, 2, 4).reshape(hkv, ns, t * rep, BLOCK)
        os_ = (es @ vs).view(hkv, ns, t, rep, d).transpose(0, 1)
        # Logical block order: shared blocks first, then the tail (whose padding is zeros).
        lsum = torch.cat([ls, lsum])  # (nb, H_kv, T, rep)
        osum = torch.cat([os_, osum])  # (nb, H_kv, T, rep, D)
    # Sums over the block dim: zero (padding) blocks change nothing. torch's CPU sum picks
    # its order by layout: an outer reduction (block dim leading) is vectorised only over
    # whole vector widths of columns, so a row's order would depend on T when the column
    # count H_kv*T*rep is not a multiple of the vector width (SmolLM2: 9 heads). The
    # exp-sums are therefore reduced along a contiguous last dim (one row at a time,
    # independent of T); ``osum`` has H*D columns per row (a multiple of 16), always vectorised.
    lsum = lsum.permute(1, 2, 3, 0).contiguous().sum(-1)  # (H_kv, T, rep)
    o = (osum.sum(0) / lsum.unsqueeze(-1))[:, :, :heads]  # (H_kv, T, heads, D)
    o = o.permute(1, 0, 2, 3).reshape(t, h * d)  # (T, H D): head = kv * heads + r
    if t < t_all:
        o = torch.cat([o, o[:1].expand(t_all - t, -1)])  # (T_all, H D)
    return o
