"""A tiny numpy draft model (``core.draft_lm.DraftLM``) for testing the core without weights.

Its next-token log-probabilities depend on the last two tokens of the row's sequence
through a fixed random table. The sequence of a row is rebuilt from what the mask lets
it see (the cached context, then the visible scratch slots in order, then itself), so a
wrong mask or a wrong compaction gives wrong answers, which the tests catch.
"""

from __future__ import annotations

import threading

import numpy as np


class FakeDraftLM:
    name = "fake-draft"

    def __init__(self, vocab_size: int = 8, seed: int = 1, context_limit: int = 4096,
                 sharpness: float = 2.0) -> None:
        rng = np.random.default_rng(seed)
        self.vocab_size = vocab_size
        self.context_limit = context_limit
        logits = rng.standard_normal((vocab_size, vocab_size, vocab_size)) * sharpness
        self.table = logits - np.log(np.exp(logits).sum(-1, keepdims=True))  # log-softmax
        self.cached: list[int] = []
        self.scratch: list[list[int]] = []  # per slot: the full sequence it ends
        self.forwards = 0
        self.busy = threading.Lock()  # held during expand: detects concurrent use

    @property
    def cache_len(self) -> int:
        return len(self.cached)

    @property
    def scratch_len(self) -> int:
        return len(self.scratch)

    def logprobs(self, seq: list[int]) -> np.ndarray:
        v = self.vocab_size  # context tokens may lie outside the draft's tiny vocabulary
        a = seq[-2] % v if len(seq) >= 2 else 0
        return self.table[a, seq[-1] % v]

    def reset(self) -> None:
        self.cached, self.scratch = [], []

    def trim(self, n: int) -> None:
        assert 0 <= n <= len(self.cached)
        self.cached, self.scratch = self.cached[:n], []

    def prefill(self, tokens: np.ndarray) -> None:
        self.cached += [int(t) for t in tokens]
        self.scratch = []

    def expand(self, tokens, depths, mask, k):  # type: ignore[no-untyped-def]
        if not self.busy.acquire(blocking=False):
            raise AssertionError("draft model used by two threads at once")
        try:
            self.forwards += 1
            s0, r = len(self.scratch), len(tokens)
            assert mask.shape == (r, s0 + r)
            assert len(self.cached) + s0 + r <= self.context_limit
            new = []
            for i in range(r):
                vis = np.flatnonzero(mask[i, :s0]).tolist()
                assert mask[i, s0 + i] and mask[i, s0:].sum() == 1, "rows of a step are independent"
                assert len(vis) == depths[i], "position = cached + ancestors"
                anc = [self.scratch[j][-1] for j in vis]
                for j in vis:  # each visible slot must be an ancestor of the next
                    assert self.scratch[j][: len(self.cached)] == self.cached
                new.append(self.cached + anc + [int(tokens[i])])
            self.scratch += new
            lp = np.stack([self.logprobs(s) for s in new])  # (R, V)
            ids = np.argsort(-lp, axis=1, kind="stable")[:, :k]
            return ids.astype(np.int64), np.take_along_axis(lp, ids, 1).astype(np.float32)
        finally:
            self.busy.release()

    def keep(self, slots, n_commit):  # type: ignore[no-untyped-def]
        kept = [self.scratch[int(s)] for s in slots]
        for i in range(n_commit):
            assert kept[i] == self.cached + [kept[j][-1] for j in range(i + 1)], "commit is a chain"
        self.cached = self.cached + [kept[i][-1] for i in range(n_commit)]
        self.scratch = kept[n_commit:]
