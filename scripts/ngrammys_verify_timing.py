"""Tree vs batch verification of the same N-Grammys drafts: median forward time per path.

For each (k, w), k random drafts of length w after a ``--context``-token prompt are
verified as one tree (``DraftTree.from_paths``, shared prefixes merged) and as the batch
of k rows (``verify_batch``); prints a markdown table of medians in ms.

Example::

    python scripts/ngrammys_verify_timing.py --ks 1,5,10,20 --ws 2,4,8 --reps 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import draftwise
from draftwise.core.tree import DraftTree


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ks", default="1,5,10,20")
    p.add_argument("--ws", default="2,4,8")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--backend", default="torch")
    args = p.parse_args()
    model = draftwise.load(backend=args.backend)
    be = model.backend
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, be.vocab_size, args.context)
    be.reset()
    be.prefill(prompt[:-1])
    root = int(prompt[-1])
    print("| k | w | tree nodes | tree ms | batch ms | faster |\n|---|---|---|---|---|---|")
    for k in (int(x) for x in args.ks.split(",")):
        for w in (int(x) for x in args.ws.split(",")):
            drafts = rng.integers(0, be.vocab_size, (k, w))
            drafts[: k // 2, 0] = drafts[0, 0]  # some shared prefixes, as real drafts have
            tree = DraftTree.from_paths(drafts.tolist())
            times: dict[str, list[float]] = {"tree": [], "batch": []}
            for _ in range(args.reps):
                for path in ("tree", "batch"):
                    t = time.perf_counter()
                    if path == "tree":
                        be.verify(root, tree, need_logits=False)
                    else:
                        be.verify_batch(root, drafts)
                    times[path].append(time.perf_counter() - t)
                    be.trim(args.context - 1)
            tm, bm = (statistics.median(times[x]) * 1e3 for x in ("tree", "batch"))
            print(f"| {k} | {w} | {len(tree)} | {tm:.1f} | {bm:.1f} | {'tree' if tm <= bm else 'batch'} |",
                  flush=True)


if __name__ == "__main__":
    main()
