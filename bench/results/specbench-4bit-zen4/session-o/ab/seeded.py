"""Seeded T = 0.8: none, auto and redrafter:bw=1,t=1 rotating prompt by prompt in one
process, held-out corpus prompts; auto's plain steps and acceptance."""
import time, json, sys, collections
import draftwise
m = draftwise.load()
ds = {"auto": m.drafter("auto"), "t1": m.drafter("redrafter:bw=1,t=1"), "none": "none"}
items = [json.loads(l) for l in open('/tmp/corpus-dev8.jsonl')]
W = collections.defaultdict(float); N = collections.defaultdict(int); P = collections.Counter(); S = collections.Counter()
names = list(ds)
for i, it in enumerate(items):
    msgs = [{"role": "user", "content": it['turns'][0]}]
    for k in range(3):
        tag = names[(i + k) % 3]; d = ds[tag]
        if d != "none": d.reset()
        m.decoder.reset()
        t0 = time.perf_counter()
        r = list(draftwise.stream_generate(m, msgs, drafter=d, max_tokens=128, temp=0.8, seed=i))
        W[tag] += time.perf_counter() - t0; N[tag] += len(r[-1].token_ids)
        P[tag] += r[-1].plain_steps; S[tag] += r[-1].steps if hasattr(r[-1], 'steps') else 0
base = N["none"] / W["none"]
for tag in names:
    print('%-5s %7.1f tok/s %.4fx none tokens %d plain steps %d steps %d' % (tag, N[tag] / W[tag], N[tag] / W[tag] / base, N[tag], P[tag], S[tag]))
