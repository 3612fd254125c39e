"""``MLXBackend``: the ``draftwise.core.backend.Backend`` protocol on MLX (mlx-lm weights).

Runs ``llama.Llama.forward`` on MLX's default device (Metal on Apple silicon, else the
CPU). Every ``verify`` is ONE lazy forward over ``[root, tree nodes]`` and ONE
``mx.eval`` (argmax, plus the float32 logits when asked for); ``commit`` gathers the
kept rows' K/V into place lazily and starts it with ``mx.async_eval`` so the copy
overlaps the drafter's host work.

``invariant=True`` (see ``invariant.py``) makes a row's logits independent of the other
rows of its verify, so speculative output is bit-identical to plain decoding; the name
then ends in ``-invariant``.

Example::

    be = MLXBackend.from_pretrained("path/to/hf_dir", dtype="float32")
    be.prefill(np.array(prompt[:-1]))
    out = be.verify(prompt[-1], DraftTree.empty(), need_logits=False)
    be.commit(np.array([0]))
    next_token = int(out.argmax[0])
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from draftwise.backends.mlx.invariant import make_plan, resolve_invariant, rows_per_forward
from draftwise.backends.mlx.llama import Llama
from draftwise.backends.mlx.load import context_window, default_dtype, has_gpu, load_module
from draftwise.core.backend import Verified
from draftwise.core.cachebook import CacheBook
from draftwise.core.device import DeviceInfo, cpu_name, cpu_threads
from draftwise.core.tree import DraftTree
from draftwise.errors import DraftwiseError

PREFILL_CHUNK = 256  # rows per prefill forward: bounds activations and the eval graph
DEFAULT_MAX_CACHE = 8192  # positions served when max_cache_len is not given


class MLXBackend(CacheBook):
    """A llama-family mlx-lm model and its KV cache (batch size 1)."""

    def __init__(
        self,
        module: nn.Module,
        cfg: dict[str, Any],
        dtype: str,
        max_cache_len: int,
        invariant: bool = False,
    ) -> None:
        self.model = Llama(module, cfg, max_cache_len)
        self.dtype = dtype
        # Batch-invariant verify (see invariant.py): plain decoding and tree verification
        # become two schedules of one bit-exact computation.
        self.invariant = invariant
        self._pad_rows = rows_per_forward(has_gpu())
        # The mode is part of the name: tune profiles and bench reports keep them apart.
        self.name = f"mlx-{'gpu' if has_gpu() else 'cpu'}-{dtype}" + (
            "-invariant" if invariant else ""
        )
        CacheBook.__init__(self, max_cache_len, self.model.vocab_size)
        # Last-layer hidden states for a drafter (ReDrafter): the residual rows of the
        # last verify, and the row of the last cached token with the cache length it is
        # valid at (-1: none). Lazy arrays: reading them starts no evaluation.
        self._rows_x: mx.array | None = None  # (N+1, C)
        self._hidden_x: mx.array | None = None  # (C,)
        self._hidden_len = -1

    # ----- the target's hidden state, for drafters conditioned on it ---------------------
    def last_hidden(self) -> mx.array:
        """(C,) last-layer hidden state (after the final norm) of the last cached token,
        the one that predicts the root: lazy, no forward, no evaluation."""
        self._check_hidden()
        return self.model.norm(self._hidden_x)  # (C,)

    def _join_rows(self, pieces: list[object]) -> mx.array:
        """Kept residual rows (``CacheBook.hidden_rows``) -> (n, C) after the final norm,
        lazily."""
        x = mx.concatenate(pieces) if len(pieces) > 1 else pieces[0]  # type: ignore[arg-type]
        return self.model.norm(x)  # type: ignore[arg-type]

    def device_info(self) -> DeviceInfo:
        """The device, dtype, mode and thread count this backend computes with."""
        gpu = has_gpu()
        name = f"mlx {mx.default_device()} {platform.machine()}"
        if not gpu:
            name = f"{cpu_name()} (mlx)"
        return DeviceInfo(
            kind="mlx-gpu" if gpu else "mlx-cpu",
            name=name,
            dtype=self.dtype,
            mode="invariant" if self.invariant else "normal",
            threads=1 if gpu else cpu_threads(),
        )

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | Path,
        dtype: str | None = None,
        max_cache_len: int | None = None,
        invariant: bool | str = "auto",
    ) -> MLXBackend:
        """Load an HF- or MLX-format llama/mistral/qwen2 dir; ``dtype`` is float32,
        float16, bfloat16, 4bit or 8bit (None: 4bit with a GPU, float32 on the CPU).
        ``invariant``: batch-invariant verification (True/False; "auto" = where measured
        cheap, see ``invariant.INVARIANT_AUTO``)."""
        if max_cache_len is not None and max_cache_len < 1:
            raise DraftwiseError(f"max_cache_len must be positive, got {max_cache_len}")
        dtype = dtype or default_dtype()
        inv = resolve_invariant(invariant, has_gpu(), dtype)
        module, cfg = load_module(model_dir, dtype)
        cap = max_cache_len if max_cache_len is not None else DEFAULT_MAX_CACHE
        return cls(module, cfg, dtype, min(context_window(cfg), cap), inv)

    # ----- forward passes --------------------------------------------------------------
    def prefill(self, tokens: np.ndarray) -> None:
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        self._check_room("prefill", ids.size)
        self._check_ids(ids)
        self._pending = 0
        for s in range(0, ids.size, PREFILL_CHUNK):
            chunk = mx.array(ids[s : s + PREFILL_CHUNK].astype(np.int32))  # (t,)
            t = chunk.shape[0]
            mask = "causal" if t > 1 else None  # bottom-right aligned: sees the cache
            self.model.forward(chunk, self._len, self._len, mask, need_logits=False)
            last = self.model.last_x[-1]  # (C,): the hidden state a drafter may read
            mx.eval(self.model.cache_arrays(), last)  # nothing else depends on the K/V
            if self._rows is not None:
                self._record_rows(self._len, self.model.last_x)
            self._len += t
            self._hidden_x, self._hidden_len = last, self._len

    def verify(self, root: int, tree: DraftTree, need_logits: bool) -> Verified:
        n1 = len(tree) + 1
        self._check_room("verify", n1)
        start = self._len
        host = np.empty(n1, dtype=np.int64)  # (N+1,)
        host[0] = root
        host[1:] = tree.tokens
        self._check_ids(host)
        if self.invariant:
            return self._verify_invariant(host, tree, need_logits)
        tokens = mx.array(host.astype(np.int32))  # (N+1,)
        positions: int | mx.array = start
        mask: mx.array | None = None
        if n1 > 1:  # a single row sees the whole cache at position `start`: no mask
            positions = mx.array((start + tree.verify_positions()).astype(np.int32))  # (N+1,)
            full = np.ones((n1, start + n1), dtype=bool)  # (N+1, start + N+1)
            full[:, start:] = tree.verify_mask()
            mask = mx.array(full)
        logits = self.model.forward(tokens, positions, start, mask, need_logits=True)
        assert logits is not None  # need_logits=True always returns logits
        self._rows_x = self.model.last_x  # (N+1, C)
        return self._finish(logits, need_logits)

    def _verify_invariant(self, host: np.ndarray, tree: DraftTree, need_logits: bool) -> Verified:
        """``verify`` in batch-invariant mode: one forward (CPU), or chunks of exactly
        ``MAX_ROWS`` rows padded with copies of the chunk's first row (GPU), attention
        over each row's logical key list. Still one lazy graph and one ``mx.eval``."""
        n1, start = host.size, self._len
        # Row i sees the cache, then its ancestors and itself among the new slots.
        vis = tree.verify_mask() if n1 > 1 else np.ones((1, 1), bool)  # (N+1, N+1)
        rows = [(start + np.flatnonzero(vis[i])).tolist() for i in range(n1)]
        pos = (start + tree.verify_positions()).astype(np.int32)  # (N+1,)
        size = self._pad_rows or n1
        parts, xs = [], []
        for c0 in range(0, n1, size):
            c1 = min(n1, c0 + size)
            sel = list(range(c0, c1)) + [c0] * (size - (c1 - c0))
            win = None
            if self.model.window is not None:  # (W, rows' positions, every slot's)
                win = (self.model.window, pos[sel], np.concatenate([np.arange(start), pos]))
            plan = make_plan(start, [rows[i] for i in sel], win)
            tokens = mx.array(host[sel].astype(np.int32))  # (R,)
            logits = self.model.forward(
                tokens, mx.array(pos[sel]), start + c0, None, True, plan=plan, n_write=c1 - c0
            )
            assert logits is not None
            parts.append(logits[: c1 - c0])  # (c1 - c0, V)
            xs.append(self.model.last_x[: c1 - c0])  # (c1 - c0, C)
        self._rows_x = mx.concatenate(xs) if len(xs) > 1 else xs[0]  # (N+1, C)
        return self._finish(mx.concatenate(parts) if len(parts) > 1 else parts[0], need_logits)

    def _finish(self, logits: mx.array, need_logits: bool) -> Verified:
        """Argmax (and float32 logits when asked for) of the verified rows: one eval."""
        n1 = logits.shape[0]
        argmax = mx.argmax(logits, axis=-1)  # (N+1,) uint32
        self._pending = n1
        if not need_logits:
            mx.eval(argmax)
            return Verified(argmax=np.array(argmax).astype(np.int64))
        logits32 = logits.astype(mx.float32)  # (N+1, V)
        mx.eval(argmax, logits32)
        return Verified(argmax=np.array(argmax).astype(np.int64), logits=np.array(logits32))

    def commit(self, keep: np.ndarray) -> None:
        keep = np.asarray(keep, dtype=np.int64).reshape(-1)
        if not self._pending:
            raise DraftwiseError("commit() without a preceding verify()")
        if (
            keep.size == 0
            or keep[0] != 0
            or keep.max() >= self._pending
            or np.any(np.diff(keep) <= 0)
        ):
            raise DraftwiseError(
                f"commit rows {keep.tolist()} must start at 0 and increase below {self._pending}"
            )
        k = int(keep.size)
        # Rows 0..k-1 kept in order (plain decoding, an accepted chain prefix) are already
        # in place; otherwise gather the kept slots down, lazily, in every layer.
        if keep[-1] != k - 1:
            src = mx.array((self._len + keep).astype(np.int32))  # (K,)
            self.model.move_slots(src, self._len)
            mx.async_eval(self.model.cache_arrays())
        if self._rows is not None and self._rows_x is not None:  # lazy: no evaluation
            self._record_rows(self._len, self._rows_x[mx.array(keep.astype(np.int32))])
        self._len += k
        self._pending = 0
        if self._rows_x is not None:  # a lazy slice of the last kept row: no evaluation
            self._hidden_x, self._hidden_len = self._rows_x[int(keep[-1])], self._len
