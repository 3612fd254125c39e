"""Time the SSD drafter's index build and ``propose()`` with a 1M-token store.

    python scripts/ssd_propose_timing.py real   # chat-like synthetic tokens
    python scripts/ssd_propose_timing.py rand   # uniform random tokens

Prints the index build time and the median / p99 wall time of 2,000 ``propose`` calls
(budget 16) on contexts taken from the store, with a few hundred fresh tail tokens.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from draftwise.core.drafters.ssd import SSD

N = 1 << 20


def realistic(n: int, seed: int = 0, vocab: int = 49152) -> np.ndarray:
    """Chat-log-like tokens: Zipf phrases, a few shared system prompts, 10% exact repeat
    requests, -1 between requests."""
    rng = np.random.default_rng(seed)
    phrases = [rng.zipf(1.3, int(rng.integers(2, 12))) % vocab for _ in range(20000)]
    systems = [
        np.concatenate([phrases[int(j)] for j in rng.integers(0, 20000, 40)]) for _ in range(5)
    ]
    out: list[np.ndarray] = []
    reqs: list[np.ndarray] = []
    size = 0
    while size < n:
        if reqs and rng.random() < 0.1:
            r = reqs[int(rng.integers(len(reqs)))]
        else:
            picks = rng.zipf(1.2, int(rng.integers(20, 300))) % 20000
            r = np.concatenate([[-1], systems[int(rng.integers(5))]] + [phrases[int(j)] for j in picks])
            reqs.append(r)
        out.append(r)
        size += r.size
    return np.concatenate(out)[:n].astype(np.int64)


def fill(d: SSD, toks: np.ndarray) -> None:
    """Feed request by request, as the decoder does: begin(prompt), then the rest."""
    seps = np.flatnonzero(toks < 0).tolist() + [toks.size]
    for a, b in zip(seps[:-1], seps[1:], strict=True):
        req = toks[a + 1 : b]
        if req.size >= 2:
            cut = req.size // 2
            d.begin(req[:cut])
            d.update(req, req.size - cut)


def main(kind: str) -> None:
    rng = np.random.default_rng(1)
    if kind == "real":
        toks = realistic(N + 200000)
    else:
        toks = rng.integers(0, 49152, N + 200000)
        toks[::500] = -1
    d = SSD(capacity=N, background=False, rebuild_tokens=1 << 30)
    fill(d, toks[:N])
    t = time.perf_counter()
    d.sync_index()
    print(f"{kind}: index build {time.perf_counter() - t:.3f} s")
    d.begin(toks[N : N + 300])  # fresh tail tokens, as between rebuilds
    times, sizes = [], []
    for _ in range(2000):
        p = int(rng.integers(1000, N - 100))
        ctx = np.concatenate([toks[N : N + 300], toks[p - 40 : p]])
        ctx = ctx[ctx >= 0]
        t = time.perf_counter()
        tree = d.propose(ctx, 16)
        times.append(time.perf_counter() - t)
        sizes.append(len(tree))
    us = np.array(times) * 1e6
    print(f"{kind}: propose median {np.median(us):.0f} us, p99 {np.percentile(us, 99):.0f} us, "
          f"mean nodes {np.mean(sizes):.1f}")
    d.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "real")
