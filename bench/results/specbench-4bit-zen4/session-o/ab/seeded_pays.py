"""Seeded T = 0.8, held-out corpus prompts, rotating in one process: none, auto, auto with
SoloPays.pays forced True (always drafts one token), redrafter:bw=1,t=1; plain steps and
the drafting ms auto measured."""
import time, json, sys, collections, statistics
import draftwise
from draftwise.core import solo_sampling
m = draftwise.load()
a = m.drafter("auto")
ds = {"none": "none", "auto": a, "auto_always": a, "t1": m.drafter("redrafter:bw=1,t=1")}
items = [json.loads(l) for l in open('/tmp/corpus-dev8.jsonl')]
W = collections.defaultdict(float); N = collections.defaultdict(int); P = collections.Counter()
names = list(ds)
orig = solo_sampling.SoloPays.pays
for i, it in enumerate(items):
    msgs = [{"role": "user", "content": it['turns'][0]}]
    for k in range(len(names)):
        tag = names[(i + k) % len(names)]; d = ds[tag]
        solo_sampling.SoloPays.pays = (lambda self, floor: True) if tag == "auto_always" else orig
        if d != "none": d.reset()
        m.decoder.reset()
        t0 = time.perf_counter()
        r = list(draftwise.stream_generate(m, msgs, drafter=d, max_tokens=128, temp=0.8, seed=i))
        W[tag] += time.perf_counter() - t0; N[tag] += len(r[-1].token_ids); P[tag] += r[-1].plain_steps
solo_sampling.SoloPays.pays = orig
base = N["none"] / W["none"]
for tag in names:
    print('%-12s %7.1f tok/s %.4fx none tokens %d plain steps %d' % (tag, N[tag] / W[tag], N[tag] / W[tag] / base, N[tag], P[tag]))
print('auto solo draft ms median %.3f (last %d)' % (statistics.median(a._solo_ms), len(a._solo_ms)) if a._solo_ms else '')
