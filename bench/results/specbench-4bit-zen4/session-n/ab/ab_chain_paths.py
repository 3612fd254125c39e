"""Live A/B: a chain's verify tables from ``chain_slots`` (the committed code) against
``slot_table`` of its mask (patched back in), alternating prompt by prompt in one
process: each verify's Python time (``be.verify`` less the compiled forward and the
head), and whole-generation tokens/s for `redrafter:bw=1,t=1` and `auto`. (A chain's
greedy acceptance from Python ints instead of ``accept``'s numpy walk measured 0.0436
against 0.0419 ms a step here and was not kept: the first touches after a verify miss
the caches either way.)"""
import time, json, sys, collections
import numpy as np
import draftwise
m = draftwise.load()
be = m.decoder.backend
T = collections.defaultdict(list)
cur = ["fast"]
orig_pack = be._pack
def pack(*a, **k):
    host = orig_pack(*a, **k)
    if cur[0] == "general":
        be._chain_rows = 0
    return host
be._pack = pack
inner = [0.0]
fs, lg = be.model.fused.step, be.model.logits
def step(*a, **k):
    t0 = time.perf_counter(); r = fs(*a, **k); inner[0] += time.perf_counter() - t0; return r
def logits(*a, **k):
    t0 = time.perf_counter(); r = lg(*a, **k); inner[0] += time.perf_counter() - t0; return r
be.model.fused.step, be.model.logits = step, logits
ov = be.verify
def verify(root, tree, **k):
    inner[0] = 0.0
    t0 = time.perf_counter(); r = ov(root, tree, **k); dt = time.perf_counter() - t0
    T[(cur[0], "verify")].append(dt); T[(cur[0], "verify python")].append(dt - inner[0])
    return r
be.verify = verify
W = collections.defaultdict(float); N = collections.Counter()
items = [json.loads(l) for l in open('/tmp/corpus-dev8.jsonl')][:int(sys.argv[1])]
for i, it in enumerate(items):
    msgs = [{"role": "user", "content": it['turns'][0]}]
    for spec in ("redrafter:bw=1,t=1", "auto"):
        d = m.drafter(spec)
        for tag in (("fast", "general") if i % 2 else ("general", "fast")):
            cur[0] = tag
            d.reset(); m.decoder.reset()
            t0 = time.perf_counter()
            r = list(draftwise.stream_generate(m, msgs, drafter=d, max_tokens=128))
            W[(spec, tag)] += time.perf_counter() - t0; N[(spec, tag)] += len(r[-1].token_ids)
for k, v in sorted(T.items()): print('%-22s n %5d median %.4f mean %.4f ms' % (k, len(v), np.median(v)*1e3, np.mean(v)*1e3))
for spec in ("redrafter:bw=1,t=1", "auto"):
    f, g = N[(spec, "fast")] / W[(spec, "fast")], N[(spec, "general")] / W[(spec, "general")]
    print('%-20s fast %.1f tok/s  general %.1f tok/s  ratio %.4f' % (spec, f, g, f / g))
