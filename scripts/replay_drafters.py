"""Replay drafters against the greedy outputs of a finished bench, without the model.

At temperature 0 a speculative run is fully determined by the plain greedy output: the
model accepts the longest draft path that agrees with it and adds the next greedy token.
So a bench's ``none`` records (their token ids) are an oracle: this script runs the real
decoding loop and drafters against an oracle backend that answers from those ids, and
prices each verify pass with the stored device cost curve (``draftwise tune``) instead
of running the model. Drafting and the loop are timed as this process's CPU time, so
other load on the machine does not shift the estimate. It is a tuning aid (seconds
instead of an hour per setting); speed claims still come from ``draftwise bench``.

Example (the auto-vs-grid bench, replayed for two drafters)::

    OMP_NUM_THREADS=1 python scripts/replay_drafters.py bench/results/auto-vs-grid \\
        --prompts ../shared/bench/prompts/specbench.jsonl \\
        --drafters "auto,cacheback:ll=3,table=dynamic"

Priced at a GPU's measured curve instead (``scripts/device_check.py``'s JSON and one of
its shapes): the default model's acceptance at that device's costs, a prediction. The
drafters' bookkeeping (``Background``) then runs inside each verify, as the CUDA
backend runs it while the device works, and only what exceeds the verify's priced ms
counts::

    python scripts/replay_drafters.py bench/results/specbench-4bit-fused \
        --prompts ../shared/bench/prompts/specbench.jsonl --drafters none,auto \
        --curve bench/results/gpu-nvidia-h200/device_check.json:llama-3.1-8b --step-ms 0
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from draftwise.core.autotune import matched
from draftwise.core.backend import Verified
from draftwise.core.costmodel import CostModel
from draftwise.core.decode import Decoder
from draftwise.core.device import DeviceInfo
from draftwise.core.sampling import SamplingParams
from draftwise.core.tree import DraftTree


class OracleBackend:
    """Answers every verify row from the known greedy continuation ``seq``."""

    def __init__(self, vocab_size: int, context_limit: int, cost: CostModel) -> None:
        self.name = "oracle"
        self.vocab_size = vocab_size
        self.context_limit = context_limit
        self.cost = cost
        self.seq: list[int] = []
        self._len = 0
        self.verify_ms = 0.0
        # the CUDA backend's overlap (``Overlapping``): the decoder's ``while_waiting``
        # (drafters' bookkeeping) runs while the device computes the verify, so up to the
        # verify's priced ms of it is off the critical path; None: not modelled (CPU)
        self.while_waiting = None
        self.overlap = False
        self.hidden_ms = 0.0

    @property
    def cache_len(self) -> int:
        return self._len

    def device_info(self) -> DeviceInfo:
        return DeviceInfo(kind="cpu", name="oracle", dtype="none", mode="replay", threads=1)

    def reset(self) -> None:
        self._len = 0

    def trim(self, n: int) -> None:
        self._len = n

    def prefill(self, tokens: np.ndarray) -> None:
        self._len += int(tokens.size)

    def verify(self, root: int, tree: DraftTree, need_logits: bool) -> Verified:
        base = self._len + 1  # seq index of the token after the root
        nxt = np.asarray(self.seq[base:] + [-1] * (tree.max_depth + 1), np.int64)  # (>= D+1,)
        out = np.full(len(tree) + 1, -1, np.int64)  # -1: a row off the true path
        out[0] = nxt[0]
        hit = matched(tree, nxt[: tree.max_depth])  # (N,) node's path equals the output
        out[1:][hit] = nxt[tree.depth[hit]]  # a matched node at depth d predicts token d
        step_ms = float(self.cost.cost(len(tree) + 1, self._len))
        self.verify_ms += step_ms
        if self.overlap and self.while_waiting is not None:
            t0 = time.process_time()
            self.while_waiting()
            self.hidden_ms += min((time.process_time() - t0) * 1e3, step_ms)
        return Verified(out)

    def commit(self, keep: np.ndarray) -> None:
        self._len += int(keep.size)


def read_curve(spec: str) -> CostModel:
    """``path.json:shape`` -> that shape's graph curve (ms by rows) from a device check;
    ``path.json:shape:variant`` -> one of its ``variants`` (the step with other switches)."""
    import json

    path, sep, rest = spec.partition(".json:")
    path += ".json"
    shape, _, variant = rest.partition(":")
    if not sep or not shape or not Path(path).is_file():
        raise SystemExit(f"--curve wants JSON:SHAPE[:VARIANT] with an existing file, got {spec!r}")
    curves = json.loads(Path(path).read_text()).get("curves", {})
    if shape not in curves or "graph_ms" not in curves[shape]:
        raise SystemExit(f"no graph curve for {shape!r} in {path} (has {sorted(curves)})")
    c = curves[shape]
    if variant:
        variants = c.get("variants", {})
        if "graph_ms" not in variants.get(variant, {}):
            raise SystemExit(f"no variant {variant!r} of {shape!r} in {path} (has {sorted(variants)})")
        v = variants[variant]
        return CostModel(rows=v.get("rows", c["rows"]), ms=v["graph_ms"])
    return CostModel(rows=c["rows"], ms=c["graph_ms"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bench", type=Path, help="a bench output folder (its records)")
    p.add_argument("--prompts", type=Path, required=True)
    p.add_argument("--drafters", required=True, help="comma-separated specs, as for the bench")
    p.add_argument("--budget", type=int, default=16)
    p.add_argument("--step-ms", type=float, default=None,
                   help="fixed per-step overhead in ms (default: bench none verify ms - cost(1))")
    p.add_argument("--curve", default=None,
                   help="JSON:SHAPE, a device_check.json and a shape of it: price verify steps "
                        "(and prefill, 64 rows a step) at that device's graph curve; drafters' "
                        "bookkeeping then runs inside the verify, as on CUDA, and up to the "
                        "verify's ms of it is off the critical path")
    args = p.parse_args()
    curve = read_curve(args.curve) if args.curve else None

    import draftwise
    from draftwise.api import Model
    from draftwise.apps.bench.cli import _names
    from draftwise.apps.bench.prompts import read_prompts
    from draftwise.apps.bench.records import read_results
    from draftwise.apps.bench.runner import Chat
    from draftwise.drafting import build_drafter

    data = read_results(args.bench)
    recs = [r for r in data["records"] if r["method"] == "none" and r["pass_no"] == 1]
    real = draftwise.load(data["config"].get("model_dir"), backend="torch", dtype="float32")
    cost = curve if curve is not None else real.assets.cost_profile(quiet=True)
    # the oracle prices with a copy of its own: nothing auto learns may change the prices
    priced = CostModel(rows=cost.rows.astype(int).tolist(), ms=cost.prior, contexts=cost.contexts.astype(int).tolist())
    oracle = OracleBackend(real.backend.vocab_size, real.backend.context_limit, priced)
    oracle.overlap = curve is not None  # a GPU's curve: the CUDA backend overlaps
    model = Model(oracle, real.tokenizer, real.model_dir)
    stop = frozenset(real.tokenizer.eos_token_ids)
    chat = Chat(real.tokenizer)
    items = {it.id: it for it in read_prompts(args.prompts)}
    by_item: dict[str, list[dict]] = defaultdict(list)
    for r in recs:
        by_item[r["prompt_id"]].append(r)
    base_ms = float(cost.cost(1, 200))
    none_verify = statistics.fmean(r["verify_ms"] / r["steps"] for r in recs)
    step_ms = args.step_ms if args.step_ms is not None else max(0.0, none_verify - base_ms)
    print(f"cost(1) = {base_ms:.1f} ms, bench none verify {none_verify:.1f} ms/step: "
          f"per-step overhead {step_ms:.1f} ms")
    # ``auto`` asks for the device profile; the oracle has none, so hand it the real model's
    model.assets.use_cost_profile(cost)
    specs = _names(args.drafters)
    if "none" in specs:  # the simulated baseline first: speedups are against it
        specs = ["none"] + [x for x in specs if x != "none"]
    sim_none: dict[tuple[str, int], float] = {}
    for spec in specs:
        drafter = build_drafter(spec, model.drafting)
        if hasattr(drafter, "observe_verify"):
            # the oracle answers in microseconds: auto must plan with the priced curve,
            # as it would on the device whose curve it is, not learn the oracle's speed
            drafter.observe_verify = lambda *a: None  # type: ignore[method-assign]
        per_cat: dict[str, list[tuple[float, float]]] = defaultdict(list)  # (method tps, none tps)
        tokens = steps = nodes = 0
        host_total = 0.0
        for pid, turns in by_item.items():
            drafter.reset()
            item = items[pid]
            messages: list[dict[str, str]] = []
            for r in sorted(turns, key=lambda x: x["turn"]):
                messages.append({"role": "user", "content": item.turns[r["turn"] - 1]})
                ids = chat.encode(messages)
                oracle.seq = ids + r["token_ids"]
                oracle.verify_ms = oracle.hidden_ms = 0.0
                dec = Decoder(oracle)
                t0 = time.process_time()
                out: list[int] = []
                n_steps = 0
                for st in dec.steps(ids, drafter, SamplingParams(), len(r["token_ids"]) if r["finish_reason"] == "length" else 10**6,
                                    stop_ids=stop, budget=args.budget):
                    out += st.tokens
                    n_steps += 1
                    nodes += st.drafted
                host_ms = (time.process_time() - t0) * 1e3 - oracle.hidden_ms
                assert out == r["token_ids"], (pid, r["turn"])
                host_total += host_ms
                prefill_ms = r["prefill_s"] * 1e3
                if curve is not None:  # the device's own prefill: chunks of its widest step
                    prefill_ms = -(-len(ids) // int(cost.rows[-1])) * float(cost.cost(int(cost.rows[-1]), 0))
                ms = host_ms + oracle.verify_ms + step_ms * n_steps + prefill_ms
                if spec == "none":
                    sim_none[pid, r["turn"]] = ms
                base = sim_none.get((pid, r["turn"]), r["wall_s"] * 1e3)
                per_cat[r["category"]].append((len(out) / ms, len(out) / base))
                tokens += len(out)
                steps += n_steps
                messages.append({"role": "assistant", "content": chat.answer(r["token_ids"])})
        allp = [x for v in per_cat.values() for x in v]
        mean = statistics.fmean(a for a, _ in allp) / statistics.fmean(b for _, b in allp)
        med = statistics.median(a / b for a, b in allp)
        cats = " ".join(f"{c[:5]}={statistics.fmean(a for a, _ in v) / statistics.fmean(b for _, b in v):.2f}"
                        for c, v in per_cat.items())
        print(f"{spec:40s} speedup {mean:.3f}x median {med:.3f}x MAT {tokens / steps:.2f} "
              f"tree {nodes / steps:.1f} host {host_total / steps:.2f} ms/step | {cats}", flush=True)


if __name__ == "__main__":
    main()
