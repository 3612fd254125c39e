"""Load a llama-family model into an mlx-lm module, cast or quantized in memory.

mlx-lm builds the module and reads the safetensors; this file only decides the config
overrides, the dtype and the quantization. Nothing is written to disk: quantizing a
model with ``mlx.nn.quantize`` takes about as long as reading its float weights, so a
converted copy in the cache would save little and cost a second copy of every model.

Example::

    module, cfg = load_module("path/to/hf_dir", dtype="4bit")
    module.model.layers[0].self_attn.q_proj      # a QuantizedLinear
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from draftwise.core.textpart import text_config
from draftwise.core.windows import WINDOWED_TYPES
from draftwise.errors import DraftwiseError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text")
FLOAT_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
QUANT_BITS = {"4bit": 4, "8bit": 8}
DTYPES = (*FLOAT_DTYPES, *QUANT_BITS)
GROUP_SIZE = 64  # mlx-lm's default for 4- and 8-bit affine quantization


def has_gpu() -> bool:
    """True when MLX computes on a GPU (Metal on Apple silicon, or CUDA)."""
    if mx.metal.is_available():
        return True
    cuda = getattr(mx, "cuda", None)
    return bool(cuda is not None and cuda.is_available())


def default_dtype() -> str:
    # 4-bit matmuls win where memory bandwidth is the limit (GPUs); MLX's CPU kernels
    # are faster in float32 for small models, and float32 is what the tests compare.
    return "4bit" if has_gpu() else "float32"


def read_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config.json"
    if not path.is_file():
        raise DraftwiseError(f"no config.json in {model_dir}")
    full: dict[str, Any] = json.loads(path.read_text())
    cfg = text_config(full)  # a multimodal checkpoint (gemma3): its text model
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise DraftwiseError(
            f"unsupported model_type {model_type!r} for the mlx backend "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if isinstance(rope.get("full_attention"), dict):  # gemma3: one set per layer type
        rope = rope["full_attention"]
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "llama3", "linear", "longrope", "su"):
        raise DraftwiseError(f"unsupported rope type {rope_type!r} (supported: default, llama3, linear, longrope)")
    partial = rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial != 1.0 and cfg.get("model_type") != "phi3":  # mlx-lm's phi3 rotates part of a head
        raise DraftwiseError(f"partial_rotary_factor {partial} is supported for phi3 only")
    return full


def longrope(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """LongRoPE's settings (phi3: Phi-3.5, Phi-4-mini), or None: the short factors, the
    original context and the attention factor, as transformers derives them."""
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type")) not in ("longrope", "su"):
        return None
    old = rope.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
    if not isinstance(old, int) or old < 1:
        raise DraftwiseError(f"longrope needs original_max_position_embeddings, got {old!r}")
    factor = rope.get("factor") or int(cfg.get("max_position_embeddings") or old) / old
    attention = rope.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(old))
    return {"short_factor": rope["short_factor"], "original": old, "attention": float(attention)}


def config_overrides(cfg: dict[str, Any]) -> dict[str, Any]:
    """``_overrides`` of the config, or of its ``text_config`` (a multimodal checkpoint,
    whose module builds its text model from that)."""
    if text_config(cfg) is not cfg:
        inner = _overrides(cfg["text_config"] | {"model_type": text_config(cfg)["model_type"]})
        out: dict[str, Any] = {"text_config": {**cfg["text_config"], **inner}}
        if "vocab_size" in cfg["text_config"] and "vocab_size" not in cfg:
            out["vocab_size"] = cfg["text_config"]["vocab_size"]  # mlx-lm's gemma3 copies it in
        return out
    return _overrides(cfg)


def _overrides(cfg: dict[str, Any]) -> dict[str, Any]:
    """Fields mlx-lm's ModelArgs would otherwise get wrong.

    transformers 5 writes RoPE settings as ``rope_parameters`` (theta inside); mlx-lm
    0.32 reads only ``rope_theta``/``rope_scaling`` and would silently fall back to
    theta 10000, which changes every logit of SmolLM2 (theta 100000).
    """
    out: dict[str, Any] = {}
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and isinstance(rope.get("full_attention"), dict):
        # gemma3 (transformers 5): the global layers' set, and the sliding layers' base
        local = rope.get("sliding_attention") or {}
        if "rope_theta" in local:
            out["rope_local_base_freq"] = float(local["rope_theta"])
        rope = rope["full_attention"]
        out.update(gemma3_pattern(cfg))
    if isinstance(rope, dict):
        if "rope_theta" not in cfg and "rope_theta" in rope:
            out["rope_theta"] = float(rope["rope_theta"])
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if cfg.get("rope_scaling") is None and rope_type != "default":
            out["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
            out["rope_scaling"].setdefault("type", rope_type)  # the key some modules read
        for key in ("original_max_position_embeddings", "partial_rotary_factor"):
            if key in rope and key not in cfg:  # top-level fields in mlx-lm's ModelArgs
                out[key] = rope[key]
    return out


def gemma3_pattern(cfg: dict[str, Any]) -> dict[str, Any]:
    """mlx-lm's gemma3 marks every ``sliding_window_pattern``-th layer global; the
    config lists the layer types. The pattern they follow, or one line if none."""
    types = cfg.get("layer_types") or []
    if "full_attention" not in types:
        return {}
    p = types.index("full_attention") + 1
    want = ["full_attention" if (i + 1) % p == 0 else "sliding_attention" for i in range(len(types))]
    if types != want:
        raise DraftwiseError(f"gemma3 layer_types follow no sliding_window_pattern mlx-lm can express: {types}")
    return {"sliding_window_pattern": p}


def context_window(cfg: dict[str, Any]) -> int:
    """Positions the model serves exactly: its maximum, capped at a sliding window
    (windowed attention equals full attention while the sequence fits the window) except
    for gemma, whose windowed layers are computed as such."""
    limit = int(cfg.get("max_position_embeddings") or 2048)
    window = cfg.get("sliding_window")
    sliding = cfg.get("model_type") == "mistral" or cfg.get("use_sliding_window")
    sliding = sliding or "sliding_attention" in (cfg.get("layer_types") or [])
    # gemma's windowed layers are computed as such (``llama.py``), not capped
    if window and sliding and cfg.get("model_type") not in WINDOWED_TYPES:
        limit = min(limit, int(window))
    long = longrope(cfg)
    if long is not None:  # transformers switches to the long factors past this
        limit = min(limit, long["original"])
    return limit


def _existing_bits(cfg: dict[str, Any]) -> int | None:
    q = cfg.get("quantization") or cfg.get("quantization_config")
    return int(q["bits"]) if isinstance(q, dict) and "bits" in q else None


def _quantizable(path: str, m: nn.Module) -> bool:
    # Layers whose input width is not a multiple of the group size stay in float.
    weight = getattr(m, "weight", None)
    return hasattr(m, "to_quantized") and weight is not None and weight.shape[-1] % GROUP_SIZE == 0


def load_module(model_dir: str | Path, dtype: str) -> tuple[nn.Module, dict[str, Any]]:
    """The mlx-lm module for ``model_dir`` in ``dtype`` (see ``DTYPES``) and its config."""
    if dtype not in DTYPES:
        raise DraftwiseError(
            f"unknown dtype {dtype!r} for the mlx backend (use {', '.join(DTYPES)})"
        )
    model_dir = Path(model_dir)
    cfg = read_config(model_dir)
    from mlx_lm.utils import load_model

    try:
        module, _ = load_model(model_dir, model_config=config_overrides(cfg))
    except (FileNotFoundError, ValueError) as exc:
        raise DraftwiseError(f"mlx-lm cannot load {model_dir}: {exc}") from None
    bits = _existing_bits(cfg)
    if bits is not None:
        # An MLX-quantized checkpoint: its packed weights cannot be re-cast.
        if QUANT_BITS.get(dtype) != bits:
            raise DraftwiseError(
                f"{model_dir} is already quantized to {bits} bits; use --dtype {bits}bit"
            )
        return module, text_config(cfg)
    if dtype in FLOAT_DTYPES:
        module.set_dtype(FLOAT_DTYPES[dtype])
    else:
        # Scales and activations stay float32 on the CPU (no fast float16 kernels
        # there); on a GPU they are float16 as mlx-lm's converter makes them.
        module.set_dtype(mx.float16 if has_gpu() else mx.float32)
        nn.quantize(
            module, group_size=GROUP_SIZE, bits=QUANT_BITS[dtype], class_predicate=_quantizable
        )
    mx.eval(module.parameters())
    return module, text_config(cfg)
