"""The 4bit mode's decoder forward as one compiled call (``csrc/forward.c``).

On this project's CPU a one-row step of SmolLM2-135M spent more time dispatching some
2,400 small torch ops (norms, RoPE, casts, adds: ~80 per layer) than in its 4-bit matmuls.
``FusedForward`` runs all 30 layers of a batch-invariant verify in one ``ctypes`` call
around the compiled int4 matmul and attention; it is used when every block linear is a
native 4-bit weight (``int4.Int4Weight`` with the compiled kernel), there are no biases,
the cache is float32, and the plan attends natively. Otherwise the torch forward runs.

Row-invariant like its parts (each row computed by fixed per-row loops, row-invariant
matmuls and attention). ``fused_eager.py`` replays it one torch op at a time, bit for bit
(``tests/backends/cuda/test_fused.py``).

Example::

    fused = FusedForward.build(model)          # None: not a native 4bit model
    last_x, xn = fused(tokens, positions, start, plan, n_write)   # (T, C) bf16 each
"""

from __future__ import annotations

import ctypes
from typing import Any, Protocol

import torch

from draftwise.backends.cuda.cpu.int4 import Int4Weight
from draftwise.backends.cuda.cpu.native import INT4_TILE_BYTES


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
            or model.cache.dtype != torch.float32
            or cfg.head_dim % 2
            or cfg.dim % 16  # the norms' 16-lane sums (forward.c)
            or cfg.ffn_dim % 16
            or any(ly.bqkv is not None for ly in model.layers)
            or not all(
                _native_int4(getattr(ly, name))
                for ly in model.layers
                for name in ("wqkv", "wo", "w13", "w2")
            )
        ):
            return None
        return cls(model, lib)

    def __call__(
        self, tokens: torch.Tensor, positions: torch.Tensor, start: int, plan: NativePlan, n_write: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``tokens`` (T,) at ``positions`` (T,): K/V of the first ``n_write`` rows
        to slots ``start ..``, attention as ``plan`` says. Returns (last_x, xn), (T, C)
        bfloat16: the residual after the last layer and its final norm."""
        m, cfg = self.model, self.model.cfg
        t = tokens.shape[0]
        x = m.embed[tokens].to(torch.bfloat16).contiguous()  # (T, C)
        cos = self._cos[positions].contiguous()  # (T, D)
        sin = self._sin[positions].contiguous()  # (T, D)
        last_x = torch.empty((t, cfg.dim), dtype=torch.bfloat16)  # (T, C)
        xn = torch.empty((t, cfg.dim), dtype=torch.bfloat16)  # (T, C)
        cache = m.cache
        if not cache.is_contiguous():
            raise ValueError("the fused forward needs a contiguous cache")
        extra, n_extra = plan.extra, plan.n_extra
        failed = self.lib.dw_forward(
            cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
            cfg.ffn_dim, cfg.norm_eps,
            x.data_ptr(), t, cos.data_ptr(), sin.data_ptr(),
            *self._w, *self._nw, self._final.data_ptr(),
            cache.data_ptr(), cache.stride(0), cache.shape[3], start, n_write,
            plan.committed, extra.data_ptr(), n_extra.data_ptr(), extra.shape[1],
            last_x.data_ptr(), xn.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        if failed:
            raise MemoryError("the fused forward could not allocate its buffers")
        return last_x, xn
