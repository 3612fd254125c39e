"""A llama GGUF as the float32 Hugging Face folder ``draftwise.models.convert`` makes, with
the ``gguf`` package and numpy alone (no transformers): for a machine that has torch but
neither transformers' GGUF support nor the network, such as a lent GPU. Each tensor is
dequantised by ``gguf.quants.dequantize`` and q/k are un-permuted as transformers does;
the config and tokenizer files come from an existing converted folder (``--meta``). For
the embedded default model (Q4_1, Q8_0 embeddings) the result equals the CPU converter's
``model.safetensors`` tensor for tensor, bit for bit (checked 2026-11-29).

Example::

    python scripts/gguf_to_hf_dir.py SmolLM2-135M-Instruct.Q4_1.gguf \\
        --meta ~/.cache/draftwise/models/SmolLM2-135M-Instruct --out /tmp/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np

NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
         "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
         "ffn_norm": "post_attention_layernorm"}
TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
       "output.weight": "lm_head.weight"}


def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """GGUF's llama q/k rows (interleaved RoPE halves) back in the Hugging Face order.

    Example::

        >>> unpermute(np.arange(4.0)[:, None], 1).ravel().tolist()
        [0.0, 2.0, 1.0, 3.0]
    """
    dim = w.shape[0] // heads // 2
    return w.reshape(heads, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


def main() -> None:
    import gguf
    from safetensors.numpy import save_file

    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("gguf", type=Path)
    p.add_argument("--meta", type=Path, required=True,
                   help="a converted folder: its config and tokenizer")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    for f in (args.gguf, args.meta / "config.json"):
        if not f.is_file():
            raise SystemExit(f"no such file: {f}")
    r = gguf.GGUFReader(str(args.gguf))
    arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")
    if arch != "llama":
        raise SystemExit(
            f"{args.gguf} is a {arch!r} model; this script un-permutes llama's q/k only"
        )
    nh = int(r.fields["llama.attention.head_count"].parts[-1][0])
    nkv = int(r.fields["llama.attention.head_count_kv"].parts[-1][0])
    state = {}
    for t in r.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(x) for x in reversed(t.shape)]) if len(t.shape) > 1 else w.reshape(-1)
        if t.name in TOP:
            key = TOP[t.name]
        else:
            _, i, kind, _ = t.name.split(".")
            key = f"model.layers.{i}.{NAMES[kind]}.weight"
            if kind in ("attn_q", "attn_k"):
                w = unpermute(w, nh if kind == "attn_q" else nkv)
        state[key] = np.ascontiguousarray(w)
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.out / "model.safetensors.tmp"
    save_file(state, str(tmp), metadata={"format": "pt"})
    tmp.replace(args.out / "model.safetensors")
    for f in args.meta.iterdir():
        if f.is_file() and f.name not in ("model.safetensors", "source.json"):
            shutil.copy(f, args.out / f.name)
    print(f"{args.out}: {len(state)} tensors")


if __name__ == "__main__":
    main()
