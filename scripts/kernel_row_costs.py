"""What each verify row costs in the 4bit forward's compiled kernels, kernel by kernel.

A verify of ``r`` rows runs, per layer, four 4-bit matmuls (``dw_int4_mm``: q/k/v, the
output projection, gate/up, down) and the attention (``dw_attention_kv`` over a bfloat16
cache), then the Q8 head once (``dw_q8_mm``). This times each of them at 1..4 rows with
random weights of the default model's shapes (SmolLM2-135M: 30 layers, 576 wide, MLP
1,536, 9 query heads over 3 key/value heads of 64, vocabulary 49,152), straight through
ctypes with every buffer made once, so the increments between row counts are the
kernels' own (a call's fixed Python cost cancels out). ``--distinct`` gives each layer
weights of its own (66 MB streamed from memory, as in a real step) instead of one
layer's repeated (cache-resident: the arithmetic alone).

Example (AMD EPYC Zen 3, 2 threads, 2026-11-28)::

    python scripts/kernel_row_costs.py --context 800 --distinct

    rows  int4 matmuls x120  attention x30  Q8 head
       1               4.66           2.57     0.93
       2               4.91           3.68     1.14
       3               5.22           4.40     1.35
       4               6.59           4.92     1.72

(each figure includes ~10 us of Python a call: ~1.2 ms of the matmuls' column). At
context 270 the attention read 0.71 / 0.88 / 0.98 / 1.29 ms: a second row's cost is the
attention's, and grows with the context; the matmuls' extra rows hide behind their
weights' reads up to 2-3 rows (cache-resident, without ``--distinct``: +1.4-1.6 ms a
row).
"""

from __future__ import annotations

import argparse
import ctypes

import numpy as np
import torch

from draftwise.backends.cuda.cpu.int4 import pack_native, pack_q8
from draftwise.backends.cuda.cpu.native import attention_lib, kernel_threads
from draftwise.backends.cuda.profile_forward import _median_ms
from draftwise.core.device import cpu_name

LAYERS, C, MLP, H, HKV, D, VOCAB = 30, 576, 1536, 9, 3, 64, 49152
MATMULS = [(3 * 320, C), (C, C), (2 * MLP, C), (C, MLP)]  # (N, K): qkv, o, gate/up, down


def _int4(rng: np.random.Generator, n: int, k: int) -> torch.Tensor:
    codes = rng.integers(0, 16, (n, k)).astype(np.uint8)
    scale, zero = np.full((n, k // 32), 0.01, np.float32), np.zeros((n, k // 32), np.float32)
    return pack_native(codes, scale, zero)


def _row_costs(lib: ctypes.CDLL, t: int, weights: list[list[torch.Tensor]], head: torch.Tensor,
               caches: list[torch.Tensor], context: int, reps: int) -> list[float]:
    """Median ms of one verify's matmuls, attention and head at ``t`` rows. Every buffer
    lives to the end of the call (ctypes gets bare pointers)."""
    threads, tmax = kernel_threads(), caches[0].shape[2]
    xs = {k: torch.randn(t, k).to(torch.bfloat16) for k in (C, MLP)}  # (T, K)
    ys = {n: torch.empty(t, n, dtype=torch.bfloat16) for n, _ in MATMULS}  # (T, N)
    y_head = torch.empty(t, VOCAB, dtype=torch.bfloat16)  # (T, V)
    q = torch.randn(t, H, D) * D**-0.5  # (T, H, D), scaled
    out = torch.empty(t, H, D)  # (T, H, D)
    extra = torch.tensor([[context + j for j in range(t)]] * t, dtype=torch.int64)  # (T, T)
    n_extra = torch.arange(1, t + 1, dtype=torch.int32)  # (T,) row i: its ancestors, itself
    calls = [(xs[k].data_ptr(), k, w.data_ptr(), n, ys[n].data_ptr())
             for layer in weights for (n, k), w in zip(MATMULS, layer, strict=True)]
    calls = (calls * (LAYERS // len(weights)))[: 4 * LAYERS]

    def matmuls() -> None:
        for xp, k, wp, n, yp in calls:
            if lib.dw_int4_mm(xp, t, k, wp, n, yp, threads):
                raise MemoryError("dw_int4_mm failed")

    def attention() -> None:
        for kv in caches:
            if lib.dw_attention_kv(q.data_ptr(), kv.data_ptr(), 1, tmax, H, HKV, D, context,
                                   extra.data_ptr(), n_extra.data_ptr(), t, t, out.data_ptr(),
                                   threads):
                raise MemoryError("dw_attention_kv failed")

    def q8_head() -> None:
        x, y = xs[C].data_ptr(), y_head.data_ptr()
        if lib.dw_q8_mm(x, t, C, head.data_ptr(), VOCAB, y, threads):
            raise MemoryError("dw_q8_mm failed")

    return [_median_ms(f, reps)[0] for f in (matmuls, attention, q8_head)]  # medians


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--context", type=int, default=270, help="cached tokens each row attends to")
    p.add_argument("--rows", default="1,2,3,4")
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--distinct", action="store_true",
                   help="weights of its own per layer (streamed from memory)")
    args = p.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    if args.context < 1 or args.context + max(rows) > 4096 or min(rows) < 1 or args.reps < 1:
        raise SystemExit(f"need 1 <= context, context + rows <= 4096, rows >= 1, reps >= 1:"
                         f" got {args.context}, {args.rows}, {args.reps}")
    lib = attention_lib()
    if lib is None or lib.dw_int4_ok() != 1:
        raise SystemExit("the compiled 4-bit kernels are not available on this machine")
    rng = np.random.default_rng(0)
    n_w = LAYERS if args.distinct else 1
    weights = [[_int4(rng, n, k) for n, k in MATMULS] for _ in range(n_w)]
    q8 = rng.integers(-127, 128, (VOCAB, C)).astype(np.int8)
    head = pack_q8(q8, np.full((VOCAB, C // 32), 0.001, np.float32))
    tmax = args.context + max(rows) + 8
    caches = [(torch.rand(2, HKV, tmax, D) - 0.5).to(torch.bfloat16) for _ in range(LAYERS)]
    print(f"{cpu_name()}, {kernel_threads()} threads, context {args.context}, "
          f"{'distinct' if args.distinct else 'one layer of'} weights; median ms per verify")
    print("rows  int4 matmuls x120  attention x30  Q8 head")
    for t in rows:
        ms = _row_costs(lib, t, weights, head, caches, args.context, args.reps)
        print(f"{t:>4}  {ms[0]:17.2f}  {ms[1]:13.2f}  {ms[2]:7.2f}")


if __name__ == "__main__":
    main()
