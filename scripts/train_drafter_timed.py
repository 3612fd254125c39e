"""The ReDrafter recipe (``draftwise train-drafter``) inside a fixed time, on a GPU lent for
minutes: the same data (the target's greedy continuations with their hidden states and
the prompts' own states, ``training/batch_greedy.py``), network and loss (``training/fit.py``),
but the data is kept in memory (no shards), generated until a deadline, and the number of
epochs is fitted to the time left after timing a few training steps. Every 20th row is
held out, as in the recipe; the held-out chain acceptance of the new network and of the
shipped one are measured on the same rows.

Example (session o's network, on an H200; session q carried it on from there, ``--init``
that network with ``--budget 550 --data-share 0.55 --lr 7e-4``, and session z once more
over greedy paths from sampled starts, ``--temp 0.8 --sample-first 8``: the one that
ships; see ``bench/results/drafter-training-h200``)::

    python scripts/train_drafter_timed.py --model /tmp/SmolLM2-135M-Instruct \\
        --prompts /tmp/train-prompts.jsonl --out $OUT/rd --device cuda --budget 480

A later lent GPU can carry on from a checkpoint: ``--init
draftwise/data/redrafter-smollm2-135m`` starts from that network (its draft vocabulary
too) instead of a fresh one. The data is deterministic (greedy continuations of the same
length-sorted batches for the same ``--prompts`` and ``--batch``), and the held-out rows
are every 20th from the first batch on, so from batch 0 a run holds out the rows the
shipped network was held out from and trains it further on the rest; ``--first-batch
N`` skips the first N batches (an earlier run's ``batches`` in its ``summary.json``) and
trains on prompts it never saw.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from draftwise.backends.cuda.llama import Llama
from draftwise.backends.cuda.redrafter.checkpoint import (
    load_redrafter,
    save_redrafter,
    weights_fingerprint,
)
from draftwise.backends.cuda.redrafter.net import ReDrafterNet
from draftwise.core.drafters.redrafter_ckpt import ReDrafterConfig
from draftwise.errors import DraftwiseError
from draftwise.models.tokenizer import Tokenizer
from draftwise.training.batch_greedy import greedy_continuations, prompt_states
from draftwise.training.distill import read_prompts, shard_prompts
from draftwise.training.fit import TrainSettings, chain_acceptance, choose_vocab, train
from draftwise.training.recipe import target_rows

SHIPPED = Path(__file__).resolve().parents[1] / "draftwise/data/redrafter-smollm2-135m"


class _Deadline(Exception):
    """Training reached the budget's deadline (``keep`` below)."""


