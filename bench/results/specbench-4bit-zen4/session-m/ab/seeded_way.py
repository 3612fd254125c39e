"""Seeded A/B on held-out corpus prompts (``scripts/corpus_prompts.py --per 8``): `none`,
a fixed one-token chain and `auto`, methods rotating prompt by prompt, in one process.

    python ab/seeded_way.py /tmp/corpus-dev8.jsonl --temp 0.8 --limit 56 --passes 2
"""
import argparse
import collections
import json
import time

import draftwise

p = argparse.ArgumentParser()
p.add_argument("prompts")
p.add_argument("--temp", type=float, default=0.8)
p.add_argument("--limit", type=int, default=56)
p.add_argument("--passes", type=int, default=2)
a = p.parse_args()
m = draftwise.load()
items = [json.loads(line) for line in open(a.prompts)][: a.limit]
meths = ["none", "redrafter:bw=1,t=1", "auto"]
tm: collections.Counter = collections.Counter()
diff = 0
for p_ in range(a.passes):
    for i, it in enumerate(items):
        k = (i + p_) % len(meths)
        outs = {}
        for d in meths[k:] + meths[:k]:
            msgs = [{"role": "user", "content": it["turns"][0]}]
            t = time.perf_counter()
            text = "".join(s.text for s in draftwise.stream_generate(
                m, msgs, drafter=d, max_tokens=128, temperature=a.temp, seed=11 + i))
            tm[d] += time.perf_counter() - t
            outs[d] = text
        diff += len(set(outs.values())) != 1
    print(f"pass {p_} (cumulative)", {d: f"{tm['none'] / tm[d]:.3f}" for d in meths},
          "outputs differing:", diff, flush=True)
