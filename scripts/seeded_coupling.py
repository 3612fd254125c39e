"""How often a drafted token is the one seeded sampling emits: argmax drafting against
drafting with the sampler's own uniform (a shared-randomness coupling).

Seeded decoding (``core.sampling``) emits each token by inverting the target's CDF, in
token-id order, at a uniform drawn ahead for its position; a drafted token is accepted
when it is that token. Drafting the drafter's most probable token is accepted with the
target's probability of it. A drafter could instead use the same uniform: invert its own
distribution ``q`` at it, in id order, or with each side's tokens sorted by probability
(the sampler would have to sort too). This measures, on the real default model and the
shipped ReDrafter, at each position of seeded continuations of corpus prompts (never
benchmark ones; by default lines 21-26 of `prompts.jsonl`):

- ``argmax``: p[argmax q], argmax drafting's acceptance;
- ``id order`` / ``sorted``: P(inverse CDFs at one uniform agree), each side's CDF in
  token-id order / in its own descending-probability order;
- ``gumbel``: P(argmax(log p + g) = argmax(log q + g)) for one Gumbel noise vector g
  shared by both sides (Gumbel-max sampling, which needs no token order; Monte Carlo);
- ``overlap``: sum min(p, q), the most any rule that emits a sample of ``q`` can agree
  with the target's sample (the maximal coupling); argmax drafting is not such a rule;
- ``best``: E[max p], a perfect argmax drafter's acceptance.

Measured (2026-11-29, AMD EPYC Zen 3, T = 0.8, 6 corpus prompts, 96 tokens each, one-token
drafts): argmax 0.32, id order 0.29, sorted 0.27, best 0.61; with ``q`` sharpened
(``--q-temp 0.8`` / ``0.6``) id order 0.31 / 0.32, sorted 0.29 / 0.31, approaching argmax
drafting (which a one-hot ``q`` is) from below. The coupling does not beat argmax
drafting: the ReDrafter's distribution (trained on greedy continuations, over 4,096 ids
and the context's) is too far from the target's for the intervals to line up, so seeded
speculation stays limited by p[argmax q], about half of the best 0.61. Gumbel-max
coupling and the overlap bound (4 prompts, 64 tokens): argmax 0.361, id order 0.317,
sorted 0.297, gumbel 0.362, overlap 0.394, best 0.603: even the best coupling of the
drafter's distribution would be accepted 0.394 of the time, 3 points above argmax
drafting; what limits seeded speculation is how far ``q`` is from ``p``, not the coupling.

On greedy contexts instead (``--context-temp 0``; the distributions still at T = 0.8;
2026-11-29, AMD EPYC Zen 4, the shipped drafter of session q, 6 prompts x 96 tokens):
argmax 0.447, overlap 0.474, best 0.700, against 0.340 / 0.403 / 0.613 on seeded
contexts: the drafter, trained on greedy continuations, reaches 64% of the best there and
55% on sampled text. Fine-tuning it on CPU on 56 K tokens of continuations sampled at 0.8
(``train_drafter_timed.py --temp 0.8 --init``, 3 epochs, lr 3e-4) did not close that gap:
argmax 0.343 -> 0.326 (12 prompts x 64 tokens; the same fine-tune on greedy
continuations of the same prompts 0.325: so little data moves the network away).

Example::

    python scripts/seeded_coupling.py --prompts 6 --tokens 96 --temp 0.8
    python scripts/seeded_coupling.py --prompts 12 --tokens 64 --temp 0.8 --path /tmp/rd
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np


def agreement(
    p: np.ndarray, q: np.ndarray, draws: int = 512, gumbel_seed: int = 0
) -> dict[str, float]:
    """(V,) target and draft distributions -> the chance each drafting rule's token is the
    one the target emits at a uniform u ~ U[0, 1) (see the module docstring).

    Example::

        >>> p = np.array([0.5, 0.3, 0.2]); q = np.array([0.2, 0.3, 0.5])
        >>> r = agreement(p, q)
        >>> round(r["argmax"], 2), round(r["id order"], 2), round(r["sorted"], 2)
        (0.2, 0.4, 0.3)
    """
    if p.shape != q.shape or p.ndim != 1:
        raise ValueError(f"p and q must be (V,) alike, got {p.shape} and {q.shape}")
    ids = np.arange(p.size)

    def overlap(order_p: np.ndarray, order_q: np.ndarray) -> float:
        hp, hq = np.empty(p.size), np.empty(q.size)  # each token's interval end, per side
        hp[order_p], hq[order_q] = np.cumsum(p[order_p]), np.cumsum(q[order_q])
        lo = np.maximum(hp - p, hq - q)
        return float(np.clip(np.minimum(hp, hq) - lo, 0.0, None).sum())

    # Gumbel-max coupling: each token x gets one Gumbel g_x shared by both sides; each
    # side emits argmax(log p + g) (an exact sample of p), the drafter argmax(log q + g).
    # Monte Carlo over ``draws`` noise vectors, on the tokens either side gives mass to.
    live = np.flatnonzero((p > 1e-9) | (q > 1e-9))
    g = np.random.default_rng(gumbel_seed).gumbel(size=(draws, live.size))  # (draws, n)
    with np.errstate(divide="ignore"):
        lp, lq = np.log(p[live]), np.log(q[live])
    gumbel = float(np.mean(np.argmax(lp + g, axis=1) == np.argmax(lq + g, axis=1)))
    return {
        "argmax": float(p[int(np.argmax(q))]),
        "id order": overlap(ids, ids),
        "sorted": overlap(np.lexsort((ids, -p)), np.lexsort((ids, -q))),
        "gumbel": gumbel,
        "overlap": float(np.minimum(p, q).sum()),
        "best": float(p.max()),
    }


class _Rows:
    """What the compiled ReDrafter step reads from its backend, from precomputed residual
    rows (L, C) of a whole text (``hidden_len``: the cache length being replayed)."""

    def __init__(self, rows: Any) -> None:
        self.rows, self.hidden_len = rows, 0

    def keep_hidden_rows(self) -> None:
        """Every row is there already."""

    def last_residual(self) -> Any:
        return self.rows[self.hidden_len - 1]

    def residual_rows(self, start: int) -> tuple[int, list[Any]]:
        return start, ([self.rows[start : self.hidden_len]] if start < self.hidden_len else [])


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path,
                    default=Path(__file__).resolve().parents[1] / "../shared/corpus/prompts.jsonl")
    ap.add_argument("--first", type=int, default=20, help="first corpus line used")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--context-temp", type=float, default=None,
                    help="the continuations' own temperature (0: greedy; default --temp)")
    ap.add_argument("--path", type=Path, default=None,
                    help="a ReDrafter checkpoint directory (default: the shipped one)")
    ap.add_argument("--q-temp", type=float, default=1.0,
                    help="the draft distribution raised to 1 / this (its own temperature)")
    args = ap.parse_args()
    if (args.prompts < 1 or args.tokens < 2 or args.first < 0 or not args.temp > 0.0
            or not args.q_temp > 0.0):
        raise SystemExit(f"need prompts >= 1, tokens >= 2, first >= 0, temp > 0, q-temp > 0: "
                         f"got {args.prompts}, {args.tokens}, {args.first}, {args.temp}, "
                         f"{args.q_temp}")
    ctx_temp = args.temp if args.context_temp is None else args.context_temp
    if not ctx_temp >= 0.0:
        raise SystemExit(f"--context-temp must be >= 0, got {ctx_temp}")
    if not args.corpus.is_file():
        raise SystemExit(f"no corpus at {args.corpus} (it lives in ../shared/corpus)")
    if args.path is not None and not (args.path / "config.json").is_file():
        raise SystemExit(f"--path {args.path}: no ReDrafter checkpoint there (no config.json)")

    import torch

    import draftwise
    from draftwise.backends.cuda.llama import rms_norm

    lines = args.corpus.read_text().splitlines()[args.first : args.first + args.prompts]
    prompts = [json.loads(line)["prompt"] for line in lines]
    model = draftwise.load(backend="torch", dtype="float32", invariant=False)
    be, net = model.backend, model.backend.model
    be.keep_hidden_rows()
    spec = "redrafter:bw=1,t=1" + ("" if args.path is None else f",path={args.path}")
    drafter = model.drafter(spec)
    step = drafter.net
    vocab = net.embed.shape[0]
    got: dict[str, list[float]] = {}
    for i, prompt in enumerate(prompts):
        ids = model.encode_prompt(prompt)
        text = draftwise.generate(model, prompt, max_tokens=args.tokens, drafter="none",
                                  temperature=ctx_temp, seed=i)
        out = model.tokenizer.encode(text, add_special_tokens=False)
        be.reset()
        be.prefill(np.array(ids + out[:-1], np.int64))
        _, pieces = be.residual_rows(0)
        rows = torch.cat(pieces).float()  # (L, C) before the final norm
        step.backend = _Rows(rows)
        drafter.reset()
        for j in range(len(out) - 1):
            ctx = np.array(ids + out[: j + 1], np.int64)
            step.backend.hidden_len = ctx.size - 1
            with torch.no_grad():  # the target's distribution of the token after ctx
                h = rms_norm(rows[ctx.size - 1][None], net.norm.float(), net.cfg.norm_eps)[0]
                logits = (h @ net.lm_head.float().T).double().numpy() / args.temp
            p = np.exp(logits - logits.max())
            p /= p.sum()
            if not step.start(ctx.size - 1, ctx):
                continue
            lq = step.step(np.array([ctx[-1]]), np.array([-1]))[0]  # (K + E,) log-probs
            q = np.zeros(vocab)
            np.add.at(q, step.vocab_ids, np.exp(lq.astype(np.float64) / args.q_temp))
            q /= q.sum()
            for k, v in agreement(p, q).items():
                got.setdefault(k, []).append(v)
        rates = ", ".join(f"{k} {statistics.fmean(v):.3f}" for k, v in got.items())
        print(f"prompt {i + 1}: {rates}", flush=True)


if __name__ == "__main__":
    main()
