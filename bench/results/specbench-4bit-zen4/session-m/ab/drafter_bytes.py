"""Live drafting time with the chain's int8 layers read as packed 4-bit (per-row scales:
the byte count a per-group format would have, minus its scales) against as shipped."""
import time, json, sys, collections
import numpy as np
import draftwise
from draftwise.backends.cuda.redrafter import step as st, native as nat
from draftwise.core.drafters.redrafter import ReDrafter
m = draftwise.load()
t = int(sys.argv[1])
base = m.drafter(f'redrafter:bw=1,t={t}')
orig_four = st.FOUR_BIT
st.FOUR_BIT = ("w", "u", "head", "res_s", "proj", "q_se", "wo")
nat.levels_of = st.levels_of
net4 = nat.NativeRecurrentStep(base.net.net, m.decoder.backend, extend=True)
st.FOUR_BIT = orig_four
four = ReDrafter(net4, bw=1, t=t)
T = collections.defaultdict(list)
def wrap(obj, name, key):
    f = getattr(obj, name)
    def g(*a, **k):
        t0 = time.perf_counter(); r = f(*a, **k); T[key].append(time.perf_counter() - t0); return r
    setattr(obj, name, g)
for tag, dr in (("shipped", base), ("4bit", four)):
    wrap(dr.net, "_chain_fn", tag + " chain")
    wrap(dr, "propose", tag + " propose")
items = [json.loads(l) for l in open('/tmp/corpus-dev8.jsonl')][:28]
steps = collections.Counter(); toks = collections.Counter()
for i, it in enumerate(items):
    for tag, dr in ((("shipped", base), ("4bit", four)) if i % 2 else (("4bit", four), ("shipped", base))):
        ss = list(draftwise.stream_generate(m, [{"role": "user", "content": it['turns'][0]}], drafter=dr, max_tokens=128))
        steps[tag] += len(ss); toks[tag] += len(ss[-1].token_ids)
for k, v in sorted(T.items()): print('%-16s n %5d median %.3f mean %.3f ms' % (k, len(v), np.median(v)*1e3, np.mean(v)*1e3))
print({k: '%.3f tok/step' % (toks[k]/steps[k]) for k in steps})
