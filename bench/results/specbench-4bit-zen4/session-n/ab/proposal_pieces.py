"""Where a live one-token ReDrafter proposal's time goes (session n)."""
import time, json, sys, collections
import numpy as np
import draftwise
from draftwise.core.drafters import redrafter as rdmod
m = draftwise.load()
t = int(sys.argv[1]) if len(sys.argv) > 1 else 1
dr = m.drafter(f'redrafter:bw=1,t={t}')
T = collections.defaultdict(list)
def wrap(obj, name, key):
    f = getattr(obj, name)
    def g(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k); T[key].append(time.perf_counter() - t0); return r
    setattr(obj, name, g)
net = dr.net
wrap(net, "_chain_fn", "c chain")
wrap(net, "_start_fn", "c start")
wrap(net, "_entries_fn", "c entries")
wrap(net, "_add_entries_np", "py add_entries")
wrap(net._ctx, "update", "py ctx.update")
wrap(net, "start", "py start")
wrap(net, "chain", "py chain")
wrap(rdmod, "chain_tree", "py chain_tree")
wrap(dr, "propose", "propose")
wrap(dr, "update", "drafter.update")
be = m.decoder.backend
wrap(be, "verify", "be.verify")
wrap(be, "commit", "be.commit")
items = [json.loads(l) for l in open('/tmp/corpus-dev8.jsonl')][:int(sys.argv[2]) if len(sys.argv) > 2 else 14]
steps = toks = 0
w0 = time.perf_counter()
for it in items:
    ss = list(draftwise.stream_generate(m, [{"role": "user", "content": it['turns'][0]}], drafter=dr, max_tokens=128))
    steps += len(ss); toks += len(ss[-1].token_ids)
wall = time.perf_counter() - w0
for k, v in sorted(T.items()): print('%-16s n %5d median %.3f mean %.3f ms' % (k, len(v), np.median(v)*1e3, np.mean(v)*1e3))
print('tok/step %.3f  tok/s %.1f' % (toks/steps, toks/wall))
