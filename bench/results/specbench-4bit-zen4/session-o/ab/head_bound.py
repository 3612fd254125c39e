"""How many vocabulary rows could still be the argmax after a 4-bit copy of the Q8_0 head
with a per-row Cauchy-Schwarz error bound (a lossless cheaper head)? Real final hidden
states of the default model on a corpus prompt's greedy continuation."""
import numpy as np, torch, json
from transformers import AutoModelForCausalLM, AutoTokenizer
md = '/root/.cache/draftwise/models/SmolLM2-135M-Instruct'
tok = AutoTokenizer.from_pretrained(md); m = AutoModelForCausalLM.from_pretrained(md, dtype=torch.float32).eval()
E = m.model.embed_tokens.weight.detach().numpy()  # (V, C): exactly the Q8_0 values (dequantised)
V, C = E.shape
B = E.reshape(V, C // 32, 32)
def q4(b, bits=4):  # symmetric per-32 requantisation of the Q8 values
    lv = 2 ** (bits - 1) - 1
    s = np.abs(b).max(-1, keepdims=True) / lv; s[s == 0] = 1
    return np.round(b / s).clip(-lv, lv) * s
rows = [json.loads(l) for l in open('/tmp/corpus-dev8.jsonl')][:6]
for bits in (4, 5, 6):
    W4 = q4(B, bits).reshape(V, C)
    err = np.linalg.norm(E - W4, axis=1)  # (V,)
    cands = []
    for r in rows:
        ids = tok.apply_chat_template([{"role": "user", "content": r['turns'][0]}], add_generation_prompt=True, return_tensors='pt')
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        with torch.no_grad():
            out = m.generate(ids, max_new_tokens=48, do_sample=False, output_hidden_states=True, return_dict_in_generate=True)
        for hs in out.hidden_states[1:]:
            h = hs[-1][0, -1].detach().numpy()  # (C,) after the final norm
            z4 = W4 @ h; bnd = err * np.linalg.norm(h)
            lo = (z4 - bnd).max()
            cands.append(int((z4 + bnd >= lo).sum()))
    c = np.array(cands)
    print(f"{bits}-bit copy ({bits * C // 8 * V / 1e6:.1f} MB + scales): candidates median {np.median(c):.0f}, p90 {np.percentile(c, 90):.0f}, max {c.max()} of {V}; {len(c)} positions")
