"""Seeded T = 0.8: where auto's time beside its member goes, per step (ms, medians)."""
import time, json, collections, statistics
import numpy as np
import draftwise
from draftwise.core import autotune
m = draftwise.load()
a = m.drafter("auto")
T = collections.defaultdict(list)
def wrap(obj, name, key):
    f = getattr(obj, name)
    def g(*x, **k):
        t0 = time.perf_counter(); r = f(*x, **k); T[key].append((time.perf_counter() - t0) * 1e3); return r
    setattr(obj, name, g)
solo = a.members[a._solo]
wrap(solo, "propose", "member.propose")
wrap(solo, "update", "member.update")
wrap(a, "propose", "auto.propose")
wrap(a, "update", "auto.update")
wrap(a, "background", "auto.background")
wrap(a, "observe_verify", "auto.observe_verify")
wrap(a, "_steep", "auto._steep")
wrap(a, "_draft_share", "auto._draft_share")
items = [json.loads(l) for l in open('/tmp/corpus-dev8.jsonl')][:28]
for i, it in enumerate(items):
    a.reset(); m.decoder.reset()
    list(draftwise.stream_generate(m, [{"role": "user", "content": it['turns'][0]}], drafter=a, max_tokens=128, temp=0.8, seed=i))
for k, v in sorted(T.items()):
    print('%-22s n %5d median %.4f mean %.4f ms' % (k, len(v), np.median(v), np.mean(v)))
