"""Tokens a step of the ReDrafter (greedy one-beam chains, t = 1 and 3) with its weights
rounded in several formats and the dense torch step (bfloat16 activations) for all: which
weight format keeps the drafts. ``float`` unrounded; ``current`` as the compiled step rounds
them (w, u and the head -7..7 times a row scale, the rest -127..127); ``row4`` everything
-7..7 times a row scale; ``grp4`` the int8 layers -7..7 times a scale per 32 inputs;
``grp4all`` every layer so. Held-out corpus prompts (/tmp/corpus-dev8.jsonl from
``scripts/corpus_prompts.py --per 8``), the first N; prints running totals per prompt.

    python drafter_weight_formats.py 28
"""
import collections
import copy
import json
import sys
import torch
import draftwise
from draftwise.backends.cuda.redrafter.step import TorchRecurrentStep
from draftwise.core.drafters.redrafter import ReDrafter
m = draftwise.load()
be = m.decoder.backend
rd0 = m.drafter('redrafter:bw=1,t=1')
net0 = rd0.net.net  # the ReDrafterNet (bf16)
def q_row(w, L):
    s = w.abs().amax(1, keepdim=True).clamp(min=1e-12)/L
    return (w/s).round().clamp(-L,L)*s
def q_group(w, L, g=32):
    n,k = w.shape
    x = w.reshape(n, k//g, g)
    s = x.abs().amax(2, keepdim=True).clamp(min=1e-12)/L
    return ((x/s).round().clamp(-L,L)*s).reshape(n,k)
def variant(kind):
    net = copy.deepcopy(net0).float()
    with torch.no_grad():
        four = {'w','u','head'}
        layers = {'w':net.w.weight,'u':net.u.weight,'proj':net.proj.weight,'head':net.rows,
                  'wq':net.wq.weight,'wk':net.wk.weight,'wv':net.wv.weight,'wo':net.wo.weight}
        for i,r in enumerate(net.res): layers['res%d'%i]=r.weight
        for name,w in layers.items():
            if kind=='float': continue
            if kind=='current': w.copy_(q_row(w,7) if name in four else q_row(w,127))
            elif kind=='row4': w.copy_(q_row(w,7))
            elif kind=='grp4': w.copy_(q_row(w,7) if name in four else q_group(w,7))
            elif kind=='grp4all': w.copy_(q_group(w,7))
    return net.to(torch.bfloat16)
items=[json.loads(l) for l in open('/tmp/corpus-dev8.jsonl')][:int(sys.argv[1])]
kinds=['float','current','row4','grp4','grp4all']
res=collections.defaultdict(lambda:[0,0])
nets={k:variant(k) for k in kinds}
for t in (1, 3):
  for i,it in enumerate(items):
    for k in kinds:
        step=TorchRecurrentStep(nets[k], be, int8=False, extend=True)
        dr=ReDrafter(step, bw=1, t=t)
        steps=list(draftwise.stream_generate(m, [{"role":"user","content":it['turns'][0]}], drafter=dr, max_tokens=128))
        res[(t,k)][0]+=len(steps[-1].token_ids)
        res[(t,k)][1]+=len(steps)
    print('t',t,' '.join('%s %.3f'%(k,res[(t,k)][0]/res[(t,k)][1]) for k in kinds),flush=True)
