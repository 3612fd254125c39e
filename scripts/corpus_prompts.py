"""A bench-format prompt file drawn from ``../shared/corpus/prompts.jsonl`` (no benchmark
overlap): a held-out set to tune on, so that settings are not fitted to Spec-Bench.

Each corpus subset (the id prefix: selfinstruct, oasst, flan-cot-aqua, ...) becomes a
category with ``--per`` prompts, picked with a fixed seed among prompts of at most
``--max-chars`` characters.

Example::

    python scripts/corpus_prompts.py --out /tmp/corpus-dev.jsonl --per 8
    OMP_NUM_THREADS=1 draftwise bench --prompts /tmp/corpus-dev.jsonl --drafters none \\
        --max-tokens 128 --backend torch --dtype float32 --out runs/corpus-dev
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict
from pathlib import Path

SUBSETS = ("selfinstruct", "oasst", "flan-cot-aqua", "flan-cot-strategyqa", "acp", "exercism", "pep")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, default=Path(__file__).resolve().parents[1] / "../shared/corpus/prompts.jsonl")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--per", type=int, default=8, help="prompts per subset")
    p.add_argument("--max-chars", type=int, default=1500)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    pools: dict[str, list[dict]] = defaultdict(list)
    with open(args.corpus, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            sub = next((s for s in SUBSETS if row["id"].startswith(s + "-")), None)
            if sub is not None and 0 < len(row["prompt"].strip()) <= args.max_chars:
                pools[sub].append(row)
    rng = random.Random(args.seed)
    with open(args.out, "w", encoding="utf-8") as out:
        for sub in SUBSETS:
            for row in rng.sample(pools[sub], min(args.per, len(pools[sub]))):
                out.write(json.dumps({"id": row["id"], "category": sub, "turns": [row["prompt"]]}) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
