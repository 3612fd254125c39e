"""The ReDrafter network's forward in MLX, from the same checkpoint as torch
(``backends/cuda/redrafter/net.py`` defines it, ``draftwise/training`` trains it; see there
for the layers). Only inference; the drafting step that drives it is ``step.py``.

Example::

    net = MLXReDrafterNet.load(ckpt_dir, backend, tokenizer_id)
    step = MLXRecurrentStep(net, backend)   # redrafter/step.py
"""

from __future__ import annotations

import os

import mlx.core as mx
import numpy as np

from draftwise.backends.mlx.backend import MLXBackend
from draftwise.core.drafters.redrafter import FINGERPRINT_ROWS, embed_fingerprint
from draftwise.core.drafters.redrafter_ckpt import ReDrafterConfig, checked_weights
from draftwise.errors import DraftwiseError

COPY_EPS = 1e-9  # as torch's (backends/cuda/redrafter/net.py)


def embed_matrix(backend: MLXBackend) -> mx.array:
    """(V, C) float32 embeddings of an MLX target (refused when quantized)."""
    emb = backend.model.embed
    if hasattr(emb, "scales"):
        raise DraftwiseError("redrafter needs unquantized target embeddings (float dtypes)")
    return emb.weight.astype(mx.float32)


def mlx_fingerprint(embed: mx.array) -> str:
    rows = np.array(embed[:FINGERPRINT_ROWS].astype(mx.float32))
    return embed_fingerprint(rows, (int(embed.shape[0]), int(embed.shape[1])))


class MLXReDrafterNet:
    """Cell + head in MLX; the tensors are the torch checkpoint's, by name."""

    def __init__(self, cfg: ReDrafterConfig, tensors: dict[str, mx.array], embed: mx.array):
        self.cfg = cfg
        self.t = tensors
        self.embed = embed  # (V, C) float32
        self.vocab_ids = np.array(tensors["vocab_ids"]).astype(np.int64)  # (K,)
        self.rows = embed[mx.array(self.vocab_ids.astype(np.int32))]  # (K, C)

    @classmethod
    def load(
        cls, ckpt_dir: str | os.PathLike[str], backend: MLXBackend, tokenizer_id: str | None
    ) -> MLXReDrafterNet:
        embed = embed_matrix(backend)
        cfg, blob = checked_weights(ckpt_dir, tokenizer_id, mlx_fingerprint(embed))
        import tempfile

        with tempfile.NamedTemporaryFile(suffix=".safetensors") as f:  # mx.load reads paths
            f.write(blob)
            f.flush()
            tensors = mx.load(f.name)
        assert isinstance(tensors, dict)
        return cls(
            cfg,
            {k: v.astype(mx.float32) if k != "vocab_ids" else v for k, v in tensors.items()},
            embed,
        )

    def _lin(self, name: str, x: mx.array) -> mx.array:
        y = x @ self.t[name + ".weight"].T
        b = self.t.get(name + ".bias")
        return y + b if b is not None else y

    def cell(self, tokens: mx.array, state: mx.array) -> mx.array:
        """(B,) target ids, (B, C) states -> (B, C) next states."""
        z = self._lin("w", self.embed[tokens]) + self._lin("u", state)  # (B, C)
        return z * mx.sigmoid(z)

    def head(
        self, h: mx.array, state: mx.array, extra: tuple[mx.array, float] | None = None
    ) -> mx.array:
        """(B, C), (B, C) -> (B, K) draft logits; ``extra``: the (E, C) embedding rows
        and the one bias of extra ids (``core.drafters.context_vocab``) -> (B, K + E)."""
        x = mx.concatenate([h, state], axis=-1)  # (B, 2C)
        for i in range(self.cfg.resblocks):
            y = self._lin(f"res.{i}", x)
            x = x + y * mx.sigmoid(y)  # (B, 2C)
        z = self._lin("proj", x)  # (B, C)
        logits = z @ self.rows.T + self.t["bias"]  # (B, K)
        if extra is None:
            return logits
        return mx.concatenate([logits, z @ extra[0].T + extra[1]], axis=-1)  # (B, K + E)

    def context_entries(
        self, g_prev: mx.array, x: mx.array, x_next: mx.array, g: mx.array
    ) -> tuple[mx.array, mx.array]:
        """Keys and values (n, D) of context entries (as in torch:
        ``ReDrafterNet.context_entries``; their copy columns come from the step's
        ``ContextVocab`` each proposal)."""
        k = self._lin("wk", mx.concatenate([g_prev, self.embed[x]], axis=-1))  # (n, D)
        v = self._lin("wv", mx.concatenate([self.embed[x_next], g], axis=-1))  # (n, D)
        return k, v

    def context_logp(
        self,
        h: mx.array,
        s: mx.array,
        x: mx.array,
        keys: mx.array,
        values: mx.array,
        cols: mx.array,
        extra: tuple[mx.array, float] | None = None,
    ) -> mx.array:
        """(B, C) hidden and RNN states, (B,) tokens fed to the cell, (n, D) keys and
        values, (n,) columns -> (B, K) log-probs, every entry visible (as in torch:
        ``ReDrafterNet.context_logp``); (B, K + E) with ``extra`` (see ``head``)."""
        b, n = s.shape[0], keys.shape[0]
        nh = self.cfg.context_heads
        dh = self.cfg.context_dim // nh
        q = self._lin("wq", mx.concatenate([h, s, self.embed[x]], axis=-1))  # (B, D)
        q = q.reshape(b, nh, dh).transpose(1, 0, 2)  # (H, B, dh)
        k = keys.reshape(n, nh, dh).transpose(1, 0, 2)  # (H, n, dh)
        v = values.reshape(n, nh, dh).transpose(1, 0, 2)  # (H, n, dh)
        sc = (q @ k.transpose(0, 2, 1)) * dh**-0.5  # (H, B, n)
        null = mx.zeros((nh, b, 1), dtype=sc.dtype)  # attend nowhere
        w = mx.softmax(mx.concatenate([sc, null], axis=-1), axis=-1)[..., :n]  # (H, B, n)
        o = (w @ v).transpose(1, 0, 2).reshape(b, nh * dh)  # (B, D)
        logits = self.head(h, s + self._lin("wo", o), extra)  # (B, K)
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # (B, K)
        g = mx.sigmoid(self._lin("gate", mx.concatenate([h, s, o], axis=-1)))  # (B, 1)
        src = w[0] * (cols >= 0)[None, :]  # (B, n)
        rows = mx.broadcast_to(mx.arange(b)[:, None], (b, n))
        at = mx.broadcast_to(mx.maximum(cols, 0)[None, :], (b, n))
        copy = mx.zeros(logp.shape, dtype=mx.float32).at[rows, at].add(src)  # (B, K)
        p = (1 - g) * mx.exp(logp) + g * copy + COPY_EPS  # (B, K)
        return mx.log(p / p.sum(axis=-1, keepdims=True))  # (B, K)
