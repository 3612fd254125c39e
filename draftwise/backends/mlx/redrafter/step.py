"""The ReDrafter drafting step on the MLX backend: ``MLXRecurrentStep`` is the
``core.drafters.redrafter.RecurrentNet`` step, reading the target's hidden state from the
backend with no forward; one ``mx.eval`` per beam-search step (the (B, K) log-probs the
core needs). The network is ``net.py``.

Example::

    net = MLXReDrafterNet.load(ckpt_dir, backend, tokenizer_id)
    step = MLXRecurrentStep(net, backend)
    step.start(cache_len, context)
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from draftwise.backends.mlx.backend import MLXBackend
from draftwise.backends.mlx.redrafter.net import MLXReDrafterNet
from draftwise.core.drafters.context_book import ContextBook
from draftwise.core.drafters.context_vocab import extra_bias


class MLXRecurrentStep:
    """``RecurrentNet`` on the MLX backend (see the module docstring); ``extend``: the
    context's ids outside the draft vocabulary join it (as torch's step)."""

    def __init__(self, net: MLXReDrafterNet, backend: MLXBackend, extend: bool = False) -> None:
        self.net, self.backend = net, backend
        self.extend = extend
        # the vocabulary, the entries and their columns, kept across proposals
        self._ctx = ContextBook(
            np.asarray(net.vocab_ids), net.cfg.vocab_size, extend, bool(net.cfg.context_dim)
        )
        self._vocab = self._ctx.vocab
        self.vocab_ids = net.vocab_ids  # (K + E,) after ``start`` with ``extend``
        self._xbias = extra_bias(np.array(net.t["bias"]))
        self._extra: tuple[mx.array, float] | None = None  # (E, C) rows, their bias
        self._h: mx.array | None = None  # (1, C)
        self._s: mx.array | None = None  # (B, C)
        # a context network's entries: keys, values (m, D), as ``_book``; ``_cols`` (m,)
        # their next tokens' draft columns
        self._book = self._ctx.entries
        self._kvc: tuple[mx.array, mx.array] | None = None
        self._cols = mx.zeros((0,), dtype=mx.int32)
        if net.cfg.context_dim:
            backend.keep_hidden_rows()

    def start(self, cache_len: int, context: np.ndarray) -> bool:
        if self.backend.hidden_len != cache_len or cache_len < 1:
            return False
        ctx = np.asarray(context, np.int64)
        self._h = self.backend.last_hidden().astype(mx.float32)[None]  # (1, C), lazy
        got = self._ctx.update(ctx, self.backend.hidden_rows)
        if self.extend:
            self.vocab_ids = self._ctx.vocab_ids  # (K + E,)
            extra = self._vocab.extra
            rows = self.net.embed[mx.array(extra.astype(np.int32))] if extra.size else None
            self._extra = None if rows is None else (rows, self._xbias)  # (E, C)
        if self.net.cfg.context_dim:
            self._add_entries(ctx, got)
            self._cols = mx.array(self._ctx.cols.astype(np.int32))  # (m,)
        self._s = None
        return True

    def _add_entries(
        self, context: np.ndarray, got: tuple[int, int, int, int, object | None]
    ) -> None:
        """Entries of the new positions (``got``: ``ContextBook.update``'s); lazy."""
        keep, first, a, b, g = got
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
