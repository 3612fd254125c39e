"""Live verify (+ acceptance + commit) time by rows and tree shape for `none`, `auto`
and `redrafter:bw=1,t=1`, methods rotating prompt by prompt (42 held-out prompts)."""
import time, json, sys, collections
import numpy as np
import draftwise
import draftwise.core.decode as dec
m = draftwise.load()
be = m.decoder.backend
T = collections.defaultdict(list)
cur = ["none"]
orig = dec.Decoder._verify if hasattr(dec, "Decoder") else None
cls = type(m.decoder)
ov = cls._verify
def _verify(self, context, tree, params, u):
    t0 = time.perf_counter(); r = ov(self, context, tree, params, u); dt = time.perf_counter() - t0
    chain = len(tree) == tree.max_depth
    T[(cur[0], len(tree) + 1, "chain" if chain else "tree", len(r[0]))].append(dt)
    return r
cls._verify = _verify
items = [json.loads(l) for l in open('/tmp/corpus-dev8.jsonl')][:int(sys.argv[1])]
specs = ["none", "auto", "redrafter:bw=1,t=1"]
for i, it in enumerate(items):
    msgs = [{"role": "user", "content": it['turns'][0]}]
    for k in range(3):
        spec = specs[(i + k) % 3]
        d = m.drafter(spec); cur[0] = spec
        if spec != "none": d.reset()
        m.decoder.reset()
        list(draftwise.stream_generate(m, msgs, drafter=d, max_tokens=128))
agg = collections.defaultdict(list)
for (tag, rows, shape, acc), v in T.items():
    agg[(tag, rows, shape)].extend(v)
for k, v in sorted(agg.items()):
    if len(v) >= 20: print('%-22s rows %2d %-5s n %5d median %.3f ms' % (k[0], k[1], k[2], len(v), np.median(v)*1e3))
