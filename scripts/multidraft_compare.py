"""Sample-and-match vs multi-draft recursive rejection sampling, on real distributions.

For positions of the default model's own greedy outputs (own prompts), ``p`` is the
model's distribution at temperature T and ``q`` a draft's (the early exit of the first
``--layers`` layers) at the same T. Prints, per T and k, the mean first-level acceptance
of: sample-and-match with the draft's top-k tokens as children (what ``draft``/``card``
do; exact: the target mass on them) and recursive rejection with k i.i.d. draft samples
(Monte Carlo, ``core.multidraft``). One torch thread.

    OMP_NUM_THREADS=1 python scripts/multidraft_compare.py --layers 24 --tokens 32
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import draftwise
from draftwise.backends.cuda.draft import early_exit
from draftwise.backends.cuda.llama import causal_mask
from draftwise.core.multidraft import expected_acceptance
from draftwise.core.sampling import SamplingParams, probabilities

PROMPTS = [
    "Explain what a hash map is and give a short Python example that counts words.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List the planets of the solar system in order, with one fact about each planet.",
]


def all_logits(llama, ids: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    """(T, V) float32 logits after every prefix of ``ids`` in one causal forward."""
    with torch.inference_mode():
        t = torch.from_numpy(ids)
        out = llama.forward(t, torch.arange(ids.size), 0, causal_mask(ids.size, 0, t.device), True)
        return out.float().numpy()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--trials", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(1)
    m = draftwise.load(backend="torch", dtype="float32")
    be = m.backend
    draft = early_exit(be.model, args.layers, be.context_limit)
    rng = np.random.default_rng(0)
    rows = {}
    for prompt in PROMPTS:
        ids = m.encode_prompt(prompt)
        last = None
        for r in draftwise.stream_generate(m, prompt, drafter="none", max_tokens=args.tokens):
            last = r
        seq = np.asarray(ids + last.token_ids, np.int64)
        tl, dl = all_logits(be.model, seq), all_logits(draft, seq)
        for temp in (0.7, 1.0):
            params = SamplingParams(temperature=temp)
            for pos in range(len(ids) - 1, seq.size - 1):
                p = probabilities(tl[pos], seq[:0], params)
                q = probabilities(dl[pos], seq[:0], params)
                for k in (1, 2, 4):
                    match, rrs = expected_acceptance(p, q, k, rng, args.trials)
                    rows.setdefault((temp, k), []).append((match, rrs))
    print(f"draft: first {args.layers} layers; {args.tokens} positions x {len(PROMPTS)} prompts")
    print("T | k | sample-and-match (top-k children) | recursive rejection (k samples)")
    for (temp, k), vals in sorted(rows.items()):
        a = np.asarray(vals)
        print(f"{temp} | {k} | {a[:, 0].mean():.3f} | {a[:, 1].mean():.3f}")


if __name__ == "__main__":
    main()
