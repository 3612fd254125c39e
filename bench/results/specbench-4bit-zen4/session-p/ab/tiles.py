"""A/B in one process: the ReDrafter step's tiled products (1) against dot4q's (0), live decode
of held-out corpus prompts (scripts/corpus_prompts.py --out /tmp/corpus-dev8.jsonl --per 8)."""
import time, json, sys, collections
import numpy as np
import draftwise
from draftwise.backends.cuda.cpu.native import redrafter_lib
lib = redrafter_lib()
m = draftwise.load()
spec = sys.argv[1] if len(sys.argv) > 1 else "redrafter:bw=1,t=3"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 56
d = m.drafter(spec)
items = [json.loads(l) for l in open('/tmp/corpus-dev8.jsonl')][:n]
S = {0: collections.defaultdict(float), 1: collections.defaultdict(float)}
texts = {0: [], 1: []}
for i, it in enumerate(items):
    for tiles in ((0, 1) if i % 2 == 0 else (1, 0)):
        lib.dw_rd_use_tiles(tiles)
        d.reset(); m.decoder.reset()
        t0 = time.perf_counter()
        out = list(draftwise.stream_generate(m, [{"role": "user", "content": it['turns'][0]}], drafter=d, max_tokens=128))
        wall = time.perf_counter() - t0
        last = out[-1]
        s = S[tiles]
        s['wall'] += wall; s['steps'] += last.steps; s['tokens'] += last.generation_tokens
        s['draft_ms'] += last.draft_ms; s['verify_ms'] += last.verify_ms
        texts[tiles].append("".join(r.text for r in out))
for tiles in (0, 1):
    s = S[tiles]
    print("tiles", tiles, "wall %.2f s  tok/s %.1f  MAT %.3f  draft ms/step %.4f  verify ms/step %.3f" % (
        s['wall'], s['tokens'] / s['wall'], s['tokens'] / s['steps'], s['draft_ms'] / s['steps'], s['verify_ms'] / s['steps']))
print("same text", sum(a == b for a, b in zip(texts[0], texts[1])), "of", len(items))
