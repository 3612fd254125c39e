"""Live A/B: the compiled ReDrafter step with GROUPED layers (4-bit, a scale per 32
inputs) against int8 rows (groups=False), alternating prompt by prompt, one process."""
import time, json, sys, collections
import numpy as np
import draftwise
from draftwise.backends.cuda.redrafter import native as nat
from draftwise.core.drafters.redrafter import ReDrafter
m = draftwise.load()
t = int(sys.argv[1]); n = int(sys.argv[2]) if len(sys.argv) > 2 else 28
base = m.drafter(f'redrafter:bw=1,t={t}')
assert base.net.groups
old = ReDrafter(nat.NativeRecurrentStep(base.net.net, m.decoder.backend, extend=True, groups=False), bw=1, t=t)
T = collections.defaultdict(list)
def wrap(obj, name, key):
    f = getattr(obj, name)
    def g(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k); T[key].append(time.perf_counter() - t0); return r
    setattr(obj, name, g)
for tag, dr in (("groups", base), ("int8", old)):
    wrap(dr.net, "_chain_fn", tag + " chain")
    wrap(dr.net, "_start_fn", tag + " start")
    wrap(dr.net, "_entries_fn", tag + " entries")
    wrap(dr, "propose", tag + " propose")
items = [json.loads(l) for l in open('/tmp/corpus-dev8.jsonl')][:n]
steps = collections.Counter(); toks = collections.Counter(); wall = collections.Counter()
for i, it in enumerate(items):
    for tag, dr in ((("groups", base), ("int8", old)) if i % 2 else (("int8", old), ("groups", base))):
        dr.reset(); m.decoder.reset()
        t0 = time.perf_counter()
        ss = list(draftwise.stream_generate(m, [{"role": "user", "content": it['turns'][0]}], drafter=dr, max_tokens=128))
        wall[tag] += time.perf_counter() - t0
        steps[tag] += len(ss); toks[tag] += len(ss[-1].token_ids)
for k, v in sorted(T.items()): print('%-16s n %5d median %.3f mean %.3f ms' % (k, len(v), np.median(v)*1e3, np.mean(v)*1e3))
print({k: '%.3f tok/step %.1f tok/s' % (toks[k]/steps[k], toks[k]/wall[k]) for k in steps})
