"""Where auto's per-step time goes beside its solo member's proposal (held-out prompts;
argv: prompts, SOLO_T). Wrappers around each call; medians and means in ms."""
import time, json, sys, collections
import numpy as np
import draftwise
from draftwise.core import autotune
m = draftwise.load()
a = m.drafter('auto')
T = collections.defaultdict(list)
def wrap(obj, name, key):
    f = getattr(obj, name)
    def g(*x, **k):
        t0 = time.perf_counter(); r = f(*x, **k); T[key].append(time.perf_counter() - t0); return r
    setattr(obj, name, g)
a.reset()
solo = a.members[a._solo]
wrap(solo, "propose", "m.propose")
for nm in ("propose", "_propose_solo", "_steep", "_solo_floor", "observe_verify", "update", "background"):
    wrap(a, nm, "a." + nm)
wrap(a.rates, "observe", "rates.observe"); wrap(a.rates, "choose", "rates.choose")
wrap(a.cost, "costs_to", "cost.costs_to")
items = [json.loads(l) for l in open('/tmp/corpus-dev8.jsonl')][:int(sys.argv[1])]
autotune.SOLO_T = int(sys.argv[2])
for i, it in enumerate(items):
    msgs = [{"role": "user", "content": it['turns'][0]}]
    a.reset(); m.decoder.reset()
    list(draftwise.stream_generate(m, msgs, drafter=a, max_tokens=128))
for k, v in sorted(T.items()): print('%-20s n %5d median %.4f mean %.4f ms' % (k, len(v), np.median(v)*1e3, np.mean(v)*1e3))
