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
from draftwise.core.drafters.context_entries import ContextEntries
from draftwise.core.drafters.context_vocab import ContextVocab, extra_bias
from draftwise.core.drafters.redrafter import FINGERPRINT_ROWS, embed_fingerprint
from draftwise.core.drafters.redrafter_ckpt import ReDrafterConfig, checked_weights
from draftwise.errors import DraftwiseError

COPY_EPS = 1e-9  # as torch's (backends/cuda/redrafter.py)


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


class MLXRecurrentStep:
    """``RecurrentNet`` on the MLX backend (see the module docstring); ``extend``: the
    context's ids outside the draft vocabulary join it (as torch's step)."""

    def __init__(self, net: MLXReDrafterNet, backend: MLXBackend, extend: bool = False) -> None:
        self.net, self.backend = net, backend
        self.extend = extend
        self._vocab = ContextVocab(net.vocab_ids, net.cfg.vocab_size)
        self.vocab_ids = net.vocab_ids  # (K + E,) after ``start`` with ``extend``
        self._xbias = extra_bias(np.array(net.t["bias"]))
        self._extra: tuple[mx.array, float] | None = None  # (E, C) rows, their bias
        self._h: mx.array | None = None  # (1, C)
        self._s: mx.array | None = None  # (B, C)
        # a context network's entries: keys, values (m, D), as ``_book``; ``_cols`` (m,)
        # their next tokens' draft columns
        self._book = ContextEntries()
        self._kvc: tuple[mx.array, mx.array] | None = None
        self._cols = mx.zeros((0,), dtype=mx.int32)
        if net.cfg.context_dim:
            backend.keep_hidden_rows()

    def start(self, cache_len: int, context: np.ndarray) -> bool:
        if self.backend.hidden_len != cache_len or cache_len < 1:
            return False
        ctx = np.asarray(context, np.int64)
        self._h = self.backend.last_hidden().astype(mx.float32)[None]  # (1, C), lazy
        if self.extend:
            self.vocab_ids = self._vocab.update(ctx)  # (K + E,)
            extra = self._vocab.extra
            rows = self.net.embed[mx.array(extra.astype(np.int32))] if extra.size else None
            self._extra = None if rows is None else (rows, self._xbias)  # (E, C)
        if self.net.cfg.context_dim:
            self._add_entries(ctx)
            cols = self._vocab.columns(ctx[self._book.pos + 1])  # (m,)
            self._cols = mx.array(cols.astype(np.int32))
        self._s = None
        return True

    def _add_entries(self, context: np.ndarray) -> None:
        """Entries of the new positions (``core.drafters.context_entries``); lazy."""
        keep, first, a, b, g = self._book.update(context, self.backend.hidden_rows)
        if self._kvc is not None:
            self._kvc = (self._kvc[0][:keep], self._kvc[1][:keep])
        if b <= a or g is None:
            return
        g = g.astype(mx.float32)  # type: ignore[attr-defined]  # (n, C): positions first..
        x = mx.array(context[a : b + 1].astype(np.int32))  # (b - a + 1,)
        new = self.net.context_entries(
            g[a - 1 - first : b - 1 - first], x[:-1], x[1:], g[a - first : b - first]
        )
        if self._kvc is None:
            self._kvc = new
        else:
            self._kvc = tuple(  # type: ignore[assignment]
                mx.concatenate([old, add]) for old, add in zip(self._kvc, new, strict=True)
            )

    def step(self, tokens: np.ndarray, parents: np.ndarray) -> np.ndarray:
        assert self._h is not None
        ids = mx.array(np.asarray(tokens, np.int32))  # (B,)
        b = int(ids.shape[0])
        if self._s is None or parents[0] < 0:
            prev = mx.zeros((b, self.net.cfg.hidden), dtype=mx.float32)  # (B, C)
        else:
            prev = self._s[mx.array(np.asarray(parents, np.int32))]  # (B, C)
        self._s = self.net.cell(ids, prev)  # (B, C)
        h = mx.broadcast_to(self._h, (b, self._h.shape[1]))  # (B, C)
        if self.net.cfg.context_dim:
            if self._kvc is None:
                d = self.net.cfg.context_dim
                empty = mx.zeros((0, d), dtype=mx.float32)
                self._kvc = (empty, empty)
            logp = self.net.context_logp(
                h, self._s, ids, *self._kvc, self._cols, self._extra
            )  # (B, K + E)
        else:
            logits = self.net.head(h, self._s, self._extra)
            logp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # (B, K)
        mx.eval(logp, self._s)
        return np.array(logp)