def log(msg: str, t0: float) -> None:
    print(f"[{time.time() - t0:7.1f} s] {msg}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--prompts", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--budget", type=float, default=480.0, help="seconds for everything")
    p.add_argument("--started-at", type=float, default=None,
                   help="the budget counts from this Unix time (the lent command's start, "
                        "`date +%%s`: what ran before the script counts too); default: now")
    p.add_argument("--data-share", type=float, default=0.45,
                   help="of the budget, at most, for data")
    p.add_argument("--batch", type=int, default=1024, help="prompts per generation forward")
    p.add_argument("--max-batches", type=int, default=10_000)
    p.add_argument("--gen-len", type=int, default=256)
    p.add_argument("--max-prompt", type=int, default=256)
    p.add_argument("--prefill-rows", type=int, default=128)
    p.add_argument("--train-batch", type=int, default=2048)
    p.add_argument("--context-rows", type=int, default=64)
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--max-epochs", type=float, default=3.0)
    p.add_argument("--t", type=int, default=5)
    p.add_argument("--temp", type=float, default=0.0,
                   help="sample the continuations at this temperature (0: greedy, the recipe's)")
    p.add_argument("--temp-every", type=int, default=1,
                   help="sample only every N-th batch at --temp, the others greedy (a mix)")
    p.add_argument("--sample-first", type=int, default=None,
                   help="a batch sampled at --temp samples only its first N tokens, then "
                        "continues greedily (greedy text from other starts)")
    p.add_argument("--init", type=Path, default=None,
                   help="start from this ReDrafter checkpoint (and its draft vocabulary)")
    p.add_argument("--first-batch", type=int, default=0,
                   help="skip this many batches of the length-sorted prompts (an earlier run's)")
    p.add_argument("--resblocks", type=int, default=None,
                   help="ResBlocks of the network (a fresh one: 1; with --init, more than "
                        "its own adds zero blocks that leave its drafts unchanged until trained)")
    p.add_argument("--context-dim", type=int, default=None,
                   help="a fresh network's context attention width (default 256; 0: none)")
    p.add_argument("--context-heads", type=int, default=None,
                   help="a fresh network's context attention heads (default 4)")
    args = p.parse_args()
    if args.resblocks is not None and not 1 <= args.resblocks <= 8:
        raise SystemExit(f"--resblocks must be 1..8, got {args.resblocks}")
    shape = (args.context_dim, args.context_heads)  # as given (None: not given)
    dim = 256 if args.context_dim is None else args.context_dim
    heads = 4 if args.context_heads is None else args.context_heads
    if dim < 0 or heads < 1 or dim % 16 or dim % heads:
        raise SystemExit(f"--context-dim {dim} must be 0 or a multiple of 16 (the compiled "
                         f"step's) and of --context-heads {heads}")
    if args.init is not None and not (args.init / "config.json").is_file():
        raise SystemExit(f"--init {args.init}: no ReDrafter checkpoint there (no config.json)")
    if args.first_batch < 0:
        raise SystemExit(f"--first-batch must be >= 0, got {args.first_batch}")
    if not (args.temp >= 0.0 and args.temp < float("inf")):
        raise SystemExit(f"--temp must be a finite number >= 0, got {args.temp}")
    if args.sample_first is not None and args.sample_first < 0:
        raise SystemExit(f"--sample-first must be >= 0, got {args.sample_first}")
    if args.sample_first is not None and args.temp == 0.0:
        raise SystemExit(f"--sample-first {args.sample_first} samples at --temp: give a --temp > 0")
    if args.temp_every < 1:
        raise SystemExit(f"--temp-every must be >= 1, got {args.temp_every}")
    t0 = time.time() if args.started_at is None else args.started_at
    if not (t0 <= time.time() < t0 + args.budget):
        raise SystemExit(f"--started-at {args.started_at}: not within the last --budget "
                         f"{args.budget} seconds")
    dev = torch.device(args.device)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    prompts = read_prompts(args.prompts)
    n_batches = min(args.max_batches, len(prompts) // args.batch)
    if args.first_batch >= n_batches:
        raise SystemExit(f"--first-batch {args.first_batch}: the prompts make {n_batches} batches")
    ordered = shard_prompts(tok, prompts[: n_batches * args.batch], args.batch, args.max_prompt)
    embed, _ = target_rows(args.model)
    tid, fp = Tokenizer.from_dir(args.model).identity(), weights_fingerprint(embed)
    start = None  # --init's network, checked against this model before any slow work
    if args.init is not None:
        try:
            start = load_redrafter(args.init, embed, tid, fp)
        except DraftwiseError as e:
            raise SystemExit(f"--init: {e}") from None
        have = (start.cfg.context_dim, start.cfg.context_heads)
        if any(g is not None and g != h for g, h in zip(shape, have, strict=True)):
            raise SystemExit(f"--context-dim/--context-heads: --init {args.init} has "
                             f"{have[0]}/{have[1]}")
        if args.resblocks is not None:
            try:
                start = start.grown(args.resblocks)
            except DraftwiseError as e:
                raise SystemExit(f"--resblocks: {e}") from None
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    model = Llama.load(args.model, dtype, dev, max_cache_len=1)
    log(f"{len(prompts)} prompts, {n_batches} batches of {args.batch}; model on {dev}", t0)
    parts: list[tuple[np.ndarray, ...]] = []
    sampled_parts: list[np.ndarray] = []  # (rows,) bool: the row's continuation was sampled
    for i in range(args.first_batch, n_batches):
        if time.time() - t0 > args.data_share * args.budget:
            log(f"data deadline: {i} of {n_batches} batches", t0)
            break
        ids = ordered[i * args.batch : (i + 1) * args.batch]
        temp = args.temp if i % args.temp_every == args.temp_every - 1 else 0.0
        tokens, hidden, valid = greedy_continuations(
            model, ids, args.gen_len, tok.eos_token_id, args.prefill_rows, temp, seed=i,
            sample_first=args.sample_first,
        )
        ptok, phid, pvalid, _ = prompt_states(model, ids, args.max_prompt, args.prefill_rows)
        parts.append((tokens, hidden, valid, ptok, phid, pvalid))
        sampled_parts.append(np.full(tokens.shape[0], temp > 0.0))
        log(f"batch {i} (T = {temp}): {int(valid.sum())} tokens", t0)
    del model
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    g_tokens, g_hidden, g_valid, p_tok, p_hid, p_val = (
        np.concatenate([q[k] for q in parts]) for k in range(6)
    )
    sampled = np.concatenate(sampled_parts)
    del parts
    if g_tokens.shape[0] < 2:
        raise SystemExit(f"{g_tokens.shape[0]} row(s) of data: some are held out, so 2 at least")
    held_rows = np.arange(g_tokens.shape[0]) % 20 == 19
    held_rows[-1] |= not held_rows.any()  # (fewer than 20 rows: the last one)
    tokens, hidden, valid = (a[~held_rows] for a in (g_tokens, g_hidden, g_valid))
    held = (g_tokens[held_rows], g_hidden[held_rows], g_valid[held_rows])
    prompt = tuple(a[~held_rows] for a in (p_tok, p_hid, p_val))
    held_prompt = tuple(a[held_rows] for a in (p_tok, p_hid, p_val))
    held_sampled = sampled[held_rows]
    del g_tokens, g_hidden, g_valid, p_tok, p_hid, p_val  # the splits are copies
    t_data = time.time() - t0
    log(f"data: {int(valid.sum())} train tokens, {int(held[2].sum())} held out", t0)

    if start is not None:  # its vocabulary and shapes
        cfg, vocab = start.cfg, start.vocab_ids.numpy()
        out_ids = tokens[valid].astype(np.int64)
        cover = float(np.isin(out_ids, vocab).mean()) if out_ids.size else 0.0
    else:
        vocab, cover = choose_vocab(tokens, valid, 4096, int(embed.shape[0]))
        cfg = ReDrafterConfig(
            int(embed.shape[1]), int(embed.shape[0]), int(vocab.size), args.resblocks or 1,
            tid, fp, args.model.name, context_dim=dim, context_heads=heads,
        )
    s = TrainSettings(args.t, 1.0, args.lr, args.train_batch, ckpt_every=10**9,
                      context_rows=args.context_rows, device=args.device)
    roots = int(valid[:, :-1].sum())
    per_epoch = max(1, roots // args.train_batch)
    # time a few steps on a throwaway network (same shapes), then fit the epochs
    torch.manual_seed(0)
    probe = ReDrafterNet(cfg, embed, torch.from_numpy(vocab))
    stamps: dict[int, float] = {}

    def stamp(step: int, total: int, loss: float) -> None:
        stamps[step] = time.time()

    with tempfile.TemporaryDirectory() as tmp:  # steps 10..30 (not the data's move)
        probe_s = replace(s, epochs=30.5 / per_epoch)
        train(probe, tokens, hidden, valid, Path(tmp), probe_s, stamp, prompt=prompt)
    step_s = (stamps[30] - stamps[10]) / 20
    del probe
    left = args.budget - (time.time() - t0) - 40  # evaluation and saving
    epochs = max(0.2, min(args.max_epochs, left / (step_s * per_epoch)))
    log(f"{roots} roots, {per_epoch} steps an epoch, {step_s * 1000:.1f} ms a step: "
        f"{epochs:.2f} epochs", t0)
    torch.manual_seed(0)
    net = start if start is not None else ReDrafterNet(cfg, embed, torch.from_numpy(vocab))
    args.out.mkdir(parents=True, exist_ok=True)
    t2 = time.time()

    stop_at = t0 + args.budget - 40  # evaluation and saving after it
    losses: list[float] = []

    def keep(step: int, total: int, loss: float) -> None:
        """The network so far every 1000 steps (a run cut off by its machine's time limit
        still leaves one: what a lent GPU's command wrote comes back even when it timed
        out), and training ends at the budget's deadline even where steps ran slower
        than the probe's."""
        losses.append(loss)
        if step % 1000 == 0:
            save_redrafter(net, args.out)
        if step < total and time.time() > stop_at:
            raise _Deadline

    stopped = False
    try:
        train(net, tokens, hidden, valid, args.out, replace(s, epochs=epochs), keep,
              prompt=prompt)
    except _Deadline:
        net.eval()
        stopped = True
        log(f"deadline: training stopped after {len(losses)} steps", t0)
    t_train = time.time() - t2
    log(f"trained: last losses {[round(x, 3) for x in losses[-3:]]}", t0)
    save_redrafter(net, args.out)
    (args.out / "train_state.pt").unlink(missing_ok=True)

    def heldout(network: ReDrafterNet) -> dict[str, list[float]]:
        """Held-out chain acceptance, all rows and (a mix) greedy / sampled rows apart."""
        kinds = {"": np.ones_like(held_sampled)}
        if held_sampled.any() and not held_sampled.all():
            kinds |= {"_greedy": ~held_sampled, "_sampled": held_sampled}
        return {
            kind: [round(float(a), 4) for a in chain_acceptance(
                network, *(a[m] for a in held), args.t, prompt=tuple(a[m] for a in held_prompt))]
            for kind, m in kinds.items()
        }

    acc = heldout(net)
    summary: dict[str, object] = {
        "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
        "batches": len(held_rows) // args.batch, "gen_len": args.gen_len,
        "max_prompt": args.max_prompt, "first_batch": args.first_batch, "temp": args.temp,
        "temp_every": args.temp_every, "sample_first": args.sample_first,
        "sampled_rows": int(sampled.sum()),
        "init": None if args.init is None else str(args.init),
        "resblocks": cfg.resblocks, "context_dim": cfg.context_dim,
        "context_heads": cfg.context_heads,
        "train_tokens": int(valid.sum()), "heldout_tokens": int(held[2].sum()),
        "coverage": round(cover, 4), "epochs": round(epochs, 3), "steps": len(losses),
        "stopped_at_deadline": stopped,
        "train_batch": args.train_batch, "context_rows": args.context_rows, "lr": args.lr,
        "step_ms": round(1000 * t_train / max(1, len(losses)), 2),
        "data_s": round(t_data, 1), "train_s": round(t_train, 1),
        **{f"heldout_chain_acceptance{k}": v for k, v in acc.items()},
        "last_losses": [round(x, 3) for x in losses[-5:]],
    }
    if SHIPPED.is_dir():  # the shipped network on the same held-out rows
        old = load_redrafter(SHIPPED, embed, cfg.tokenizer_id, cfg.fingerprint).to(dev)
        summary |= {f"shipped_heldout_chain_acceptance{k}": v for k, v in heldout(old).items()}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    log(json.dumps(summary), t0)


if __name__ == "__main__":
    sys.exit(main())
