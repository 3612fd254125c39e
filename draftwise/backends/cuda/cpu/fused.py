"""The 4bit mode's decoder forward as one compiled call (``csrc/forward.c``).

On this project's CPU a one-row step of SmolLM2-135M spent more time dispatching some
2,400 small torch ops (norms, RoPE, casts, adds: ~80 per layer) than in its 4-bit matmuls.
``FusedForward`` runs all 30 layers of a batch-invariant verify in one ``ctypes`` call
around the compiled int4 matmul and attention; it is used when every block linear is a
native 4-bit weight (``int4.Int4Weight`` with the compiled kernel), there are no biases,
the cache is float32 or bfloat16 (the 4bit mode's: half the bytes a step reads), and the
plan attends natively. Otherwise the torch forward runs.

Row-invariant like its parts (each row computed by fixed per-row loops, row-invariant
matmuls and attention). The prompt goes through it too (``TorchBackend.prefill`` with a
causal plan), so a prompt token's K/V has the bits a plain step would have written.
``fused_eager.py`` replays it one torch op at a time, bit for bit
(``tests/backends/cuda/test_fused.py``).

Example::

    fused = FusedForward.build(model)          # None: not a native 4bit model
    last_x, xn = fused(tokens, positions, start, plan, n_write)   # (T, C) bf16 each
"""

from __future__ import annotations

import ctypes
from typing import Any, Protocol

import torch

from draftwise.backends.cuda.cpu.bounds import KV_DTYPES, check_cache, check_slots, check_write
from draftwise.backends.cuda.cpu.int4 import Int4Weight
from draftwise.backends.cuda.cpu.native import INT4_TILE_BYTES, kernel_threads


class NativePlan(Protocol):
    """What the kernel reads of an attention plan (``invariant.Plan`` is one): every row
    sees slots ``0 .. committed - 1`` and its own ``n_extra[i]`` slots ``extra[i]``."""

    committed: int
    extra: torch.Tensor  # (T, E) int64
    n_extra: torch.Tensor  # (T,) int32


class FusedModel(Protocol):
    """What the fused forward reads of a model (``llama.Llama`` is one). Declared here so
    this room never imports the model that uses it (no import circle)."""

    cfg: Any  # n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, norm_eps
    layers: list[Any]  # each: wqkv, wo, w13, w2 (weights), attn_norm, mlp_norm, bqkv
    embed: torch.Tensor  # (V, C)
    norm: torch.Tensor  # (C,)
    cos: torch.Tensor  # (T_max, D)
    sin: torch.Tensor  # (T_max, D)
    cache: torch.Tensor  # (L, 2, H_kv, T_max, D)


def _native_int4(w: object) -> bool:
    return (
        isinstance(w, Int4Weight)
        and w.lib is not None
        and w.repeat == 1
        and w.packed.shape[-1] == INT4_TILE_BYTES
        and w.packed.shape[0] * 16 == w.out_features
    )


