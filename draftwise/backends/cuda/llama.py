"""A lean llama-family forward pass in plain torch, with a preallocated KV cache.

No ``nn.Module`` machinery: the weights are plain tensors and ``Llama.forward`` is a loop
over layers, so a verification step costs little more than its matmuls. The KV cache is
ONE tensor ``(L, 2, H_kv, T_max, D)`` written by slot index (as in gpt-fast): rejected
draft rows are simply overwritten by the next step, and keeping a draft path is a single
indexed gather over all layers at once (``Llama.move_slots``).

Supported ``model_type``: llama, mistral, qwen2 (a bias on q/k/v), qwen3 (per-head q/k
norms), phi3 (fused projections), gemma2 and gemma3_text. The families differ only by
data in ``LlamaConfig`` (``family_fields``): norms with a (1 + w) scale, norms after
attention and MLP, the MLP's activation, embeddings scaled by sqrt(hidden), the attention
scale and logit soft-capping, a second RoPE base for sliding layers. RoPE types:
"default", "llama3" and "linear".

Example::

    model = Llama.load("path/to/hf_dir", dtype=torch.float32, device=torch.device("cpu"),
                       max_cache_len=1024)
    tokens = torch.tensor([1, 2, 3])
    logits = model.forward(tokens, positions=torch.arange(3), start=0,
                           mask=causal_mask(3, 0, tokens.device), need_logits=True)  # (3, V)
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from draftwise.backends.cuda.cpu import f32, hugepages
from draftwise.backends.cuda.cpu.f32 import F32Weight
from draftwise.backends.cuda.cpu.fused import FusedForward
from draftwise.backends.cuda.cpu.int4 import Int4Weight, Weight, fuse_q4, linear, quantize_rtn
from draftwise.backends.cuda.invariant import Plan, plan_attention
from draftwise.backends.gguf_q4 import HEAD, Q4, FourBit, dequantize
from draftwise.core.textpart import text_config, text_weight_name
from draftwise.core.windows import layer_types, sliding_layers
from draftwise.errors import DraftwiseError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text")
# families with a per-head RMSNorm on q and k before RoPE (weights q_norm, k_norm: (D,))
QK_NORM_TYPES = ("qwen3", "gemma3_text")
GEMMA_TYPES = ("gemma2", "gemma3_text")
ACTIVATIONS = {"silu": F.silu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}
SUPPORTED_ROPE_TYPES = ("default", "llama3", "linear", "longrope")
# families that store q/k/v as one qkv_proj and gate/up as one gate_up_proj (the fused
# layout this forward uses anyway: read as they are, gate rows before up rows)
FUSED_PROJ_TYPES = ("phi3",)


@dataclass(frozen=True)
class LlamaConfig:
    """The handful of ``config.json`` fields the forward pass needs."""

    model_type: str
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    norm_eps: float
    rope_theta: float
    rope_type: str
    rope_params: dict[str, Any]
    max_positions: int
    attention_bias: bool
    tie_embeddings: bool
    qk_norm: bool = False  # qwen3, gemma3: RMSNorm over each head's q and k before RoPE
    fused_proj: bool = False  # phi3: qkv_proj and gate_up_proj in the checkpoint
    rope_dim: int = 0  # dims of a head RoPE rotates (partial_rotary_factor); 0: all
    # gemma2 / gemma3 (``family_fields``): every RMSNorm scales by (1 + w) (folded into
    # w at load); norms after attention and after the MLP as well as before; the MLP's
    # activation; embeddings times sqrt(hidden); the attention's scale when it is not
    # head_dim ** -0.5; tanh soft-capping of attention scores and of the logits; the
    # RoPE base of sliding-window layers (gemma3) and which layers those are
    norm_offset: bool = False
    sandwich_norms: bool = False
    act: str = "silu"
    embed_scale: float | None = None
    attn_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    local_rope_theta: float | None = None
    local_layers: tuple[int, ...] = ()
    # gemma2 / gemma3: these layers attend to the last ``sliding_window`` positions only
    sliding_window: int | None = None
    window_layers: tuple[int, ...] = ()

    @property
    def rot_dim(self) -> int:
        """The leading dims of each head that RoPE rotates."""
        return self.rope_dim or self.head_dim

    @property
    def plain_attention(self) -> bool:
        """Softmax of q k^T / sqrt(head_dim) over every earlier position, nothing more
        (the compiled kernels' case)."""
        return self.attn_scale is None and self.attn_softcap is None and not self.window_layers

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> LlamaConfig:
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise DraftwiseError(
                f"unsupported model_type {model_type!r} for the torch backend "
                f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        # transformers 5 moved rope settings into `rope_parameters`; older files use
        # `rope_theta` + `rope_scaling`. gemma3 keeps one set per layer type.
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        if isinstance(rope.get("full_attention"), dict):
            rope = dict(rope["full_attention"])
        theta = cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        rope_type = "longrope" if rope_type == "su" else rope_type  # phi3's older name
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise DraftwiseError(
                f"unsupported rope type {rope_type!r} "
                f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
            )
        n_heads = int(cfg["num_attention_heads"])
        dim = int(cfg["hidden_size"])
        check_sizes(cfg, dim, n_heads)
        head_dim = int(cfg.get("head_dim") or dim // n_heads)
        # phi3 family (Phi-4-mini): RoPE over the first rope_dim of each head's dims only
        partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
        if isinstance(partial, bool) or not isinstance(partial, (int, float)) or not 0 < partial <= 1:
            raise DraftwiseError(f"config.json: partial_rotary_factor must be in (0, 1], got {partial!r}")
        rope_dim = int(head_dim * partial)
        if rope_dim < 2 or rope_dim % 2:
            raise DraftwiseError(f"config.json: partial_rotary_factor {partial} gives {rope_dim} rotary dims (must be even)")
        max_positions = int(cfg.get("max_position_embeddings", 2048))
        if rope_type == "longrope":
            # LongRoPE (Phi-3.5, Phi-4-mini): transformers rotates with the short factors
            # while the sequence fits the original context and switches every new
            # position to the long ones past it: served exactly by capping the context
            # there, with the attention factor its full context implies
            rope = longrope_params(rope, cfg, max_positions, head_dim, rope_dim)
            max_positions = min(max_positions, int(rope["original_max_position_embeddings"]))
        # Sliding-window attention equals full attention while the sequence fits in the
        # window, so a windowed model is served exactly by capping the context there.
        # (gemma's windowed layers are computed as such: ``family_fields``)
        window = cfg.get("sliding_window")
        sliding = "sliding_attention" in (cfg.get("layer_types") or ()) and model_type not in GEMMA_TYPES
        if window is not None and (model_type == "mistral" or cfg.get("use_sliding_window") or sliding):
            max_positions = min(max_positions, int(window))
        return cls(
            model_type=model_type,
            vocab_size=int(cfg["vocab_size"]),
            dim=dim,
            n_layers=int(cfg["num_hidden_layers"]),
            n_heads=n_heads,
            n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            head_dim=int(cfg.get("head_dim") or dim // n_heads),
            ffn_dim=int(cfg["intermediate_size"]),
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            rope_type=rope_type,
            rope_params=rope,
            max_positions=max_positions,
            attention_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qk_norm=model_type in QK_NORM_TYPES,
            fused_proj=model_type in FUSED_PROJ_TYPES,
            rope_dim=rope_dim,
            **family_fields(cfg, model_type, dim, head_dim),
        )


def longrope_params(
    rope: dict[str, Any], cfg: dict[str, Any], max_positions: int, head_dim: int, rope_dim: int
) -> dict[str, Any]:
    """LongRoPE's settings checked, with the original context and the attention factor
    filled in as transformers derives them."""
    out = dict(rope)
    old = rope.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
    if isinstance(old, bool) or not isinstance(old, int) or old < 1:
        raise DraftwiseError(f"longrope needs original_max_position_embeddings, got {old!r}")
    short = rope.get("short_factor")
    if not isinstance(short, list) or len(short) != rope_dim // 2:
        raise DraftwiseError(
            f"longrope short_factor must list {rope_dim // 2} numbers, got "
            f"{len(short) if isinstance(short, list) else short!r}"
        )
    factor = rope.get("factor") or max_positions / old
    attention = rope.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(old))
    out.update(original_max_position_embeddings=old, attention_factor=float(attention))
    return out


def family_fields(cfg: dict[str, Any], model_type: str, dim: int, head_dim: int) -> dict[str, Any]:
    """The ``LlamaConfig`` fields by which gemma2 and gemma3 differ from llama (the
    llama defaults for every other family)."""
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    if act not in ACTIVATIONS:
        raise DraftwiseError(f"unsupported activation {act!r} (supported: {', '.join(ACTIVATIONS)})")
    if model_type not in GEMMA_TYPES:
        return {"act": act}
    out: dict[str, Any] = {"norm_offset": True, "sandwich_norms": True, "act": act,
                           "embed_scale": math.sqrt(dim)}
    scalar = cfg.get("query_pre_attn_scalar")
    if scalar is not None and float(scalar) != float(head_dim):
        out["attn_scale"] = float(scalar) ** -0.5
    for key, field in (("attn_logit_softcapping", "attn_softcap"), ("final_logit_softcapping", "final_softcap")):
        cap = cfg.get(key)
        if cap is not None:
            if not isinstance(cap, (int, float)) or cap <= 0:
                raise DraftwiseError(f"config.json: {key} must be a positive number, got {cap!r}")
            out[field] = float(cap)
    types = layer_types(cfg)
    window, windowed = sliding_layers(cfg)
    if window is not None:
        out["sliding_window"], out["window_layers"] = window, windowed
    if model_type == "gemma3_text":
        params = cfg.get("rope_parameters") or {}
        local = params.get("sliding_attention") if isinstance(params, dict) else None
        theta = (local or {}).get("rope_theta") or cfg.get("rope_local_base_freq") or 10000.0
        if local and local.get("rope_type", "default") != "default":
            raise DraftwiseError(f"unsupported rope type {local.get('rope_type')!r} for sliding layers")
        out["local_rope_theta"] = float(theta)
        out["local_layers"] = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    return out


MAX_SIZE = 1 << 20  # any one size of a config (hidden, heads, vocab, ...) stays below this


def check_sizes(cfg: dict[str, Any], dim: int, n_heads: int) -> None:
    """A config's sizes are positive, bounded and fit together (one line naming the
    field): a model directory is user input, and the forward sizes buffers from it."""
    fields = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
              "vocab_size", "num_key_value_heads", "head_dim", "max_position_embeddings")
    for key in fields:
        v = cfg.get(key)
        if v is None and key in ("num_key_value_heads", "head_dim", "max_position_embeddings"):
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v < MAX_SIZE:
            raise DraftwiseError(f"config.json: {key} must be an integer in 1..{MAX_SIZE - 1}, got {v!r}")
    kv = int(cfg.get("num_key_value_heads") or n_heads)
    if n_heads % kv:
        raise DraftwiseError(
            f"config.json: num_attention_heads {n_heads} is not a multiple of "
            f"num_key_value_heads {kv}"
        )
    if not cfg.get("head_dim") and dim % n_heads:
        raise DraftwiseError(
            f"config.json: hidden_size {dim} is not a multiple of num_attention_heads {n_heads} "
            "(and no head_dim is given)"
        )
    if (cfg.get("head_dim") or dim // n_heads) % 2:
        raise DraftwiseError(f"config.json: head_dim {cfg.get('head_dim') or dim // n_heads} must be even (RoPE)")


def expected_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the forward reads, by checkpoint name, with the shape the config
    implies (``lm_head.weight`` where the checkpoint has one)."""
    c, h, kv, d, f = cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn_dim
    out: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (cfg.vocab_size, c),
        "model.norm.weight": (c,),
        "lm_head.weight": (cfg.vocab_size, c),
    }
    for i in range(cfg.n_layers):
        p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
        out |= {p + "input_layernorm.weight": (c,), p + "post_attention_layernorm.weight": (c,)}
        if cfg.fused_proj:  # in the order the forward reads them: q, k, v, o, mlp
            out |= {a + "qkv_proj.weight": ((h + 2 * kv) * d, c)}
        else:
            out |= {a + "q_proj.weight": (h * d, c), a + "k_proj.weight": (kv * d, c),
                    a + "v_proj.weight": (kv * d, c)}
        out |= {a + "o_proj.weight": (c, h * d)}
        if cfg.fused_proj:
            out |= {p + "mlp.gate_up_proj.weight": (2 * f, c)}
        else:
            out |= {p + "mlp.gate_proj.weight": (f, c), p + "mlp.up_proj.weight": (f, c)}
        out |= {p + "mlp.down_proj.weight": (c, f)}
        if cfg.attention_bias:
            out |= {a + "q_proj.bias": (h * d,), a + "k_proj.bias": (kv * d,), a + "v_proj.bias": (kv * d,)}
        if cfg.qk_norm:
            out |= {a + "q_norm.weight": (d,), a + "k_norm.weight": (d,)}
        if cfg.sandwich_norms:
            out |= {p + "pre_feedforward_layernorm.weight": (c,),
                    p + "post_feedforward_layernorm.weight": (c,)}
    return out


def check_shapes(cfg: LlamaConfig, weights: dict[str, torch.Tensor], where: str) -> None:
    """Each tensor of ``weights`` has the shape ``cfg`` implies, before anything is built
    or packed (one line naming the tensor, its shape and the expected one)."""
    for name, want in expected_shapes(cfg).items():
        w = weights.get(name)
        if w is not None and tuple(w.shape) != want:
            raise DraftwiseError(
                f"{where}: tensor {name!r} has shape {tuple(w.shape)}, the config implies {want}"
            )


@dataclass
class Layer:
    """One decoder block's weights, with q/k/v and gate/up fused so each is one matmul.
    A linear weight is dense, 4-bit (``int4.Int4Weight``, the ``4bit`` mode) or float32
    packed for the compiled AVX2 kernel (``f32.F32Weight``)."""

    attn_norm: torch.Tensor  # (C,)
    wqkv: Weight  # ((H + 2 H_kv) D, C)
    bqkv: torch.Tensor | None  # ((H + 2 H_kv) D,)
    wo: Weight  # (C, H D)
    mlp_norm: torch.Tensor  # (C,)
    w13: Weight  # (2 F, C): gate rows, then up rows
    w2: Weight  # (C, F)
    q_norm: torch.Tensor | None = None  # (D,) qwen3's per-head norm of q, before RoPE
    k_norm: torch.Tensor | None = None  # (D,) and of k
    post_attn_norm: torch.Tensor | None = None  # (C,) gemma: on attention's output
    post_mlp_norm: torch.Tensor | None = None  # (C,) gemma: on the MLP's output
    rope: int = 0  # which RoPE table (gemma3's sliding layers: 1)
    window: bool = False  # attends to the last ``cfg.sliding_window`` positions only


def rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    """(R/2,) float32 inverse frequencies (R = the rotated dims), as transformers
    computes them."""
    d = cfg.rot_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    if cfg.rope_type == "longrope":  # the short factors: see LlamaConfig.from_dict
        short = torch.tensor(cfg.rope_params["short_factor"], dtype=torch.float32)
        inv = 1.0 / (short * cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    if cfg.rope_type == "linear":
        factor = cfg.rope_params.get("factor")
        if not isinstance(factor, (int, float)) or factor <= 0:
            raise DraftwiseError(f"linear rope scaling needs a positive factor, got {factor!r}")
        inv = inv / factor
    if cfg.rope_type == "llama3":
        p = cfg.rope_params
        try:
            factor, lo, hi = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
            old = p.get("original_max_position_embeddings", cfg.max_positions)
        except KeyError as e:
            raise DraftwiseError(f"llama3 rope parameters lack {e.args[0]!r}") from None
        lo_wavelen, hi_wavelen = old / lo, old / hi
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > lo_wavelen, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < hi_wavelen) * ~(wavelen > lo_wavelen)
        inv = torch.where(medium, smoothed, scaled)
    return inv


def rope_tables(
    cfg: LlamaConfig, n: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (n, R) for positions 0..n-1 (R = the rotated dims), computed in float32
    like transformers (LongRoPE's attention factor folded in)."""
    pos = torch.arange(n, dtype=torch.float32)
    freqs = torch.outer(pos, rope_inv_freq(cfg))  # (n, R/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (n, R)
    cos, sin = emb.cos(), emb.sin()
    scale = cfg.rope_params.get("attention_factor") if cfg.rope_type == "longrope" else None
    if scale is not None:
        cos, sin = cos * scale, sin * scale
    return cos.to(device=device, dtype=dtype), sin.to(device=device, dtype=dtype)


def rope_table_set(
    cfg: LlamaConfig, n: int, dtype: torch.dtype, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``rope_tables`` of every RoPE a layer may use (``Layer.rope`` indexes it): the
    model's, then gemma3's sliding layers' own default-RoPE base."""
    out = [rope_tables(cfg, n, dtype, device)]
    if cfg.local_layers:
        local = replace(cfg, rope_theta=cfg.local_rope_theta, rope_type="default", rope_params={})
        out.append(rope_tables(local, n, dtype, device))
    return out


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    if x.is_cuda:
        # torch's fused kernel: one launch where the reference takes five. A CUDA step
        # is launch-bound (measured on an H200, 8B shape, graphs: 8.30 -> 7.09 ms a
        # step); its bf16 rounding differs from transformers' by an ulp at most.
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    # Normalise in float32 then cast back before the weight, exactly like transformers,
    # so that bf16 results match the reference implementation bit for bit where possible.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def causal_mask(t: int, start: int, device: torch.device) -> torch.Tensor:
    """(t, start + t) bool: row i sees the cache prefix and rows <= i."""
    cols = torch.arange(start + t, device=device)
    rows = torch.arange(start, start + t, device=device)
    return cols[None, :] <= rows[:, None]


def _check_codes(name: str, q4: Q4, dense: torch.Tensor) -> None:
    """The first rows of ``q4`` must dequantise to the checkpoint's weight ``dense``: the
    GGUF read is the one this checkpoint was converted from, rows in the same order."""
    rows = min(8, dense.shape[0])
    head = (q4[0][:rows], q4[1][:rows], q4[2][:rows])
    want = dense[:rows].float().numpy()
    k = int(dense.shape[1])
    shape_ok = q4[0].shape[0] == dense.shape[0] and q4[0].shape[1] % k == 0
    if not shape_ok or not np.allclose(
        dequantize(head, k), want, rtol=1e-5, atol=1e-7 * float(np.abs(want).max() + 1)
    ):
        raise DraftwiseError(
            f"the GGUF's 4-bit codes for {name!r} do not match the converted weights "
            f"(shape {q4[0].shape} vs {tuple(dense.shape)}): reconvert the model"
        )


def read_llama_config(model_dir: str | Path) -> LlamaConfig:
    path = Path(model_dir) / "config.json"
    if not path.exists():
        raise DraftwiseError(f"no config.json in {model_dir}")
    return LlamaConfig.from_dict(text_config(json.loads(path.read_text())))


def read_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint (sharded or not), on CPU, keyed by HF name."""
    files = sorted(model_dir.glob("*.safetensors"))
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [model_dir / n for n in names]
    if not files:
        raise DraftwiseError(f"no *.safetensors weights in {model_dir}")
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))  # to CPU first: the fused copies happen on device
    if any(k.startswith(("model.language_model.", "language_model.")) for k in out):
        # a multimodal checkpoint (gemma3): its text model's tensors only
        renamed = {text_weight_name(k): v for k, v in out.items()}
        out = {k: v for k, v in renamed.items() if k is not None}
    quant = json.loads((model_dir / "config.json").read_text()).get("quantization")
    if isinstance(quant, dict) and any(k.endswith(".scales") for k in out):
        bits, group = int(quant.get("bits", 0)), int(quant.get("group_size", 0))
        print(f"draftwise: {model_dir.name} is MLX-quantized ({bits}-bit): dequantising its "
              "weights for the torch backend", file=sys.stderr)
        out = dequantize_mlx(out, bits, group)
    return out


def dequantize_mlx(weights: dict[str, torch.Tensor], bits: int, group: int) -> dict[str, torch.Tensor]:
    """MLX's affine quantization undone: each ``W`` stored as uint32 words of ``bits``-bit
    codes (lowest bits first) with ``scales`` and ``biases`` per ``group`` inputs becomes
    ``codes * scale + bias`` in float32 (mlx.core.dequantize).

    Example::

        w = dequantize_mlx({"a.weight": packed, "a.scales": s, "a.biases": b}, 4, 64)["a.weight"]
    """
    if bits not in (2, 4, 8) or group < 1:
        raise DraftwiseError(
            f"MLX {bits}-bit weights in groups of {group} are not supported on torch (2, 4 and 8 bits are)"
        )
    out = dict(weights)
    per = 32 // bits
    for name in [k for k in weights if k.endswith(".scales")]:
        base = name[: -len(".scales")]
        packed = out.pop(base + ".weight")  # (N, K / per) uint32
        scales = out.pop(name).float()  # (N, K / group)
        biases = out.pop(base + ".biases").float()  # (N, K / group)
        words = packed.to(torch.int64) & 0xFFFFFFFF  # (N, K / per)
        shifts = torch.arange(per, dtype=torch.int64) * bits  # (per,)
        codes = (words[..., None] >> shifts) & ((1 << bits) - 1)  # (N, K / per, per)
        codes = codes.reshape(packed.shape[0], -1).float()  # (N, K)
        k = codes.shape[1]
        if scales.shape[-1] * group != k:
            raise DraftwiseError(f"MLX-quantized {base}: {k} inputs, {scales.shape[-1]} groups of {group}")
        w = codes.view(-1, k // group, group) * scales[..., None] + biases[..., None]  # (N, K/g, g)
        out[base + ".weight"] = w.reshape(packed.shape[0], k)  # (N, K) float32
    return out


class Llama:
    """Weights + KV cache + forward. Batch size 1; see the module docstring."""

    def __init__(
        self,
        cfg: LlamaConfig,
        weights: dict[str, torch.Tensor],
        dtype: torch.dtype,
        device: torch.device,
        max_cache_len: int,
        cache_dtype: torch.dtype | None = None,
        q4: FourBit | None = None,
    ) -> None:
        """``q4``: 4-bit linear layers (the ``4bit`` mode, CPU, bfloat16 activations) with
        the codes given (a GGUF's own); a fused weight some part of which has none stays
        dense, or with ``round_missing`` (no GGUF) is rounded to nearest."""
        self.cfg, self.dtype, self.device = cfg, dtype, device
        self.int4 = q4 is not None
        if self.int4 and (dtype != torch.bfloat16 or device.type != "cpu"):
            raise DraftwiseError("4-bit weights run on CPU with bfloat16 activations only")
        # The batch-invariant mode keeps K/V in float32 (values the compute dtype can
        # represent, so nothing changes numerically): its float32 attention then reads
        # the cache as it lies instead of converting the whole prefix every layer.
        self.cache_dtype = cache_dtype or dtype
        self.n_rep = cfg.n_heads // cfg.n_kv_heads

        check_shapes(cfg, weights, "checkpoint")

        def take(name: str) -> torch.Tensor:
            if name not in weights:
                raise DraftwiseError(f"weight {name!r} missing from the checkpoint")
            return weights.pop(name).to(device=device, dtype=dtype)

        def fuse(*names: str) -> torch.Tensor:
            return torch.cat([take(n) for n in names], dim=0).contiguous()

        def norm(name: str) -> torch.Tensor:
            """An RMSNorm weight; gemma's (1 + w) folded in, in float32 as it computes it."""
            if cfg.norm_offset and name in weights:
                weights[name] = 1.0 + weights[name].float()
            return take(name)

        native_f32 = q4 is None and f32.available(dtype, device)
        # every linear row-invariant by construction (f32.c): no padding rows needed
        self.native_f32 = native_f32

        def lin(*names: str) -> Weight:
            """A linear weight (several fused along the output rows)."""
            if native_f32:
                return F32Weight.from_dense(fuse(*names))  # float32, AVX2 CPU: f32.py
            if q4 is None or (not q4.round_missing and any(n not in q4.codes for n in names)):
                return fuse(*names)  # dense (a Q6_K tensor of a Q4_K_M file, say)
            parts = []
            for n in names:
                if n not in weights:
                    raise DraftwiseError(f"weight {n!r} missing from the checkpoint")
                dense = weights.pop(n)  # (N, K) float
                codes = q4.codes.get(n)
                if codes is None:
                    codes = quantize_rtn(dense)
                else:
                    _check_codes(n, codes, dense)
                parts.append(codes)
            return Int4Weight.from_codes(*fuse_q4(parts))

        with torch.inference_mode():
            # 4bit: the head's own codes when the GGUF has them (a Q8_0 head split into two
            # 4-bit halves, exact); checked against the dense head before it is converted
            self.head_q: Int4Weight | F32Weight | None = None
            if q4 is not None and HEAD in q4.codes:
                untied = HEAD in weights and not cfg.tie_embeddings
                dense_head = weights[HEAD if untied else "model.embed_tokens.weight"]
                codes = q4.codes[HEAD]
                _check_codes(HEAD, codes, dense_head)
                reps = codes[0].shape[1] // int(dense_head.shape[1])
                self.head_q = Int4Weight.from_codes(*codes, repeat=reps)
            self.embed = take("model.embed_tokens.weight")  # (V, C)
            self.layers: list[Layer] = []
            for i in range(cfg.n_layers):
                p = f"model.layers.{i}."
                a = p + "self_attn."
                if cfg.fused_proj:  # phi3: already one matrix each
                    qkv_names = (a + "qkv_proj.weight",)
                    w13_names = (p + "mlp.gate_up_proj.weight",)
                else:
                    qkv_names = (a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight")
                    w13_names = (p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
                bias = None
                if cfg.attention_bias:
                    bias = fuse(a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias")
                # gemma: post_attention_layernorm is on attention's output, and the MLP
                # has its own pre- and post-norms; llama's is the MLP's pre-norm
                sw = cfg.sandwich_norms
                self.layers.append(
                    Layer(
                        attn_norm=norm(p + "input_layernorm.weight"),
                        wqkv=lin(*qkv_names),
                        bqkv=bias,
                        wo=lin(a + "o_proj.weight"),
                        mlp_norm=norm(p + ("pre_feedforward_layernorm.weight" if sw
                                           else "post_attention_layernorm.weight")),
                        w13=lin(*w13_names),
                        w2=lin(p + "mlp.down_proj.weight"),
                        q_norm=norm(a + "q_norm.weight") if cfg.qk_norm else None,
                        k_norm=norm(a + "k_norm.weight") if cfg.qk_norm else None,
                        post_attn_norm=norm(p + "post_attention_layernorm.weight") if sw else None,
                        post_mlp_norm=norm(p + "post_feedforward_layernorm.weight") if sw else None,
                        rope=1 if i in cfg.local_layers else 0,
                        window=i in cfg.window_layers,
                    )
                )
            self.norm = norm("model.norm.weight")  # (C,)
            if "lm_head.weight" in weights and not cfg.tie_embeddings:
                self.lm_head = take("lm_head.weight")  # (V, C)
            else:
                # Tied embeddings (or a checkpoint that stores only the embedding).
                self.lm_head = self.embed
            if native_f32:  # a packed copy for the head; lm_head stays for lookups and cuts
                self.head_q = F32Weight.from_dense(self.lm_head)
            # Anything left (an o_proj or MLP bias, extra norms...) means a block this
            # forward does not compute: refuse rather than silently produce wrong logits.
            ignored = ("lm_head.weight",)
            unused = [k for k in weights if k not in ignored and not k.endswith("inv_freq")]
            if unused:
                raise DraftwiseError(
                    f"checkpoint has weights the {cfg.model_type} forward does not use: "
                    f"{', '.join(sorted(unused)[:3])}"
                )
            # (cos, sin) per table: the model's, and gemma3's sliding layers' own base
            self.ropes = rope_table_set(cfg, max_cache_len, dtype, device)
            self.cos, self.sin = self.ropes[0]
            half = cfg.rot_dim // 2
            # sin with its first half negated: rotate_half(x) * sin == roll(x) * this
            self.sins_signed = [torch.cat([-sn[:, :half], sn[:, half:]], dim=-1) for _, sn in self.ropes]
            self.act = ACTIVATIONS[cfg.act]
            # gemma: embeddings times sqrt(hidden), rounded to the compute dtype first (as
            # transformers does)
            self.embed_scale = (None if cfg.embed_scale is None
                                else torch.tensor(cfg.embed_scale, dtype=dtype, device=device))
            self.max_cache_len = max_cache_len
            # the fixed step on row-invariant Triton kernels (gpu/rowinv.py), set by
            # StepGraphs where it applies
            self.rowinv: Any = None
            self.last_x: torch.Tensor | None = None  # (T, C) of the last forward
            self.cache = torch.zeros(
                (cfg.n_layers, 2, cfg.n_kv_heads, max_cache_len, cfg.head_dim),
                dtype=self.cache_dtype,
                device=device,
            )  # (L, 2, H_kv, T_max, D)
            if device.type == "cpu":
                self._place_on_huge_pages()
            # the 4bit mode's verify as one compiled call, where it applies (fused.py)
            self.fused = FusedForward.build(self) if self.int4 else None

    def _place_on_huge_pages(self) -> None:
        """The compiled kernels' packed weights and the K/V cache, which every CPU step
        streams, copied into one mapping on 2 MB pages (``cpu/hugepages.py``: the same
        bytes; on an AMD EPYC Zen 3 a 4bit verify 3-5% faster, a float32 one 6-12%)."""
        packed = (Int4Weight, F32Weight)
        owners = [
            w for ly in self.layers for w in (ly.wqkv, ly.wo, ly.w13, ly.w2)
            if isinstance(w, packed) and w.lib is not None
        ]
        if isinstance(self.head_q, packed) and self.head_q.lib is not None:
            owners.append(self.head_q)
        placed = hugepages.place([w.packed for w in owners] + [self.cache])
        for w, t in zip(owners, placed[:-1], strict=True):
            w.packed = t
        self.cache = placed[-1]

    @classmethod
    def load(
        cls,
        model_dir: str | Path,
        dtype: torch.dtype,
        device: torch.device,
        max_cache_len: int,
        cache_dtype: torch.dtype | None = None,
        q4: FourBit | None = None,
    ) -> Llama:
        cfg = read_llama_config(model_dir)
        weights = read_weights(Path(model_dir))
        return cls(cfg, weights, dtype, device, max_cache_len, cache_dtype, q4)

    def qk_norm(self, layer: Layer, qk: torch.Tensor) -> torch.Tensor:
        """qwen3's per-head RMSNorm of q and k (before RoPE); ``qk`` (..., H + H_kv, D).
        The identity for families without it."""
        if layer.q_norm is None or layer.k_norm is None:
            return qk
        h, eps = self.cfg.n_heads, self.cfg.norm_eps
        q = rms_norm(qk[..., :h, :], layer.q_norm, eps)  # (..., H, D)
        k = rms_norm(qk[..., h:, :], layer.k_norm, eps)  # (..., H_kv, D)
        return torch.cat([q, k], dim=-2)  # (..., H + H_kv, D)

    # ----- the pieces every forward shares (the family differences live here) ----------
    def embed_rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """(..., C) input embeddings of ``tokens`` (gemma: times sqrt(hidden))."""
        x = self.embed[tokens]
        return x if self.embed_scale is None else x * self.embed_scale

    def rope_rows(self, positions: torch.Tensor, signed: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin) of ``positions`` (T,) as (T, 1, D) each, per RoPE table (a layer
        takes ``ropes[layer.rope]``); ``signed``: sin with its first half negated."""
        sins = self.sins_signed if signed else [sn for _, sn in self.ropes]
        return [(c[positions].unsqueeze(1), sn[positions].unsqueeze(1)) for (c, _), sn in zip(self.ropes, sins)]

    def attention(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Softmax attention ``q`` (1, H_kv, R, D) over ``keys``/``values`` (1, H_kv, S, D)
        under ``mask`` (R, S): bool (True = may attend) or an additive bias. SDPA, or with
        gemma2's score soft-capping written out as transformers does (float32 softmax)."""
        cfg = self.cfg
        if cfg.attn_softcap is None:
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=cfg.attn_scale)
        scale = cfg.attn_scale if cfg.attn_scale is not None else cfg.head_dim**-0.5
        cap = cfg.attn_softcap
        s = torch.tanh((q @ keys.transpose(-1, -2)) * scale / cap) * cap  # (1, H_kv, R, S)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
        return torch.softmax(s.float(), dim=-1).to(q.dtype) @ values  # (1, H_kv, R, D)

    def window_mask(self, mask: torch.Tensor | None, positions: torch.Tensor, start: int) -> torch.Tensor | None:
        """(T, start+T) bool for the sliding-window layers: ``mask`` (None: every slot)
        and only keys within the last ``sliding_window`` positions of the row's (slot j
        < start holds position j; the new rows' slots hold ``positions``). None when the
        model has no such layers or no key is that far back."""
        w = self.cfg.sliding_window
        t = positions.shape[0]
        if w is None or start + t <= w:
            return None
        keys = torch.cat([torch.arange(start, device=positions.device), positions])  # (S,)
        near = keys[None, :] > positions[:, None] - w  # (T, S)
        return near if mask is None else mask & near

    def attn_residual(self, layer: Layer, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """The residual stream ``x`` (T, C) plus attention's output ``o`` (T, H D) projected
        (gemma: and normed)."""
        a = linear(o, layer.wo)  # (T, C)
        if layer.post_attn_norm is not None:
            a = rms_norm(a, layer.post_attn_norm, self.cfg.norm_eps)
        return x + a

    def mlp_residual(self, layer: Layer, x: torch.Tensor) -> torch.Tensor:
        """``x`` (..., C) plus the MLP of its norm (gemma: GeGLU, and normed after)."""
        hn = rms_norm(x, layer.mlp_norm, self.cfg.norm_eps)  # (..., C)
        gate, up = linear(hn, layer.w13).chunk(2, dim=-1)  # 2 x (..., F)
        m = linear(self.act(gate) * up, layer.w2)  # (..., C)
        if layer.post_mlp_norm is not None:
            m = rms_norm(m, layer.post_mlp_norm, self.cfg.norm_eps)
        return x + m

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: (T, H, D); cos/sin: (T, 1, R). rotate_half convention, as in transformers;
        # with a partial rotary factor only the first R dims turn.
        r = cos.shape[-1]
        if r < x.shape[-1]:
            return torch.cat([self._rope(x[..., :r], cos, sin), x[..., r:]], dim=-1)
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # (T, H, D)
        return x * cos + rot * sin

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        start: int,
        mask: torch.Tensor | None,
        need_logits: bool,
        plan: Plan | None = None,
        n_write: int | None = None,
    ) -> torch.Tensor | None:
        """Run ``tokens`` (T,) at RoPE ``positions`` (T,), writing their K/V to cache
        slots ``start .. start+T``. ``mask`` (T, start+T) bool, True = may attend; None
        means every row sees every slot up to ``start+T`` (right for T == 1).
        Returns logits (T, V) when ``need_logits`` else None (prefill skips the lm_head).

        With a ``plan`` (batch-invariant mode, see ``invariant.py``) attention follows
        the plan and ``mask`` is ignored; only the first ``n_write`` rows (default all)
        write K/V, so padding rows never touch the cache.
        """
        cfg = self.cfg
        t = tokens.shape[0]
        w = t if n_write is None else n_write
        if (
            self.fused is not None
            and plan is not None
            and plan.native is not None
            and plan.extra.shape[0] == t  # no padding rows
        ):
            self.last_x, xn = self.fused(tokens, positions, start, plan, w)  # (T, C) x 2
            return self.logits(xn) if need_logits else None
        end = start + t
        h, hkv, d, rep = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, self.n_rep
        ropes = self.rope_rows(positions)  # per table: (T, 1, D) x 2
        local = self.window_mask(mask, positions, start) if plan is None else None  # (T, S)
        if mask is not None:
            # Queries are grouped per kv head as (H_kv, rep * T) rows (see below), so the
            # (T, S) mask is tiled rep times along the rows.
            mask = mask.repeat(rep, 1)  # (rep T, S)
        if local is not None:
            local = local.repeat(rep, 1)  # (rep T, S)
        x = self.embed_rows(tokens)  # (T, C)
        for li, layer in enumerate(self.layers):
            hn = rms_norm(x, layer.attn_norm, cfg.norm_eps)  # (T, C)
            qkv = linear(hn, layer.wqkv, layer.bqkv)  # (T, (H + 2 H_kv) D)
            qk = qkv[:, : (h + hkv) * d].view(t, h + hkv, d)  # (T, H + H_kv, D)
            qk = self._rope(self.qk_norm(layer, qk), *ropes[layer.rope])  # (T, H + H_kv, D): one RoPE
            q = qk[:, :h].transpose(0, 1)  # (H, T, D)
            k = qk[:, h:].transpose(0, 1)  # (H_kv, T, D)
            v = qkv[:, (h + hkv) * d :].view(t, hkv, d).transpose(0, 1)  # (H_kv, T, D)
            kv = self.cache[li]  # (2, H_kv, T_max, D)
            kv[0, :, start : start + w] = k[:, :w]
            kv[1, :, start : start + w] = v[:, :w]
            if plan is not None:
                win = plan.window if layer.window else None
                o = plan_attention(q, kv, plan, rep, cfg.attn_scale, cfg.attn_softcap, win).to(x.dtype)  # (T, H D)
            else:
                # (a no-op cast unless the cache is kept in float32: invariant prefill)
                keys = kv[0, :, :end].unsqueeze(0).to(q.dtype)  # (1, H_kv, S, D)
                values = kv[1, :, :end].unsqueeze(0).to(q.dtype)  # (1, H_kv, S, D)
                # GQA without repeating K/V: the rep query heads sharing a kv head become
                # rep * T query rows of that head (HF's repeat_kv: q head j -> kv j // rep).
                qg = q.reshape(1, hkv, rep * t, d)  # (1, H_kv, rep T, D)
                o = self.attention(qg, keys, values, local if layer.window and local is not None else mask)
                # reshape: CUDA's kernels may return o with other strides than CPU's
                o = o.reshape(h, t, d).transpose(0, 1).reshape(t, h * d)  # (T, H D)
            x = self.attn_residual(layer, x, o)  # (T, C)
            x = self.mlp_residual(layer, x)  # (T, C)
        # Kept on the device (a reference, no copy): a drafter conditioned on the target's
        # last hidden state (ReDrafter) reads a row of it after ``commit``.
        self.last_x = x  # (T, C) residual stream before the final norm
        if not need_logits:
            return None
        return self.logits(rms_norm(x, self.norm, cfg.norm_eps))  # (T, V)

    def forward_fixed(
        self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, bias: torch.Tensor,
        local: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """A step whose shapes never change, for CUDA graphs (``gpu/graphs.py``): rows
        ``tokens`` (B,) at RoPE ``positions`` (B,) write their K/V to cache ``slots`` (B,)
        (device tensors: no host value is baked in) and attend over EVERY cache slot under
        ``bias`` (B, S) additive (0 = may attend, -inf = not; S = ``max_cache_len``).
        ``local`` (B, S): the bias of sliding-window layers (gemma), where they are.
        Returns logits (B, V); ``last_x`` is set as ``forward`` sets it.

        Example (two rows over a 3-token cache, the second a child of the first)::

            bias = torch.full((2, S), -inf); bias[:, :3] = 0; bias[0, 3] = 0; bias[1, 3:5] = 0
            logits = model.forward_fixed(ids, torch.tensor([3, 4]), torch.tensor([3, 4]), bias)
        """
        if self.rowinv is not None:
            return self.rowinv.forward_fixed(tokens, positions, slots, bias, local)
        cfg = self.cfg
        t = tokens.shape[0]
        h, hkv, d, rep = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, self.n_rep
        ropes = self.rope_rows(positions, signed=True)  # per table: (B, 1, R) x 2
        half, r = cfg.rot_dim // 2, cfg.rot_dim
        # queries grouped per kv head as (H_kv, rep B) rows, as in ``forward``
        bias = bias.to(self.dtype).repeat(rep, 1)  # (rep B, S)
        if local is not None:
            local = local.to(self.dtype).repeat(rep, 1)  # (rep B, S)
        x = self.embed_rows(tokens)  # (B, C)
        for li, layer in enumerate(self.layers):
            hn = rms_norm(x, layer.attn_norm, cfg.norm_eps)  # (B, C)
            qkv = linear(hn, layer.wqkv, layer.bqkv)  # (B, (H + 2 H_kv) D)
            qk = qkv[:, : (h + hkv) * d].view(t, h + hkv, d)  # (B, H + H_kv, D)
            qk = self.qk_norm(layer, qk)
            cos, sin = ropes[layer.rope]
            # RoPE in three launches (``_rope`` takes five): x cos + roll(x) sin_signed
            if r == d:
                qk = torch.addcmul(qk * cos, qk.roll(half, dims=-1), sin)  # (B, H + H_kv, D)
            else:  # partial: the first R dims turn
                turned = torch.addcmul(qk[..., :r] * cos, qk[..., :r].roll(half, dims=-1), sin)
                qk = torch.cat([turned, qk[..., r:]], dim=-1)  # (B, H + H_kv, D)
            q = qk[:, :h].transpose(0, 1)  # (H, B, D)
            k = qk[:, h:].transpose(0, 1)  # (H_kv, B, D)
            v = qkv[:, (h + hkv) * d :].view(t, hkv, d).transpose(0, 1)  # (H_kv, B, D)
            kv = self.cache[li]  # (2, H_kv, S, D)
            kv[0].index_copy_(1, slots, k.to(kv.dtype))
            kv[1].index_copy_(1, slots, v.to(kv.dtype))
            keys = kv[0].unsqueeze(0).to(q.dtype)  # (1, H_kv, S, D)
            values = kv[1].unsqueeze(0).to(q.dtype)  # (1, H_kv, S, D)
            qg = q.reshape(1, hkv, rep * t, d)  # (1, H_kv, rep B, D)
            o = self.attention(qg, keys, values, local if layer.window and local is not None else bias)
            o = o.reshape(h, t, d).transpose(0, 1).reshape(t, h * d)  # (B, H D)
            x = self.attn_residual(layer, x, o)  # (B, C)
            x = self.mlp_residual(layer, x)  # (B, C)
        self.last_x = x  # (B, C)
        return self.logits(rms_norm(x, self.norm, cfg.norm_eps))  # (B, V)

    def logits(self, xn: torch.Tensor) -> torch.Tensor:
        """The head over final-normed rows ``xn`` (T, C) -> (T, V): its 4-bit codes in the
        4bit mode when the GGUF has them, its packed float32 copy where the AVX2 kernel
        runs, else the dense ``lm_head``."""
        out = self.head_q(xn) if self.head_q is not None else F.linear(xn, self.lm_head)
        if self.cfg.final_softcap is not None:  # gemma2: tanh soft-capping of the logits
            cap = self.cfg.final_softcap
            out = torch.tanh(out / cap) * cap
        return out

    def norm_rows(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """RMSNorm of rows ``x`` (..., C) with weight ``w`` (C,) and the model's eps (for
        steps built outside this module: ``gpu/rowinv.py``)."""
        return rms_norm(x, w, self.cfg.norm_eps)

    def final_hidden(self, x: torch.Tensor) -> torch.Tensor:
        """The last-layer hidden state (after the final norm) of residual rows ``x``
        (..., C): what the lm_head reads."""
        return rms_norm(x, self.norm, self.cfg.norm_eps)  # (..., C)

    def move_slots(self, src: torch.Tensor, dst_start: int) -> None:
        """Copy cache slots ``src`` (K,) to ``dst_start .. dst_start+K`` in every layer
        with one gather + one write (the gather copies first, so overlap is safe)."""
        k = src.shape[0]
        # (L, 2, H_kv, K, D)
        self.cache[:, :, :, dst_start : dst_start + k] = self.cache[:, :, :, src]
