"""Choose L for the training-free early-exit draft of the default model: for each L, greedy
decoding with the first L layers (+ final norm + head) drafting, on a few own prompts;
prints MAT (tokens per step), draft and verify ms per step, tokens/s, and whether the
output equals plain decoding. One torch thread; short generations.

    OMP_NUM_THREADS=1 python scripts/early_exit_sweep.py --layers 2,4,6,8 --max-tokens 48
"""

from __future__ import annotations

import argparse
import time

import torch

import draftwise
from draftwise.backends.cuda.draft import TorchDraftLM, early_exit
from draftwise.core.drafters.draft_model import DraftModelDrafter

PROMPTS = [
    "Explain what a hash map is and give a short Python example that counts words.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List the planets of the solar system in order, with one fact about each planet.",
]


def run(model, drafter, prompt, n):  # type: ignore[no-untyped-def]
    last = None
    t0 = time.perf_counter()
    for r in draftwise.stream_generate(model, prompt, drafter=drafter, max_tokens=n):
        last = r
    return last, time.perf_counter() - t0


def cpu_ms(fn, repeats: int = 5) -> float:  # type: ignore[no-untyped-def]
    """Minimum thread CPU time of ``fn()`` in ms (wall time is noisy on a shared machine)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best * 1e3


def costs(model, layers: list[int], head: int) -> None:  # type: ignore[no-untyped-def]
    """CPU ms of one target verify (1 and 5 rows) and one draft forward (1 and 4 rows)."""
    import numpy as np

    from draftwise.core.tree import DraftTree

    be = model.backend
    ids = np.asarray(model.encode_prompt(PROMPTS[0]))
    be.reset()
    be.prefill(ids[:-1])
    for rows in (1, 5):
        tree = DraftTree.chain(ids[: rows - 1].tolist())
        ms = cpu_ms(lambda t=tree: be.verify(int(ids[-1]), t, False))
        print(f"target verify {rows} rows: {ms:.1f} ms")
    for L in layers:
        lm = TorchDraftLM(early_exit(be.model, L, be.context_limit + 512, head), be.vocab_size)
        lm.prefill(ids[:-1])
        for rows in (1, 4):
            mask = np.eye(rows, dtype=bool)

            def one(lm=lm, rows=rows, mask=mask) -> None:  # type: ignore[no-untyped-def]
                lm.expand(ids[-rows:], np.zeros(rows, np.int64), mask, 4)
                lm.keep(np.zeros(0, np.int64), 0)

            print(f"draft L={L} head={head or 'full'} {rows} rows: {cpu_ms(one):.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="2,4,6,8,12")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--modes", default="chain:4,tree:4x4x5")
    ap.add_argument("--head", type=int, default=0, help="draft from the first N ids only")
    ap.add_argument("--cost", action="store_true", help="only CPU ms per forward")
    args = ap.parse_args()
    torch.set_num_threads(1)
    m = draftwise.load(backend="torch", dtype="float32")
    be = m.backend
    layers = [int(x) for x in args.layers.split(",")]
    if args.cost:
        costs(m, layers, args.head)
        return
    base = {}
    t_none = 0.0
    for p in PROMPTS:
        base[p], dt = run(m, "none", p, args.max_tokens)
        t_none += dt
    n_tok = sum(len(r.token_ids) for r in base.values())
    print(f"none: {n_tok / t_none:.1f} tok/s")
    print("L mode MAT draft_ms verify_ms tok/s identical")
    for L in layers:
        lm = TorchDraftLM(early_exit(be.model, L, be.context_limit + 512, args.head), be.vocab_size)
        for mode in args.modes.split(","):
            kind, _, shape = mode.partition(":")
            if kind == "chain":
                d = DraftModelDrafter.chain(lm, int(shape))
            else:
                beam, topk, depth = (int(x) for x in shape.split("x"))
                d = DraftModelDrafter(lm, beam=beam, topk=topk, depth=depth)
            steps = toks = 0
            dms = vms = tt = 0.0
            same = True
            for p in PROMPTS:
                d.reset()
                r, dt = run(m, d, p, args.max_tokens)
                steps += r.steps
                toks += len(r.token_ids)
                dms += r.draft_ms
                vms += r.verify_ms
                tt += dt
                same &= r.token_ids == base[p].token_ids
            print(f"{L} {mode} {toks / steps:.2f} {dms / steps:.1f} {vms / steps:.1f} "
                  f"{toks / tt:.1f} {same}", flush=True)


if __name__ == "__main__":
    main()
