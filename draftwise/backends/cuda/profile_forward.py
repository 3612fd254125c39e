"""Latency of ``TorchBackend.verify`` against rows and context, and against transformers.

Prints the median time of one ``verify`` of ``N + 1`` rows (a draft chain; a tree with the
same row count costs the same) at each context length and dtype, then the same one-token
step through transformers' ``AutoModelForCausalLM`` with its ``DynamicCache``.

Example::

    python -m draftwise.backends.cuda.profile_forward --model ~/.cache/draftwise/models/X \
        --dtypes float32,bfloat16 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import torch

from draftwise.backends.cuda.backend import TorchBackend
from draftwise.core.tree import DraftTree


def _median_ms(fn: Callable[[], object], reps: int, warmup: int = 2) -> tuple[float, float]:
    """(median, min) wall time in ms; the min shows the cost without noisy neighbours."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, min(times) * 1e3


def profile_lean(
    model: str, dtype: str, device: str, contexts: list[int], rows: list[int], reps: int
) -> dict[tuple[int, int], tuple[float, float]]:
    """{(context, rows): (median, min) ms} of ``verify`` (need_logits=False)."""
    be = TorchBackend.from_pretrained(
        model, dtype=dtype, device=device, max_cache_len=max(contexts) + max(rows)
    )
    rng = np.random.default_rng(0)
    out = {}
    for ctx in contexts:
        be.reset()
        be.prefill(rng.integers(0, be.vocab_size, ctx))
        for n1 in rows:
            tree = DraftTree.chain(rng.integers(0, be.vocab_size, n1 - 1).tolist())
            # cache_len does not move without commit, so every rep verifies at ctx.
            out[ctx, n1] = _median_ms(partial(be.verify, 7, tree, False), reps)
    return out


def profile_hf(
    model: str, dtype: str, device: str, contexts: list[int], reps: int
) -> dict[int, tuple[float, float]]:
    """{context: (median, min) ms} of one cached one-token step through transformers."""
    from transformers import AutoModelForCausalLM, DynamicCache

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype))
    hf = hf.to(dev).eval()  # type: ignore[arg-type]
    out = {}
    with torch.inference_mode():
        for ctx in contexts:
            cache = DynamicCache(config=hf.config)
            ids = torch.randint(0, hf.config.vocab_size, (1, ctx), device=dev)
            hf(input_ids=ids, past_key_values=cache, use_cache=True)
            tok = torch.tensor([[7]], device=dev)

            def step(tok: torch.Tensor = tok, cache: DynamicCache = cache) -> None:
                logits = hf(input_ids=tok, past_key_values=cache, use_cache=True).logits
                logits[0, -1].argmax().item()  # the same host sync the backend pays
                cache.crop(-1)  # drop the step just taken

            out[ctx] = _median_ms(step, reps)
    return out


def _fmt(t: tuple[float, float]) -> str:
    return f"{t[0]:.1f} ({t[1]:.1f})"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="HF-format model directory")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--contexts", default="256,1024")
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--threads", default="", help="comma list of torch thread counts to try")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers comparison")
    a = ap.parse_args(argv)
    contexts = [int(x) for x in a.contexts.split(",")]
    rows = [int(x) for x in a.rows.split(",")]
    threads = [int(x) for x in a.threads.split(",")] if a.threads else [torch.get_num_threads()]
    for nt in threads:
        torch.set_num_threads(nt)
        for dtype in a.dtypes.split(","):
            res = profile_lean(a.model, dtype, a.device, contexts, rows, a.reps)
            print(f"\n== lean verify, {dtype}, threads={nt}: median (min) ms ==")
            print("rows  " + "".join(f"{'ctx=' + str(c):<18}" for c in contexts))
            for n1 in rows:
                print(f"{n1:<6}" + "".join(f"{_fmt(res[c, n1]):<18}" for c in contexts))
            if not a.no_hf:
                hf = profile_hf(a.model, dtype, a.device, contexts, a.reps)
                print(
                    "1 row, transformers DynamicCache: "
                    + "  ".join(f"ctx={c}: {_fmt(hf[c])}" for c in contexts)
                )


if __name__ == "__main__":
    main()
