"""A llama-family forward on an mlx-lm module's weights, with our own KV cache.

mlx-lm's ``Model.__call__`` builds a causal mask and takes RoPE positions from
``cache.offset``, so it cannot verify a tree (rows at repeated positions, a tree mask).
``Llama.forward`` drives the module's submodules itself: embed -> per layer (norm, our
attention, the module's MLP) -> norm -> lm_head. Quantized layers work unchanged because
only their ``__call__`` is used.

Positions: ``mx.fast.rope`` accepts a vector of offsets, one per batch entry, so a tree
is rotated in ONE call by viewing its ``T`` rows as a batch of ``T`` length-1 sequences,
each at its own position (the layer's own RoPE module, so llama3/linear scaling apply).

Batch-invariant mode (``invariant.py``): with a ``Plan`` the forward replaces SDPA by
``block_attention`` over each row's logical key list and writes K/V for the first
``n_write`` rows only (the rest are padding rows).

Cache: per layer one K and one V array ``(1, H_kv, T_alloc, D)``, grown in chunks and
written by slot (slice update, done in place by MLX when nothing else holds the array).
Rejected rows are simply overwritten by the next step.

Example::

    llama = Llama(module, cfg, max_cache_len=1024)
    logits = llama.forward(mx.array([1, 2, 3]), positions=0, start=0, mask="causal",
                           need_logits=True)  # (3, V)
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from draftwise.backends.mlx.invariant import Plan, block_attention
from draftwise.core.windows import sliding_layers

GROW = 256  # cache slots added at a time (mlx-lm's KVCache.step)

Mask = mx.array | str | None


class Llama:
    """An mlx-lm llama/mistral/qwen2/qwen3/phi3/gemma2/gemma3_text module plus a KV cache;
    batch size 1. gemma's differences are read off the module and its config: embeddings
    times sqrt(hidden) (as transformers rounds it, not mlx-lm's bfloat16 rounding), norms
    after attention and the MLP, score and logit soft-capping."""

    def __init__(self, module: nn.Module, cfg: dict[str, Any], max_cache_len: int) -> None:
        # a multimodal checkpoint's module (gemma3) holds its text model
        module = getattr(module, "language_model", module)
        self.module = module
        inner = module.model  # LlamaModel / Qwen2Model: embed_tokens, layers, norm
        self.embed = inner.embed_tokens
        self.layers = list(inner.layers)
        self.norm = inner.norm
        tied = getattr(module, "tie_word_embeddings", getattr(module.args, "tie_word_embeddings", None))
        self.tied = bool(tied) if tied is not None else not hasattr(module, "lm_head")
        gemma = cfg.get("model_type") in ("gemma2", "gemma3_text")
        self.embed_scale = float(cfg["hidden_size"]) ** 0.5 if gemma else None
        self.sandwich = gemma  # post-attention and pre/post-MLP norms
        self.attn_softcap = cfg.get("attn_logit_softcapping") if gemma else None
        self.final_softcap = cfg.get("final_logit_softcapping") if gemma else None
        # gemma's sliding-window layers (mlx-lm's gemma2 attends to everything)
        self.window, windowed = sliding_layers(cfg)
        self.window_layers = frozenset(windowed)
        self._short_rope(cfg)
        attn = self.layers[0].self_attn
        self.n_heads, self.n_kv_heads = int(attn.n_heads), int(attn.n_kv_heads)
        self.head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
        self.vocab_size = int(cfg["vocab_size"])
        self.max_cache_len = max_cache_len
        self.dtype = inner.norm.weight.dtype  # activations and cache (scales' dtype if quantized)
        self.keys: list[mx.array] = []  # per layer (1, H_kv, T_alloc, D)
        self.values: list[mx.array] = []  # per layer (1, H_kv, T_alloc, D)
        self.alloc = 0

    def _short_rope(self, cfg: dict[str, Any]) -> None:
        """LongRoPE (phi3): transformers rotates with the short factors while the sequence
        fits the original context (the backend caps it there); mlx-lm's module always
        takes the long ones, so each layer gets the short-factor rotation instead."""
        from draftwise.backends.mlx.load import longrope

        long = longrope(cfg)
        if long is None:
            return
        from mlx_lm.models.rope_utils import SuScaledRoPE

        for layer in self.layers:
            old = layer.self_attn.rope
            layer.self_attn.rope = SuScaledRoPE(
                old.dim, base=float(self.module.args.rope_theta),
                max_position_embeddings=int(cfg.get("max_position_embeddings") or long["original"]),
                original_max_position_embeddings=long["original"],
                short_factor=long["short_factor"], long_factor=long["short_factor"],
                long_mscale=long["attention"],
            )

    def ensure(self, end: int) -> None:
        """Grow the cache arrays to hold at least ``end`` slots."""
        if end <= self.alloc:
            return
        new = min(self.max_cache_len, ((end + GROW - 1) // GROW) * GROW)
        shape = (1, self.n_kv_heads, new - self.alloc, self.head_dim)
        for store in (self.keys, self.values):
            if not store:
                store.extend(mx.zeros(shape, dtype=self.dtype) for _ in self.layers)
                continue
            for li, arr in enumerate(store):
                pad = mx.zeros(shape, dtype=self.dtype)  # (1, H_kv, grow, D)
                store[li] = mx.concatenate([arr, pad], axis=2)  # (1, H_kv, new, D)
        self.alloc = new

    def _rope(
        self, rope: nn.Module, x: mx.array, positions: int | mx.array, h: int,
        norm: nn.Module | None = None,
    ) -> mx.array:
        """x: (1, T, h D) projections -> (1, h, T, D) rotated at ``positions``; ``norm``
        (qwen3's q_norm / k_norm): an RMSNorm over each head's D values first."""
        t = x.shape[1]
        if norm is not None:
            x = norm(x.reshape(1, t, h, self.head_dim)).reshape(1, t, h * self.head_dim)
        if isinstance(positions, int):  # contiguous rows from ``positions``
            x = x.reshape(1, t, h, self.head_dim).transpose(0, 2, 1, 3)  # (1, h, T, D)
            return rope(x, offset=positions)
        # Per-row positions: T rows as a batch of T length-1 sequences.
        x = rope(x.reshape(t, h, 1, self.head_dim), offset=positions)  # (T, h, 1, D)
        return x.reshape(1, t, h, self.head_dim).transpose(0, 2, 1, 3)  # (1, h, T, D)

    def forward(
        self,
        tokens: mx.array,
        positions: int | mx.array,
        start: int,
        mask: Mask,
        need_logits: bool,
        plan: Plan | None = None,
        n_write: int | None = None,
    ) -> mx.array | None:
        """Run ``tokens`` (T,) at RoPE ``positions`` (an int: contiguous from there; or
        (T,) int32 per row), writing their K/V to slots ``start .. start+T``. ``mask``:
        (T, start+T) bool, True = may attend, ``"causal"`` or None (every row sees every
        slot up to ``start+T``). Returns lazy logits (T, V) when ``need_logits``.

        With a ``plan`` (batch-invariant mode, see ``invariant.py``) attention follows the
        plan and ``mask`` is ignored; only the first ``n_write`` rows (default all) write
        K/V, so padding rows never touch the cache."""
        t = tokens.shape[0]
        w = t if n_write is None else n_write
        end = start + t
        self.ensure(end)
        h, hkv = self.n_heads, self.n_kv_heads
        local = self._window_mask(mask, positions, start, t) if plan is None else None  # (T, S)
        x = self.embed(tokens[None])  # (1, T, C)
        if self.embed_scale is not None:  # gemma: sqrt(hidden) in the compute dtype
            x = x * mx.array(self.embed_scale, dtype=x.dtype)
        for li, layer in enumerate(self.layers):
            attn = layer.self_attn
            hn = layer.input_layernorm(x)  # (1, T, C)
            qn, kn = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)  # qwen3
            if hasattr(attn, "qkv_proj"):  # phi3: one projection, q then k then v
                qkv = attn.qkv_proj(hn)  # (1, T, (H + 2 H_kv) D)
                qp, kp, vp = mx.split(qkv, [h * self.head_dim, (h + hkv) * self.head_dim], axis=-1)
            else:
                qp, kp, vp = attn.q_proj(hn), attn.k_proj(hn), attn.v_proj(hn)
            q = self._rope(attn.rope, qp, positions, h, qn)  # (1, H, T, D)
            k = self._rope(attn.rope, kp, positions, hkv, kn)  # (1, H_kv, T, D)
            v = vp.reshape(1, t, hkv, self.head_dim).transpose(0, 2, 1, 3)  # (1, H_kv, T, D)
            self.keys[li][:, :, start : start + w, :] = k[:, :, :w]
            self.values[li][:, :, start : start + w, :] = v[:, :, :w]
            if plan is not None:
                o = block_attention(q, self.keys[li], self.values[li], plan, attn.scale, self.attn_softcap,
                                    li in self.window_layers)
                o = o.astype(x.dtype)  # (1, T, H D)
            else:
                keys = self.keys[li][:, :, :end, :]  # (1, H_kv, S, D)
                values = self.values[li][:, :, :end, :]  # (1, H_kv, S, D)
                m = local if local is not None and li in self.window_layers else mask
                o = self._attend(q, keys, values, attn.scale, m, end)  # (1, H, T, D)
                o = o.transpose(0, 2, 1, 3).reshape(1, t, h * self.head_dim)  # (1, T, H D)
            if self.sandwich:  # gemma: normed outputs, the MLP's own pre-norm
                x = x + layer.post_attention_layernorm(attn.o_proj(o))  # (1, T, C)
                x = x + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(x)))
            else:
                x = x + attn.o_proj(o)  # (1, T, C)
                x = x + layer.mlp(layer.post_attention_layernorm(x))  # (1, T, C)
        # Kept (lazy) for a drafter conditioned on the target's hidden state (ReDrafter).
        self.last_x = x[0]  # (T, C) residual stream before the final norm
        if not need_logits:
            return None
        x = self.norm(x)  # (1, T, C)
        logits = self.embed.as_linear(x) if self.tied else self.module.lm_head(x)  # (1, T, V)
        if self.final_softcap is not None:  # gemma2: tanh soft-capping of the logits
            logits = mx.tanh(logits / self.final_softcap) * self.final_softcap
        return logits[0]  # (T, V)

    def _window_mask(self, mask: Mask, positions: int | mx.array, start: int, t: int) -> mx.array | None:
        """(T, start+T) bool for the sliding-window layers: ``mask`` and only keys within
        the row's last ``window`` positions (slot j < start holds position j, the new rows'
        slots their own). None without such layers or when no key is that far back."""
        if self.window is None or start + t <= self.window:
            return None
        rows = mx.arange(positions, positions + t) if isinstance(positions, int) else positions
        keys = mx.concatenate([mx.arange(start), rows.astype(mx.int32)])  # (S,)
        near = keys[None, :] > rows[:, None] - self.window  # (T, S)
        if isinstance(mask, str):  # "causal": row i sees slots up to start + i
            mask = mx.arange(start + t)[None, :] <= mx.arange(start, start + t)[:, None]
        return near if mask is None else mask & near

    def _attend(
        self, q: mx.array, keys: mx.array, values: mx.array, scale: float, mask: Mask, end: int
    ) -> mx.array:
        """(1, H, T, D) attention over (1, H_kv, S, D): MLX's fused kernel (GQA native,
        the mask broadcast), or with gemma2's score soft-capping written out (float32
        softmax, as transformers)."""
        if self.attn_softcap is None:
            return mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask=mask)
        _, h, t, d = q.shape
        hkv = keys.shape[1]
        cap = self.attn_softcap
        qg = (q * scale).reshape(1, hkv, h // hkv, t, d)  # (1, H_kv, rep, T, D)
        s = qg @ mx.expand_dims(keys, 2).swapaxes(-1, -2)  # (1, H_kv, rep, T, S)
        s = mx.tanh(s / cap) * cap
        if isinstance(mask, str):  # "causal": row i sees slots up to end - T + i
            rows = mx.arange(end - t, end)[:, None]
            mask = mx.arange(end)[None, :] <= rows  # (T, S)
        if mask is not None:
            s = mx.where(mask, s, -mx.inf)
        p = mx.softmax(s.astype(mx.float32), axis=-1).astype(q.dtype)
        return (p @ mx.expand_dims(values, 2)).reshape(1, h, t, d)  # (1, H, T, D)

    def move_slots(self, src: mx.array, dst_start: int) -> None:
        """Copy slots ``src`` (K,) to ``dst_start .. dst_start+K`` in every layer (lazy;
        the gather reads the old array, so overlapping ranges are safe)."""
        k = src.shape[0]
        for store in (self.keys, self.values):
            for li, arr in enumerate(store):
                arr[:, :, dst_start : dst_start + k, :] = arr[:, :, src, :]  # (1, H_kv, K, D)
                store[li] = arr

    def cache_arrays(self) -> list[mx.array]:
        return self.keys + self.values
