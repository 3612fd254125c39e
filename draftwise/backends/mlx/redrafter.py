"""The ReDrafter network's forward in MLX, from the same checkpoint as torch
(``backends/cuda/redrafter.py`` defines it and trains it; see there for the layers).

Only inference: ``MLXRecurrentStep`` is the ``core.drafters.redrafter.RecurrentNet``
step on the MLX backend, reading the target's hidden state from it with no forward;
one ``mx.eval`` per beam-search step (the (B, K) log-probs the core needs).

Example::

    net = MLXReDrafterNet.load(ckpt_dir, backend, tokenizer_id)
    step = MLXRecurrentStep(net, backend)
"""

from __future__ import annotations

import os

import mlx.core as mx
import numpy as np

from draftwise.backends.mlx.backend import MLXBackend
from draftwise.core.drafters.redrafter import FINGERPRINT_ROWS, embed_fingerprint
from draftwise.core.drafters.redrafter_ckpt import ReDrafterConfig, checked_weights
from draftwise.errors import DraftwiseError


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

    def head(self, h: mx.array, state: mx.array) -> mx.array:
        """(B, C), (B, C) -> (B, K) draft logits."""
        x = mx.concatenate([h, state], axis=-1)  # (B, 2C)
        for i in range(self.cfg.resblocks):
            y = self._lin(f"res.{i}", x)
            x = x + y * mx.sigmoid(y)  # (B, 2C)
        z = self._lin("proj", x)  # (B, C)
        return z @ self.rows.T + self.t["bias"]  # (B, K)


class MLXRecurrentStep:
    """``RecurrentNet`` on the MLX backend (see the module docstring)."""

    def __init__(self, net: MLXReDrafterNet, backend: MLXBackend) -> None:
        self.net, self.backend = net, backend
        self.vocab_ids = net.vocab_ids
        self._h: mx.array | None = None  # (1, C)
        self._s: mx.array | None = None  # (B, C)

    def start(self, cache_len: int) -> bool:
        if self.backend.hidden_len != cache_len or cache_len < 1:
            return False
        self._h = self.backend.last_hidden().astype(mx.float32)[None]  # (1, C), lazy
        self._s = None
        return True

    def step(self, tokens: np.ndarray, parents: np.ndarray) -> np.ndarray:
        assert self._h is not None
        ids = mx.array(np.asarray(tokens, np.int32))  # (B,)
        b = int(ids.shape[0])
        if self._s is None or parents[0] < 0:
            prev = mx.zeros((b, self.net.cfg.hidden), dtype=mx.float32)  # (B, C)
        else:
            prev = self._s[mx.array(np.asarray(parents, np.int32))]  # (B, C)
        self._s = self.net.cell(ids, prev)  # (B, C)
        logits = self.net.head(mx.broadcast_to(self._h, (b, self._h.shape[1])), self._s)
        logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # (B, K)
        mx.eval(logp, self._s)
        return np.array(logp)
