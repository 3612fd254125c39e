import json, sys, time, collections
import numpy as np
import draftwise
from draftwise.core.autotune import AutoDrafter
m = draftwise.load()
a = m.drafter('auto')
print([x.name for x in a.members])
orig_runs = AutoDrafter._runs
variant = ['all']
import draftwise.core.autotune as at
def runs(self, i, c1):
    if variant[0] == 'lean' and i in (1, 2):
        return False
    at.GATE_SHARE = 0.02 if variant[0] == 'gate' else 0.04
    return orig_runs(self, i, c1)
AutoDrafter._runs = runs
items=[json.loads(l) for f in sys.argv[1].split(',') for l in open(f)]
meths=['none','all','gate']
tim=collections.defaultdict(list); st=collections.defaultdict(lambda: [0,0]); cats=[]
for rep in range(2):
  for i,it in enumerate(items):
    k=(i+rep)%3; order=meths[k:]+meths[:k]
    if rep==0: cats.append(it['category'])
    for md in order:
        d='none' if md=='none' else 'auto'
        variant[0]=md
        m.drafter(d).reset(); m.decoder.reset()
        t0=time.perf_counter()
        for r in draftwise.stream_generate(m, [{"role":"user","content":it['turns'][0]}], drafter=d, max_tokens=128): pass
        tim[md].append(time.perf_counter()-t0); st[md][0]+=r.generation_tokens; st[md][1]+=r.steps
base=np.array(tim['none']); cats=cats*2
for c in sorted(set(cats)):
    idx=[i for i,x in enumerate(cats) if x==c]
    print('%-20s'%c, ' '.join('%s %.3f'%(k, base[idx].sum()/np.array(tim[k])[idx].sum()) for k in meths[1:]))
for k in meths:
    t=np.array(tim[k]); print('%-6s ratio(sum) %.3f median %.3f MAT %.3f'%(k, base.sum()/t.sum(), np.median(base/t), st[k][0]/st[k][1]))
