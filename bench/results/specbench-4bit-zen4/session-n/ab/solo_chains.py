"""auto's solo chains: per-depth predicted vs accepted, and auto vs auto with SOLO_T=1
vs none, per corpus subset (held-out prompts), methods rotating, one process."""
import time, json, sys, collections
import numpy as np
import draftwise
from draftwise.core import autotune
m = draftwise.load()
a3 = m.drafter('auto')
a1 = a3
be = m.decoder.backend
rec = collections.defaultdict(lambda: [0.0, 0, 0])  # depth -> [sum pred, n, acc]
last = [None]
orig = autotune.AutoDrafter._propose_solo
def solo(self, context, cap):
    t = orig(self, context, cap)
    last[0] = np.cumprod(t.prob) if len(t) else None
    return t
autotune.AutoDrafter._propose_solo = solo
oc = be.commit
def commit(keep):
    p = last[0]
    if p is not None:
        acc = len(keep) - 1
        for d in range(len(p)):
            r = rec[(len(p), d + 1)]; r[0] += p[d]; r[1] += 1; r[2] += int(acc > d)
    last[0] = None
    return oc(keep)
be.commit = commit
items = [json.loads(l) for l in open('/tmp/corpus-dev8.jsonl')]
W = collections.defaultdict(float); N = collections.defaultdict(int)
meths = [("none", "none"), ("auto", a3), ("auto_t1", a1)]
for i, it in enumerate(items):
    msgs = [{"role": "user", "content": it['turns'][0]}]
    cat = it.get('category', '?')
    for k in range(3):
        tag, d = meths[(i + k) % 3]
        if tag == "auto_t1": autotune.SOLO_T = 1
        if d != "none": d.reset()
        m.decoder.reset()
        t0 = time.perf_counter()
        r = list(draftwise.stream_generate(m, msgs, drafter=d, max_tokens=128))
        W[(cat, tag)] += time.perf_counter() - t0; N[(cat, tag)] += len(r[-1].token_ids)
        autotune.SOLO_T = 3
        last[0] = None
for k, v in sorted(rec.items()): print('len %d depth %d n %5d pred %.3f acc %.3f' % (k[0], k[1], v[1], v[0]/v[1], v[2]/v[1]))
cats = sorted({c for c, _ in W})
for c in cats + ['ALL']:
    def tps(tag): 
        if c == 'ALL': return sum(N[(x, tag)] for x in cats) / sum(W[(x, tag)] for x in cats)
        return N[(c, tag)] / W[(c, tag)]
    print('%-22s none %.1f  auto %.3fx  auto_t1 %.3fx' % (c, tps('none'), tps('auto')/tps('none'), tps('auto_t1')/tps('none')))