def check_shapes(model: FusedModel) -> None:
    """Every packed weight, norm and table has the size the config names (raises
    ``ValueError`` naming the first that does not): ``dw_forward`` reads them by the
    config's sizes, so a wrong ``config.json`` would read past a weight's end."""
    cfg = model.cfg
    h, hkv, d, c, f = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.dim, cfg.ffn_dim
    want = {"wqkv": ((h + 2 * hkv) * d, c), "wo": (c, h * d), "w13": (2 * f, c), "w2": (c, f)}
    for i, ly in enumerate(model.layers):
        for name, (n, k) in want.items():
            w = getattr(ly, name)
            got = (w.out_features, w.in_features)
            if got != (n, k) or w.packed.shape[:2] != (n // 16, k // 32):
                raise ValueError(
                    f"layer {i} {name}: weight of shape {got} (packed {tuple(w.packed.shape)}), "
                    f"the config needs {(n, k)}"
                )
        for name in ("attn_norm", "mlp_norm"):
            shape = tuple(getattr(ly, name).shape)
            if shape != (c,):
                raise ValueError(f"layer {i} {name} of shape {shape}, the config needs ({c},)")
    if len(model.layers) != cfg.n_layers:
        raise ValueError(f"{len(model.layers)} layers, the config needs {cfg.n_layers}")
    if tuple(model.norm.shape) != (c,) or model.embed.dim() != 2 or model.embed.shape[1] != c:
        raise ValueError(
            f"final norm {tuple(model.norm.shape)} / embedding {tuple(model.embed.shape)} "
            f"for hidden size {c}"
        )
    if model.cos.dim() != 2 or model.cos.shape[1] != d or model.sin.shape != model.cos.shape:
        raise ValueError(f"rope tables of shape {tuple(model.cos.shape)} for head size {d}")


class FusedForward:
    """Pointers to one model's packed weights and norms, for ``dw_forward``."""

    def __init__(self, model: FusedModel, lib: ctypes.CDLL) -> None:
        self.model, self.lib = model, lib
        layers = model.layers
        n = len(layers)
        # keep bf16 norm weights contiguous and alive: the C side reads them by address
        self._norms = [
            [ly.attn_norm.to(torch.bfloat16).contiguous() for ly in layers],
            [ly.mlp_norm.to(torch.bfloat16).contiguous() for ly in layers],
        ]
        self._final = model.norm.to(torch.bfloat16).contiguous()

        def ptrs(ts: list[torch.Tensor]) -> ctypes.Array:
            return (ctypes.c_void_p * n)(*[t.data_ptr() for t in ts])

        self._w = [ptrs([getattr(ly, name).packed for ly in layers]) for name in ("wqkv", "wo", "w13", "w2")]
        self._nw = [ptrs(ts) for ts in self._norms]
        self._cos = model.cos.float().contiguous()  # (T_max, D)
        self._sin = model.sin.float().contiguous()

    @classmethod
    def build(cls, model: FusedModel) -> FusedForward | None:
        """The fused forward for ``model``, or None where it does not apply."""
        first = model.layers[0].wqkv if model.layers else None
        lib = first.lib if isinstance(first, Int4Weight) else None
        cfg = model.cfg
        if (
            lib is None
            or not hasattr(lib, "dw_forward")
            or model.cache.dtype not in KV_DTYPES
            or cfg.head_dim > 512  # forward.c's rotated-key buffer
            or cfg.head_dim % 2
            or cfg.dim % 16  # the norms' 16-lane sums (forward.c)
            or cfg.ffn_dim % 16
            or any(ly.bqkv is not None for ly in model.layers)
            or any(getattr(ly, "q_norm", None) is not None for ly in model.layers)  # qwen3
            or not getattr(cfg, "plain_attention", True)  # gemma: scale, soft-capping
            or getattr(cfg, "sandwich_norms", False)  # gemma: norms after attention and MLP
            or getattr(cfg, "act", "silu") != "silu"
            or getattr(cfg, "embed_scale", None) is not None
            or getattr(cfg, "final_softcap", None) is not None
            or getattr(cfg, "rot_dim", cfg.head_dim) != cfg.head_dim  # partial RoPE
            or not all(
                _native_int4(getattr(ly, name))
                for ly in model.layers
                for name in ("wqkv", "wo", "w13", "w2")
            )
        ):
            return None
        check_shapes(model)
        return cls(model, lib)

    def __call__(
        self, tokens: torch.Tensor, positions: torch.Tensor, start: int, plan: NativePlan, n_write: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``tokens`` (T,) at ``positions`` (T,): K/V of the first ``n_write`` rows
        to slots ``start ..``, attention as ``plan`` says. Returns (last_x, xn), (T, C)
        bfloat16: the residual after the last layer and its final norm."""
        m, cfg = self.model, self.model.cfg
        t = tokens.shape[0]
        if tokens.dim() != 1 or positions.shape != tokens.shape:
            raise ValueError(
                f"tokens {tuple(tokens.shape)} and positions {tuple(positions.shape)}"
            )
        cache = m.cache
        if not cache.is_contiguous():
            raise ValueError("the fused forward needs a contiguous cache")
        check_cache("cache", cache, 5)
        want = (cfg.n_layers, 2, cfg.n_kv_heads, cache.shape[3], cfg.head_dim)
        if tuple(cache.shape) != want:
            raise ValueError(f"cache of shape {tuple(cache.shape)}, the model needs {want}")
        tmax = cache.shape[3]
        check_write(start, n_write, tmax, rows=t)
        extra, n_extra = plan.extra, plan.n_extra
        check_slots(extra, n_extra, t, tmax, plan.committed)
        # (indexing raises IndexError on a token or position out of its table's range)
        x = m.embed[tokens].to(torch.bfloat16).contiguous()  # (T, C)
        cos = self._cos[positions].contiguous()  # (T, D)
        sin = self._sin[positions].contiguous()  # (T, D)
        last_x = torch.empty((t, cfg.dim), dtype=torch.bfloat16)  # (T, C)
        xn = torch.empty((t, cfg.dim), dtype=torch.bfloat16)  # (T, C)
        failed = self.lib.dw_forward(
            cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
            cfg.ffn_dim, cfg.norm_eps,
            x.data_ptr(), t, cos.data_ptr(), sin.data_ptr(),
            *self._w, *self._nw, self._final.data_ptr(),
            cache.data_ptr(), int(cache.dtype == torch.bfloat16), cache.stride(0),
            cache.shape[3], start, n_write,
            plan.committed, extra.data_ptr(), n_extra.data_ptr(), extra.shape[1],
            last_x.data_ptr(), xn.data_ptr(), kernel_threads(),
        )  # fmt: skip
        if failed:
            raise MemoryError("the fused forward could not allocate its buffers")
        return last_x, xn
