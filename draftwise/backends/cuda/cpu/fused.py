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

import numpy as np
import torch

from draftwise.backends.cuda.cpu.bounds import (
    KV_DTYPES,
    check_cache,
    check_slot_arrays,
    check_slots,
    check_write,
)
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
        # ``step``'s numpy views of the same memory: bfloat16 bits of the embedding rows
        # (V, C) uint16 (None for another dtype: ``step`` casts its rows as ``__call__``
        # does), and the rope tables (T_max, D) float32
        emb = model.embed
        self._embed_bits: np.ndarray | None = None
        if emb.dtype == torch.bfloat16 and emb.device.type == "cpu" and emb.is_contiguous():
            self._embed_bits = emb.view(torch.int16).numpy().view(np.uint16)
        self._cos_np, self._sin_np = self._cos.numpy(), self._sin.numpy()
        self._weights = (*self._w, *self._nw, self._final.data_ptr())  # dw_forward's fixed args
        self._cache_ok: Any = None  # the cache tensor last found well-formed (``_check_cache``)

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

    def _check_cache(self) -> torch.Tensor:
        """The model's cache, checked contiguous and of the config's shape (once per cache
        tensor: a per-step path)."""
        cache, cfg = self.model.cache, self.model.cfg
        if cache is self._cache_ok:
            return cache
        if not cache.is_contiguous():
            raise ValueError("the fused forward needs a contiguous cache")
        check_cache("cache", cache, 5)
        want = (cfg.n_layers, 2, cfg.n_kv_heads, cache.shape[3], cfg.head_dim)
        if tuple(cache.shape) != want:
            raise ValueError(f"cache of shape {tuple(cache.shape)}, the model needs {want}")
        self._cache_ok = cache
        return cache

    def step(
        self, tokens: np.ndarray, positions: np.ndarray, start: int, committed: int,
        extra: np.ndarray, n_extra: np.ndarray, n_write: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``__call__`` for a verify's few rows from numpy arrays: tokens and positions
        (T,) int64, the plan's slot table ``extra`` (T, E) int64 and counts ``n_extra``
        (T,) int32 (every row sees slots ``0 .. committed - 1`` too). The same arguments
        reach ``dw_forward``, so the same bits; the embedding rows and rope rows are
        gathered by numpy and no torch op runs but the outputs' one allocation. After the
        target's forward has streamed its weights through the caches each small torch op
        costs tens of microseconds: ``__call__``'s glue took 0.3-0.5 ms of a 1-row step
        (AMD EPYC Zen 3). Returns (last_x, xn), (T, C) bfloat16 each.

        Example::

            last_x, xn = fused.step(np.array([42]), np.array([7]), 7, 7,
                                    np.array([[7]]), np.array([1], np.int32), 1)
        """
        cfg = self.model.cfg
        t = int(tokens.shape[0]) if tokens.ndim == 1 else -1
        if t < 1 or positions.shape != (t,):
            raise ValueError(
                f"tokens {tokens.shape} and positions {positions.shape}: (T,) each, T >= 1"
            )
        cache = self._check_cache()
        tmax = cache.shape[3]
        check_write(start, n_write, tmax, rows=t)
        check_slot_arrays(extra, n_extra, t, tmax, committed)
        vocab, tpos = self.model.embed.shape[0], self._cos_np.shape[0]
        if t <= 64:  # a verify's rows: plain Python on a few ints beats numpy calls, cold
            tl, pl = tokens.tolist(), positions.tolist()
            if min(tl) < 0 or max(tl) >= vocab:
                raise ValueError(f"token ids {tl} outside the vocabulary 0..{vocab - 1}")
            if min(pl) < 0 or max(pl) >= tpos:
                raise ValueError(f"positions {pl} outside the rope table's 0..{tpos - 1}")
        else:
            if int(tokens.min()) < 0 or int(tokens.max()) >= vocab:
                raise ValueError(f"a token id outside the vocabulary 0..{vocab - 1}")
            if int(positions.min()) < 0 or int(positions.max()) >= tpos:
                raise ValueError(f"a position outside the rope table's 0..{tpos - 1}")
        if self._embed_bits is not None:
            x = self._embed_bits[tokens]  # (T, C) bfloat16 bits, a fresh contiguous array
        else:  # (T, C) the rows cast as ``__call__`` casts them
            rows = self.model.embed[torch.from_numpy(tokens)].to(torch.bfloat16).contiguous()
            x = rows.view(torch.int16).numpy()
        cos, sin = self._cos_np[positions], self._sin_np[positions]  # (T, D) float32 each
        out = torch.empty((2, t, cfg.dim), dtype=torch.bfloat16)  # last_x, xn
        failed = self.lib.dw_forward(
            cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
            cfg.ffn_dim, cfg.norm_eps,
            x.ctypes.data, t, cos.ctypes.data, sin.ctypes.data, *self._weights,
            cache.data_ptr(), int(cache.dtype == torch.bfloat16), cache.stride(0),
            tmax, start, n_write,
            committed, extra.ctypes.data, n_extra.ctypes.data, extra.shape[1],
            out.data_ptr(), out.data_ptr() + 2 * t * cfg.dim, kernel_threads(),
        )  # fmt: skip
        if failed:
            raise MemoryError("the fused forward could not allocate its buffers")
        return out[0], out[1]

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
        cache = self._check_cache()
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
