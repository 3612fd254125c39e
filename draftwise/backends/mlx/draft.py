"""``MLXDraftLM``: the draft-model tensor step (``core.draft_lm.DraftLM``) on MLX.

The MLX twin of ``backends/cuda/draft.py``: a draft ``Llama`` (the target's own first
``L`` layers sharing its module's weights, or another mlx-lm checkpoint) with its own KV
cache: the context, then one scratch slot per computed tree row. One lazy forward and
one ``mx.eval`` per ``expand``; ``keep`` gathers the kept slots into place lazily.

Example::

    target = MLXBackend.from_pretrained(model_dir, dtype="float32")
    lm = MLXDraftLM(early_exit(target.model, 4, target.context_limit + 512))
"""

from __future__ import annotations

import copy

import mlx.core as mx
import numpy as np

from draftwise.backends.mlx.backend import MLXBackend
from draftwise.backends.mlx.llama import Llama
from draftwise.core.draft_lm import ScratchSlots
from draftwise.errors import DraftwiseError


def early_exit(model: Llama, n_layers: int, max_cache_len: int) -> Llama:
    """The first ``n_layers`` blocks of ``model`` with its norm and head (the same mlx
    arrays: no copy), with an empty KV cache of its own."""
    if not 1 <= n_layers <= len(model.layers):
        raise DraftwiseError(
            f"draft layers must be in 1..{len(model.layers)} for this model, got {n_layers}"
        )
    out = copy.copy(model)  # shallow: module, embed, norm and head are shared
    out.layers = model.layers[:n_layers]
    out.max_cache_len = max_cache_len
    out.keys, out.values, out.alloc = [], [], 0
    return out


class MLXDraftLM(ScratchSlots, MLXBackend):
    """A draft ``Llama`` and its cache on MLX; reuses the backend's prefill."""

    def __init__(self, model: Llama, vocab_limit: int | None = None) -> None:
        # Not MLXBackend.__init__: the Llama exists already (it may share a module).
        from draftwise.core.cachebook import CacheBook

        self.model = model
        self.dtype = str(model.dtype)
        self.invariant = False
        self._pad_rows = 0
        self.name = f"draft-mlx-{len(model.layers)}layers"
        CacheBook.__init__(self, model.max_cache_len, model.vocab_size)
        self.vocab_size = min(model.vocab_size, vocab_limit or model.vocab_size)
        self._scratch = 0
        self._rows_x = self._hidden_x = None  # the backend's hidden-state record

    def expand(
        self, tokens: np.ndarray, depths: np.ndarray, mask: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        r, s0 = self.scratch_rows(tokens, mask)
        ids = np.asarray(tokens, np.int64)
        self._check_ids(ids)
        n, start = self._len, self._len + s0
        full = np.ones((r, start + r), bool)  # (R, n + S + R): the context, then scratch
        full[:, n:] = mask
        pos = mx.array((n + np.asarray(depths, np.int64)).astype(np.int32))  # (R,)
        logits = self.model.forward(
            mx.array(ids.astype(np.int32)), pos, start, mx.array(full), need_logits=True
        )
        assert logits is not None
        logp = logits[:, : self.vocab_size].astype(mx.float32)  # (R, V)
        logp = logp - mx.logsumexp(logp, axis=-1, keepdims=True)
        mx.eval(logp)
        host = np.array(logp)  # (R, V)
        top = np.argpartition(-host, k - 1, axis=1)[:, :k]  # (R, k), unordered
        vals = np.take_along_axis(host, top, 1)
        order = np.argsort(-vals, axis=1, kind="stable")
        self._scratch += r
        ids_out = np.take_along_axis(top, order, 1).astype(np.int64)  # (R, k) best first
        return ids_out, np.take_along_axis(vals, order, 1)

    def _move_slots(self, src: np.ndarray, dst: int) -> None:
        self.model.move_slots(mx.array(src.astype(np.int32)), dst)
        mx.async_eval(self.model.cache_arrays())


def enter_worker_stream(lm: MLXDraftLM) -> str:
    """Run in CARD's worker thread: give it a new CPU stream as its default stream, and
    drop ``lm``'s KV cache so that it is rebuilt here.

    MLX streams belong to the thread that makes them (mlx >= 0.31.2: a stream's command
    encoder and the default stream are thread-local), so the stream is made here, in the
    worker, and the draft's lazy graphs and evals stay on it, apart from the target's.
    The arrays the draft shares with the target (weights) are evaluated before the worker
    starts; its own cache arrays may have been made on another thread (a cost
    measurement, an earlier worker), so they are dropped, never used across threads.
    Returns the stream in words, e.g. ``'Stream(Device(cpu, 0), 2)'``.
    """
    stream = mx.new_stream(mx.cpu)
    mx.set_default_stream(stream)
    lm.reset()
    lm.model.keys, lm.model.values, lm.model.alloc = [], [], 0
    return str(stream)
