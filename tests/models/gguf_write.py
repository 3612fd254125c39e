"""Write a GGUF file of a transformers checkpoint, as llama.cpp's converter lays it out, for
tests: llama and qwen3 architectures, block linears in Q8_0 or Q4_K, the tokenizer's
metadata copied from the default model's GGUF (the checkpoints share its tokenizer).

gguf-py quantizes Q8_0 but not the K-quants, so Q4_K is encoded here (``q4_k``), checked
against gguf-py's own decoder. A Q4_K_M file has Q6_K tensors too (the V projection, half
the down projections, the head); with no Q6_K encoder at hand they are Q8_0 here, which
keeps what the test needs: 4-bit block linears beside tensors that must stay dense.

Example::

    path = write_gguf(hf_model, "llama", tmp / "m.gguf", default_gguf_path(), "Q4_K")
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# transformers' names -> llama.cpp's, per layer
_LAYER = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
# in a Q4_K_M file these are Q6_K (written Q8_0 here); the rest of the block linears Q4_K
_Q6_IN_Q4KM = ("attn_v", "ffn_down")


def q4_k(x: np.ndarray) -> np.ndarray:
    """(N, K) float32, K a multiple of 256 -> (N, K / 256 * 144) uint8 Q4_K super-blocks:
    per 32 values a 6-bit scale and min under the super-block's f16 ``d`` and ``dmin``;
    value = d * sc * q - dmin * m with 4-bit q."""
    n, k = x.shape
    sb = x.reshape(n, k // 256, 8, 32).astype(np.float32)  # (N, S, 8, 32)
    lo = np.minimum(sb.min(-1), 0.0)  # (N, S, 8): mins are subtracted, so <= 0
    scale = (sb.max(-1) - lo) / 15.0  # (N, S, 8)
    d = (scale.max(-1) / 63.0).astype(np.float16)  # (N, S)
    dmin = ((-lo).max(-1) / 63.0).astype(np.float16)  # (N, S)
    df, mf = d.astype(np.float32)[..., None], dmin.astype(np.float32)[..., None]
    sc = np.clip(np.rint(np.divide(scale, df, out=np.zeros_like(scale), where=df > 0)), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(np.divide(-lo, mf, out=np.zeros_like(lo), where=mf > 0)), 0, 63).astype(np.uint8)
    step = (df * sc)[..., None]  # (N, S, 8, 1)
    off = (mf * mn)[..., None]
    q = np.clip(np.rint(np.divide(sb + off, step, out=np.zeros_like(sb), where=step > 0)), 0, 15).astype(np.uint8)
    scales = np.zeros((n, k // 256, 12), np.uint8)
    scales[..., 0:4] = sc[..., :4] | ((sc[..., 4:] >> 4) << 6)
    scales[..., 4:8] = mn[..., :4] | ((mn[..., 4:] >> 4) << 6)
    scales[..., 8:12] = (sc[..., 4:] & 0xF) | ((mn[..., 4:] & 0xF) << 4)
    # 4 chunks of 64 values: byte l holds sub-block 2c's value l (low) and 2c+1's (high)
    qs = (q[..., 0::2, :] | (q[..., 1::2, :] << 4)).reshape(n, k // 256, 128)
    out = np.concatenate([d.view(np.uint8).reshape(n, -1, 2), dmin.view(np.uint8).reshape(n, -1, 2),
                          scales, qs], axis=-1)  # (N, S, 144)
    return out.reshape(n, -1)


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order for llama (transformers undoes it when loading)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, arch: str, out: Path, tokenizer_gguf: Path, quant: str) -> Path:
    """``model`` (a transformers llama or qwen3 CausalLM) as a GGUF of ``arch`` with block
    linears in ``quant`` (Q8_0 or Q4_K), norms float32, embeddings and head Q8_0."""
    import gguf

    cfg = model.config
    t = gguf.GGMLQuantizationType
    w = gguf.GGUFWriter(str(out), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta") or getattr(cfg, "rope_theta", 10000.0)
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(15 if quant == "Q4_K" else 7)  # MOSTLY_Q4_K_M, MOSTLY_Q8_0
    reader = gguf.GGUFReader(str(tokenizer_gguf))
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            sub = field.types[1] if len(field.types) > 1 else None
            w.add_key_value(key, field.contents(), field.types[0], sub)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}

    def put(name: str, x: np.ndarray, kind: str) -> None:
        if kind == "F32" or x.ndim == 1:
            w.add_tensor(name, x.astype(np.float32))
        elif kind == "Q4_K" and x.shape[1] % 256 == 0:
            w.add_tensor(name, q4_k(x), raw_dtype=t.Q4_K)
        else:
            w.add_tensor(name, gguf.quants.quantize(x, t.Q8_0), raw_dtype=t.Q8_0)

    put("token_embd.weight", sd["model.embed_tokens.weight"], "Q8_0")
    for i in range(cfg.num_hidden_layers):
        for hf, cpp in _LAYER.items():
            key = f"model.layers.{i}.{hf}.weight"
            if key not in sd:
                continue
            x = sd[key]
            if arch == "llama" and cpp == "attn_q":
                x = _permute(x, cfg.num_attention_heads)
            elif arch == "llama" and cpp == "attn_k":
                x = _permute(x, cfg.num_key_value_heads)
            put(f"blk.{i}.{cpp}.weight", x, "Q8_0" if cpp in _Q6_IN_Q4KM else quant)
    put("output_norm.weight", sd["model.norm.weight"], "F32")
    if not cfg.tie_word_embeddings:
        put("output.weight", sd["lm_head.weight"], "Q8_0")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
