"""Fine-tune a ReDrafter checkpoint on greedy-continuation shards, with or without the
target's own distribution as a second signal (``training.fit.soft_term``), and measure
it on the held-out rows before and after.

The shards are ``draftwise train-drafter``'s (``<out>/data/shard-*.npz``); the first
``--shards`` of them are used, every 20th row held out as the recipe does, so a run on
the first shards of a full run's data holds out the rows the full recipe held out. Two
measures on the held-out roots (the first ~4,100, as ``train-drafter`` reports):

- ``chain``: the share of roots whose first k greedy guesses are all right (k = 1..t);
- ``seeded``: the target's probability, at ``--eval-temp``, of the drafter's first guess:
  how often seeded sampling emits the drafted token (``scripts/seeded_coupling.py``).

``--init fresh`` trains the shipped network's shape and vocabulary from new weights.

Example (the shipped drafter, one epoch on 16 shards, soft term on and off)::

    python scripts/kd_finetune.py --data /tmp/rd/data --shards 16 --init shipped \
        --out /tmp/kd1 --soft-weight 1 --epochs 1 --lr 2e-4
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np


def load_first(data: Path, n: int) -> tuple[np.ndarray, ...]:
    """tokens, hidden, valid (N, L) and the prompts' (N, W) of the first ``n`` shards."""
    files = sorted(data.glob("shard-*.npz"))[:n]
    if len(files) < n:
        raise SystemExit(f"{data} has {len(files)} shards, asked for {n}")
    parts = [np.load(f) for f in files]
    keys = ("tokens", "hidden", "valid", "prompt_tokens", "prompt_hidden", "prompt_valid")
    return tuple(np.concatenate([p[k] for p in parts]) for k in keys)


def first_guess_prob(
    net: Any, held: tuple[np.ndarray, ...], prompt: tuple[np.ndarray, ...], out_rows: Any,
    temp: float, n: int = 4096,
) -> tuple[float, float]:
    """(mean p_temp(first guess), share of first guesses equal to the greedy label) over
    the held-out roots of the first rows holding about ``n`` of them."""
    import torch

    from draftwise.training.fit import _context_batch, _with_prompt, context_unroll

    tokens, hidden, valid = _with_prompt(*held, prompt)
    offset, roots = prompt[0].shape[1], held[2]
    tk, hd, vd = (torch.from_numpy(a) for a in (tokens.astype(np.int64), hidden, valid))
    probs, rights = [], []
    with torch.inference_mode():
        for r0 in range(0, tk.shape[0], 2):
            rows = torch.arange(r0, min(r0 + 2, tk.shape[0]))
            length = roots.shape[1]
            pos = offset + torch.arange(length - 1).expand(rows.numel(), -1)  # (R, L-1)
            inputs, h, want, *ctx, hs = _context_batch(net, tk, hd, vd, rows, pos, 1)
            col = context_unroll(net, inputs, h, *ctx)[..., 0, :].argmax(-1)  # (R, Q)
            logits = hs[..., 0, :].float() @ out_rows.T / temp  # (R, Q, V)
            p = torch.softmax(logits, -1).gather(-1, net.vocab_ids[col][..., None])[..., 0]
            keep = torch.from_numpy(roots[r0 : r0 + rows.numel(), :-1])  # (R, Q)
            probs.append(p[keep])
            rights.append((col == want[..., 0])[keep])
            if sum(x.numel() for x in probs) >= n:
                break
    return float(torch.cat(probs).mean()), float(torch.cat(rights).float().mean())


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a train-drafter data folder")
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--init", default="shipped",
                    help="a checkpoint folder, 'shipped', or 'fresh' (the shipped network's "
                         "shape and vocabulary, new random weights: training from scratch)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--soft-weight", type=float, default=0.0)
    ap.add_argument("--soft-temp", type=float, default=1.0)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--t", type=int, default=5)
    ap.add_argument("--eval-temp", type=float, default=0.8)
    args = ap.parse_args()
    if args.shards < 1 or args.epochs <= 0 or args.lr <= 0 or args.soft_weight < 0:
        raise SystemExit(f"need shards >= 1, epochs > 0, lr > 0, soft-weight >= 0: got "
                         f"{args.shards}, {args.epochs}, {args.lr}, {args.soft_weight}")

    import torch

    from draftwise.backends.cuda.redrafter.checkpoint import load_redrafter, weights_fingerprint
    from draftwise.backends.cuda.redrafter.net import ReDrafterNet
    from draftwise.drafting.redrafter import SHIPPED
    from draftwise.models.resolve import resolve_model
    from draftwise.models.tokenizer import Tokenizer
    from draftwise.training.fit import TrainSettings, chain_acceptance, train
    from draftwise.training.recipe import target_rows

    tk, hd, vd, ptk, phd, pvd = load_first(args.data, args.shards)
    held_rows = np.arange(tk.shape[0]) % 20 == 19
    train_set = tuple(a[~held_rows] for a in (tk, hd, vd))
    held = tuple(a[held_rows] for a in (tk, hd, vd))
    prompt = tuple(a[~held_rows] for a in (ptk, phd, pvd))
    held_prompt = tuple(a[held_rows] for a in (ptk, phd, pvd))
    model_dir = resolve_model(None)
    embed, out_rows = target_rows(model_dir)  # (V, C) each
    init = SHIPPED if args.init in ("shipped", "fresh") else Path(args.init).expanduser()
    net = load_redrafter(init, embed, Tokenizer.from_dir(model_dir).identity(),
                         weights_fingerprint(embed))
    if args.init == "fresh":
        torch.manual_seed(0)
        net = ReDrafterNet(net.cfg, embed, net.vocab_ids)

    def measure() -> dict[str, Any]:
        net.eval()
        chain = chain_acceptance(net, *held, args.t, prompt=held_prompt)
        seeded, first = first_guess_prob(net, held, held_prompt, out_rows, args.eval_temp)
        return {"chain": [round(float(a), 4) for a in chain],
                "tokens_per_step": round(1 + float(chain.sum()), 3),
                "seeded": round(seeded, 4), "first": round(first, 4)}

    before = measure()
    print(json.dumps({"before": before}), flush=True)
    s = TrainSettings(args.t, args.epochs, args.lr, 512, ckpt_every=100,
                      soft_weight=args.soft_weight, soft_temp=args.soft_temp)
    head = out_rows[net.vocab_ids]  # (K, C)
    t0 = time.time()
    torch.manual_seed(0)
    losses = train(net, *train_set, args.out, s, prompt=prompt, head=head)
    after = measure()
    print(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                      "train_rows": int(train_set[0].shape[0]), "held_rows": int(held[0].shape[0]),
                      "steps": len(losses), "train_s": round(time.time() - t0, 1),
                      "before": before, "after": after}, indent=1))


if __name__ == "__main__":
    main()
