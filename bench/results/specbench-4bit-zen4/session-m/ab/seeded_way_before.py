"""Seeded A/B before session m's change (run at bce6890): none, redrafter t=1, auto (its
SoloPays by step times) and auto with an acceptance floor of 0.13 replacing SoloPays.choose."""
import time, json, sys, collections
import numpy as np
import draftwise
from draftwise.core import solo_sampling
m = draftwise.load()
items=[json.loads(l) for l in open(sys.argv[1])][:int(sys.argv[3])]
temp=float(sys.argv[2]); passes=int(sys.argv[4])
orig_choose=solo_sampling.SoloPays.choose
FLOOR=0.13
def floor_choose(self):
    self._turn += 1
    a=self.optimistic()
    if a is None or a >= FLOOR: return 'solo'
    return 'solo' if self._turn % self.explore_every == 0 else 'plain'
meths=['none','redrafter:bw=1,t=1','auto','auto-floor']
tm=collections.Counter(); ways=collections.Counter()
from draftwise.core import autotune
op=autotune.AutoDrafter.propose
cur={'d':None}
def p2(self,*a,**k):
    r=op(self,*a,**k); ways[(cur['d'],self.way)]+=1; return r
autotune.AutoDrafter.propose=p2
diff=0
for p in range(passes):
  for i,it in enumerate(items):
    k=(i+p)%4; order=meths[k:]+meths[:k]
    outs={}
    for d in order:
        cur['d']=d
        solo_sampling.SoloPays.choose = floor_choose if d=='auto-floor' else orig_choose
        dd='auto' if d.startswith('auto') else d
        msgs=[{"role":"user","content":it['turns'][0]}]
        t=time.perf_counter(); ids=[]
        for s in draftwise.stream_generate(m, msgs, drafter=dd, max_tokens=128, temperature=temp, seed=11+i):
            ids.append(s.text)
        tm[d]+=time.perf_counter()-t; outs[d]=''.join(ids)
    if len(set(outs.values()))!=1: diff+=1
  print('pass',p, {d:'%.3f'%(tm['none']/tm[d]) for d in meths}, 'diff', diff, flush=True)
print(dict(ways))
