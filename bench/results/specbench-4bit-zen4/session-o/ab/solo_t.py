"""auto with SOLO_T = 3 (committed) against 4 and 5 and none, held-out corpus prompts,
methods rotating prompt by prompt in one process."""
import time, json, sys, collections
import draftwise
from draftwise.core import autotune
m = draftwise.load()
a = m.drafter('auto')
items = [json.loads(l) for l in open('/tmp/corpus-dev8.jsonl')]
W = collections.defaultdict(float); N = collections.defaultdict(int)
meths = [("none", None), ("auto_t3", 3), ("auto_t4", 4), ("auto_t5", 5)]
for rep in range(int(sys.argv[1]) if len(sys.argv) > 1 else 1):
    for i, it in enumerate(items):
        msgs = [{"role": "user", "content": it['turns'][0]}]
        for k in range(len(meths)):
            tag, st = meths[(i + k + rep) % len(meths)]
            d = "none" if st is None else a
            if st is not None:
                autotune.SOLO_T = st; a.reset()
            m.decoder.reset()
            t0 = time.perf_counter()
            r = list(draftwise.stream_generate(m, msgs, drafter=d, max_tokens=128))
            W[tag] += time.perf_counter() - t0; N[tag] += len(r[-1].token_ids)
            autotune.SOLO_T = 3
base = N["none"] / W["none"]
for tag, _ in meths:
    print('%-8s %7.1f tok/s  %.4fx none  tokens %d' % (tag, N[tag] / W[tag], N[tag] / W[tag] / base, N[tag]))
