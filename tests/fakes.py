"""A tiny numpy "model" with a real (list) KV cache, for testing the core without weights.

Its next-token logits depend on the last two tokens through a fixed random table, so it
is cheap, deterministic and has structure a drafter can learn.
"""

from __future__ import annotations

import time

import numpy as np

from draftwise.core.backend import Verified
from draftwise.core.device import DeviceInfo
from draftwise.core.tree import DraftTree


class FakeBackend:
    name = "fake"

    def __init__(self, vocab_size: int = 8, context_limit: int = 512, seed: int = 0,
                 sharpness: float = 3.0) -> None:
        rng = np.random.default_rng(seed)
        self.vocab_size = vocab_size
        self.context_limit = context_limit
        self.table = (rng.standard_normal((vocab_size, vocab_size, vocab_size)) * sharpness).astype(np.float32)
        self.cache: list[int] = []
        self.pending: list[int] | None = None  # rows written by the last verify
        self.forwards = 0

    @property
    def cache_len(self) -> int:
        return len(self.cache)

    def device_info(self) -> DeviceInfo:
        return DeviceInfo(kind="cpu", name="fake", dtype="float32", mode="normal", threads=1)

    def logits_after(self, seq: list[int]) -> np.ndarray:
        a = seq[-2] if len(seq) >= 2 else 0
        return self.table[a, seq[-1]].copy()

    def reset(self) -> None:
        self.cache = []

    def trim(self, n: int) -> None:
        assert 0 <= n <= len(self.cache)
        self.cache = self.cache[:n]

    def prefill(self, tokens: np.ndarray) -> None:
        self.cache += [int(t) for t in tokens]

    def verify(self, root: int, tree: DraftTree, need_logits: bool) -> Verified:
        self.forwards += 1
        assert self.cache_len + len(tree) + 1 <= self.context_limit
        rows = [root] + tree.tokens.tolist()
        logits = np.empty((len(rows), self.vocab_size), np.float32)
        logits[0] = self.logits_after(self.cache + [root])
        for i in range(len(tree)):
            path = [root] + tree.tokens[tree.path_to(i)].tolist()
            logits[i + 1] = self.logits_after(self.cache + path)
        self.pending = rows
        return Verified(logits.argmax(axis=1), logits if need_logits else None)

    def commit(self, keep: np.ndarray) -> None:
        assert self.pending is not None and keep[0] == 0
        self.cache += [self.pending[i] for i in keep.tolist()]
        self.pending = None


class SlowFake(FakeBackend):
    """Each verify takes 2 ms per row: a slow device, and a cost curve that grows with
    rows by more than a busy test worker's timing noise."""

    def verify(self, root: int, tree: DraftTree, need_logits: bool) -> Verified:
        time.sleep(0.002 * (len(tree) + 1))
        return super().verify(root, tree, need_logits)


class FakeBatchBackend(FakeBackend):
    """FakeBackend plus the batched verification path (``core.batch.BatchVerifier``)."""

    def __init__(self, *args, batch_by_default: bool = True, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.batch_by_default = batch_by_default
        self.rows: np.ndarray | None = None

    def verify_batch(self, root: int, drafts: np.ndarray) -> np.ndarray:
        self.forwards += 1
        k, w = drafts.shape
        assert self.cache_len + w + 1 <= self.context_limit
        rows = np.concatenate([np.full((k, 1), root), drafts], axis=1)  # (k, w + 1)
        out = np.empty((k, w + 1), np.int64)
        for i in range(k):
            for j in range(w + 1):
                out[i, j] = self.logits_after(self.cache + rows[i, : j + 1].tolist()).argmax()
        self.rows = rows
        return out

    def commit_batch(self, row: int, n: int) -> None:
        assert self.rows is not None and 1 <= n <= self.rows.shape[1]
        self.cache += self.rows[row, :n].tolist()
        self.rows = None
