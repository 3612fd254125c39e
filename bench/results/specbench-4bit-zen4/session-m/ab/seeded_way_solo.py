"""Seeded (T=0.8) A/B on held-out corpus prompts: none, redrafter t=1, auto, auto with
the sampled way forced to solo. Methods rotate per prompt; two passes."""
import time, json, sys, collections
import numpy as np
import draftwise
from draftwise.core import solo_sampling
m = draftwise.load()
items=[json.loads(l) for l in open(sys.argv[1])]
orig_choose=solo_sampling.SoloPays.choose
def solo_choose(self): return 'solo'
meths=['none','redrafter:bw=1,t=1','auto','auto-solo']
tm=collections.Counter(); toks=collections.Counter()
diff=0
for p in range(2):
  for i,it in enumerate(items):
    k=(i+p)%4; order=meths[k:]+meths[:k]
    outs={}
    for d in order:
        solo_sampling.SoloPays.choose = solo_choose if d=='auto-solo' else orig_choose
        dd='auto' if d=='auto-solo' else d
        msgs=[{"role":"user","content":it['turns'][0]}]
        t=time.perf_counter(); ids=[]
        for s in draftwise.stream_generate(m, msgs, drafter=dd, max_tokens=128, temperature=0.8, seed=11+i):
            ids.append(s.text)
        tm[d]+=time.perf_counter()-t; outs[d]=''.join(ids)
    if len(set(outs.values()))!=1: diff+=1
  print('pass',p, {d:'%.3f'%(tm['none']/tm[d]) for d in meths}, 'diff', diff, flush=True)
