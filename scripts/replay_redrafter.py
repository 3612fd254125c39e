"""Replay ReDrafter settings against the greedy outputs of a finished bench: MAT without
verifying.

At temperature 0 a speculative run is fixed by the plain greedy output (the model accepts
the longest draft path that agrees with it, then adds the next greedy token), and a
ReDrafter's trees depend only on the context and the model's hidden states. So this
script prefills each turn's prompt and ``none`` output once on the torch backend (the
hidden state of every position), then runs the real drafter step by step against a
stand-in backend that serves those hidden states, and counts what the model would have
accepted. Numbers are estimates (a prefill's hidden states differ from a verify pass's by
rounding); MAT claims still come from ``draftwise bench``. It also tries node orders for
the tree budget the drafter itself does not use (``--depth-bias``: path log-prob plus
``b`` per depth; ``b < 0`` prefers shallow nodes).

Example (the held-out corpus set, first turns, two settings)::

    OMP_NUM_THREADS=2 python scripts/replay_redrafter.py runs/corpus-dev \\
        --prompts /tmp/corpus-dev.jsonl --drafters "redrafter:bw=8,t=5,extend=false,redrafter:bw=8,t=5"
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np


class ReplayHidden:
    """What a ReDrafter step reads from its backend, served from precomputed rows."""

    def __init__(self, rows: Any) -> None:
        self.rows = rows  # (L, C): the hidden state of every position of the text
        self.hidden_len = 0  # the cache length of the step being replayed

    def keep_hidden_rows(self) -> None:
        """Every row is there already."""

    def last_hidden(self) -> Any:
        return self.rows[self.hidden_len - 1]

    def hidden_rows(self, start: int) -> tuple[int, Any]:
        return start, (self.rows[start : self.hidden_len] if start < self.hidden_len else None)


def accepted(tokens: np.ndarray, parents: np.ndarray, keep: np.ndarray, truth: list[int]) -> int:
    """Tokens of the longest kept path that ``truth`` (the output after the root) follows."""
    child = {(int(parents[i]), int(tokens[i])): i for i in np.flatnonzero(keep)}
    at, n = -1, 0
    while n < len(truth) and (at, truth[n]) in child:
        at = child[(at, truth[n])]
        n += 1
    return n


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("bench", type=Path, help="a bench output folder (its none records)")
    p.add_argument("--prompts", type=Path, required=True)
    p.add_argument("--drafters", required=True, help="comma-separated redrafter specs")
    p.add_argument("--budget", type=int, default=16)
    p.add_argument("--depth-bias", default="0", help="comma-separated values to try")
    p.add_argument("--turns", type=int, default=2, help="turns per item to replay")
    p.add_argument("--extra-bias-quantile", default=None,
                   help="comma-separated quantiles of the trained biases for the extra ids "
                   "(core.drafters.context_vocab; default: the drafter's own)")
    args = p.parse_args()

    import draftwise
    from draftwise.apps.bench.cli import _names
    from draftwise.apps.bench.prompts import read_prompts
    from draftwise.apps.bench.records import read_results
    from draftwise.apps.bench.runner import Chat
    from draftwise.core.drafters.context_vocab import extra_bias

    data = read_results(args.bench)
    recs = [r for r in data["records"] if r["method"] == "none" and r["pass_no"] == 1]
    model = draftwise.load(data["config"].get("model_dir"), backend="torch", dtype="float32",
                           invariant=False)
    be = model.backend
    be.keep_hidden_rows()
    chat = Chat(model.tokenizer)
    items = {it.id: it for it in read_prompts(args.prompts)}
    texts: list[tuple[str, list[int], list[int], Any]] = []  # category, prompt, output, rows
    by_item: dict[str, list[dict]] = defaultdict(list)
    for r in recs:
        by_item[r["prompt_id"]].append(r)
    for pid, turns in by_item.items():
        messages: list[dict[str, str]] = []
        for r in sorted(turns, key=lambda x: int(x["turn"]))[: args.turns]:
            messages.append({"role": "user", "content": items[pid].turns[int(r["turn"]) - 1]})
            ids = chat.encode(messages)
            out = list(r["token_ids"])
            be.reset()
            be.prefill(np.array(ids + out[:-1], np.int64))
            first, rows = be.hidden_rows(0)
            assert first == 0
            texts.append((r["category"], ids, out, rows.clone()))
            messages.append({"role": "assistant", "content": chat.answer(out)})
    print(f"{len(texts)} turns, {sum(len(t[2]) for t in texts)} tokens")
    biases = [float(x) for x in args.depth_bias.split(",")]
    quantiles = [None] if args.extra_bias_quantile is None else [
        float(x) for x in args.extra_bias_quantile.split(",")
    ]
    runs = [(spec, q) for spec in _names(args.drafters) for q in quantiles]
    for spec, q in runs:
        d = model.drafter(spec)
        step = d.net
        if q is not None:
            step._xbias = extra_bias(step.net.bias.detach().float().numpy(), q)
            spec = f"{spec} extra_bias_quantile={q}"
        per: dict[float, dict[str, list[int]]] = {b: defaultdict(list) for b in biases}
        for cat, ids, out, rows in texts:
            fake = ReplayHidden(rows)
            step.backend = fake
            d.reset()
            for b in biases:
                j = 0
                while j < len(out):
                    fake.hidden_len = len(ids) + j
                    ctx = np.array(ids + out[: j + 1], np.int64)
                    d.propose(ctx, 10**6)
                    n = 0
                    if d.last is not None and d.last.tree.tokens.size:
                        tr = d.last.tree
                        score = d.last.path_logp + b * tr.depth  # (N,)
                        order = np.lexsort((np.arange(score.size), tr.depth, -score))
                        keep = np.zeros(score.size, bool)
                        keep[order[: args.budget]] = True
                        # a kept node's parent is kept (b <= 0); else keep closed anyway
                        for i in np.flatnonzero(keep):
                            q = int(tr.parents[i])
                            while q >= 0 and not keep[q]:
                                keep[q] = True
                                q = int(tr.parents[q])
                        n = accepted(tr.tokens, tr.parents, keep, out[j + 1 :])
                    per[b][cat].append(1 + n)
                    j += 1 + n
        for b in biases:
            allv = [x for v in per[b].values() for x in v]
            cats = " ".join(f"{c}={statistics.fmean(v):.2f}" for c, v in sorted(per[b].items()))
            print(f"{spec} depth_bias={b}: MAT {statistics.fmean(allv):.3f} ({len(allv)} steps)"
                  f"  {cats}", flush=True)
        st = d.stats()  # whole trees (no budget cut): the dedup compression
        print(f"{spec}: {st['packed']} tree nodes for {st['unpacked']} beam tokens "
              f"({st['unpacked'] / max(1, st['packed']):.2f}x)", flush=True)


if __name__ == "__main__":
    main()
