"""Time ``auto``'s host work per step without the model: drafting (what the bench reports
as draft ms/step), the drafters' update, and the loop's own bookkeeping.

The greedy outputs of a finished bench (its ``none`` records) are an oracle: the real
decoding loop and drafters run against a backend that answers from those ids (see
``replay_drafters.py``), so every millisecond measured here is host work. Times are wall
clock (``perf_counter``) on whatever else the machine runs: compare runs taken together.

``--evict-mb 64`` streams 64 MB through the caches before each verify answer, as a model
forward does: a real bench's draft ms/step is closer to that figure than to the warm one.

Example::

    OMP_NUM_THREADS=1 python scripts/auto_host_timing.py bench/results/auto-vs-grid \\
        --prompts ../shared/bench/prompts/specbench.jsonl --limit 6 --profile 25
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay_drafters import OracleBackend  # noqa: E402

from draftwise.core.decode import Decoder  # noqa: E402
from draftwise.core.sampling import SamplingParams  # noqa: E402


class TimedDrafter:
    """Wraps a drafter and adds up the wall time of its ``update`` calls."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[attr-defined]
        self.update_s = 0.0
        self.propose_cpu_s = 0.0

    def __getattr__(self, attr: str) -> object:
        return getattr(self.inner, attr)

    def update(self, context: object, n_new: int) -> None:
        t0 = time.perf_counter()
        self.inner.update(context, n_new)  # type: ignore[attr-defined]
        self.update_s += time.perf_counter() - t0

    def propose(self, context: object, budget: int) -> object:
        t0 = time.thread_time()  # CPU time: steadier than wall time on a shared machine
        tree = self.inner.propose(context, budget)  # type: ignore[attr-defined]
        self.propose_cpu_s += time.thread_time() - t0
        return tree


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bench", type=Path, help="a bench output folder (its records)")
    p.add_argument("--prompts", type=Path, required=True)
    p.add_argument("--drafter", default="auto")
    p.add_argument("--budget", type=int, default=16)
    p.add_argument("--limit", type=int, default=0, help="first N prompts (0 = all)")
    p.add_argument("--profile", type=int, default=0, help="print the N costliest functions")
    p.add_argument("--sort", default="tottime", help="profile order: tottime or cumulative")
    p.add_argument("--evict-mb", type=int, default=0,
                   help="stream this many MB through the caches per verify, as a model "
                   "forward does (a real run's drafter starts each step with cold caches)")
    args = p.parse_args()

    import draftwise
    from draftwise.api import Model
    from draftwise.apps.bench.prompts import read_prompts
    from draftwise.apps.bench.records import read_results
    from draftwise.apps.bench.runner import Chat
    from draftwise.drafting import build_drafter

    data = read_results(args.bench)
    # first turns only: a later turn's history holds the answers of the earlier ones
    recs = [r for r in data["records"] if r["method"] == "none" and r["pass_no"] == 1 and r["turn"] == 1]
    recs = sorted(recs, key=lambda r: (r["prompt_id"], r["turn"]))
    if args.limit:
        recs = recs[: args.limit]
    real = draftwise.load(data["config"].get("model_dir"), backend="torch", dtype="float32")
    cost = real.assets.cost_profile(quiet=True)
    oracle = OracleBackend(real.backend.vocab_size, real.backend.context_limit, cost)
    if args.evict_mb:
        big = np.ones(args.evict_mb * 2**20 // 8)
        answer = oracle.verify

        def cold_verify(root: int, tree: object, need_logits: bool) -> object:
            big.sum()  # evicts the drafter's data and code from the caches
            return answer(root, tree, need_logits)  # type: ignore[arg-type]

        oracle.verify = cold_verify  # type: ignore[method-assign]
    model = Model(oracle, real.tokenizer, real.model_dir)
    model.assets.use_cost_profile(cost)
    stop = frozenset(real.tokenizer.eos_token_ids)
    chat = Chat(real.tokenizer)
    items = {it.id: it for it in read_prompts(args.prompts)}
    drafter = TimedDrafter(build_drafter(args.drafter, model.drafting))
    draft_s = loop_s = 0.0
    steps = tokens = 0
    per_turn: list[float] = []
    prof = cProfile.Profile() if args.profile else None
    for r in recs:
        drafter.inner.reset()  # type: ignore[attr-defined]
        item = items[r["prompt_id"]]
        ids = chat.encode([{"role": "user", "content": item.turns[0]}])
        oracle.seq = ids + r["token_ids"]
        dec = Decoder(oracle)
        max_tokens = len(r["token_ids"]) if r["finish_reason"] == "length" else 10**6
        t_draft = 0.0
        n = 0
        if prof is not None:
            prof.enable()
        t0 = time.perf_counter()
        out: list[int] = []
        for st in dec.steps(ids, drafter, SamplingParams(), max_tokens, stop_ids=stop, budget=args.budget):  # type: ignore[arg-type]
            out += st.tokens
            t_draft += st.draft_s
            n += 1
        loop_s += time.perf_counter() - t0
        if prof is not None:
            prof.disable()
        if out != r["token_ids"]:
            raise SystemExit(f"replay of {r['prompt_id']} differs from the bench's output")
        draft_s += t_draft
        steps += n
        tokens += len(out)
        per_turn.append(t_draft * 1e3 / max(n, 1))
    print(f"{args.drafter}: {len(recs)} turns, {steps} steps, {tokens / steps:.2f} tokens/step")
    print(f"draft (propose) {draft_s * 1e3 / steps:.3f} ms/step "
          f"(median turn {statistics.median(per_turn):.3f}), update {drafter.update_s * 1e3 / steps:.3f} "
          f"ms/step, whole loop incl. oracle {loop_s * 1e3 / steps:.3f} ms/step; propose CPU time "
          f"{drafter.propose_cpu_s * 1e3 / steps:.3f} ms/step")
    if prof is not None:
        pstats.Stats(prof).sort_stats(args.sort).print_stats(args.profile)


if __name__ == "__main__":
    main()
