"""Live A/B of TorchBackend.commit with a one-token ReDrafter chain: a chain prefix of the
compiled step's own rows kept as a slice (the committed code) against the copy it made
before (index_select, forced by clearing ``_rows_fresh``), alternating prompt by prompt."""
import time, json, collections
import numpy as np
import draftwise
m = draftwise.load()
rd = m.drafter('redrafter:bw=1,t=1')
be = m.decoder.backend
T = collections.defaultdict(list)
orig = be.commit
cur = ["slice"]
def g(keep):
    if cur[0] == "copy":
        be._rows_fresh = False
    t0 = time.perf_counter(); r = orig(keep); T[cur[0]].append(time.perf_counter() - t0); return r
be.commit = g
items = [json.loads(l) for l in open('/tmp/corpus-dev8.jsonl')][:14]
for i, it in enumerate(items):
    msgs = [{"role": "user", "content": it['turns'][0]}]
    for tag in (("slice", "copy") if i % 2 else ("copy", "slice")):
        cur[0] = tag
        rd.reset(); m.decoder.reset()
        list(draftwise.stream_generate(m, msgs, drafter=rd, max_tokens=128))
for k, v in sorted(T.items()): print('%-8s n %5d median %.3f mean %.3f ms' % (k, len(v), np.median(v)*1e3, np.mean(v)*1e3))
