"""Model-derived n-grams (The N-Grammys, §4.1): the bigram top-k table and the unigram.

The *bigram table* holds, for every token ``x`` of the vocabulary, the model's own top-k
next tokens after the one-token sequence ``[x]`` at position 0 (no BOS, no chat prefix:
the paper evaluates ``model(x)`` on the bare token, and a one-token sequence needs no KV
cache, so the whole vocabulary is a few batched forwards). It is built once per model by
:func:`build_bigram_table` from any backend's ``topk_fn(tokens (B,)) -> ids (B, k)``.

The *extended bigram* drafts ``w > 1`` tokens by greedy chaining inside the table: draft
``i`` after ``x`` is ``[top_i(x), top_0(top_i(x)), top_0(top_0(top_i(x))), ...]``.

The *unigram* (q = 0) ranks tokens by ``d(x) = ||u_x - mean(u)||_V``, the distance of the
output embedding ``u_x`` from the mean output embedding under the covariance ``V^T V / |X|``
of the input embeddings ``V`` (closest first, i.e. ``p(x) ~ exp(-d(x))``).

Example with a toy "model" whose next token is always ``(x + 1) % 5`` then ``x + 2``::

    >>> fn = lambda t: np.stack([(t + 1) % 5, (t + 2) % 5], axis=1)
    >>> table = build_bigram_table(fn, vocab_size=5, k=2, batch_size=2)
    >>> table.drafts(3, k=2, w=3).tolist()   # top-2 after 3, each chained greedily
    [[4, 0, 1], [0, 1, 2]]
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from draftwise.core.drafters import table_io
from draftwise.errors import DraftwiseError

KIND = "bigram"
MAX_K = 64  # a wider table costs memory for no measurable acceptance


@runtime_checkable
class TableSource(Protocol):
    """A backend that can feed :func:`build_bigram_table` and :func:`unigram_ranking`."""

    def next_topk(self, tokens: np.ndarray, k: int) -> np.ndarray:
        """(B, k) top-k next tokens after each one-token sequence ``tokens`` (B,)."""

    def embeddings(self) -> tuple[np.ndarray, np.ndarray]:
        """(input embeddings (V, C), output embeddings (V, C)) as float32 numpy."""


@dataclass(frozen=True)
class BigramTable:
    """``topk`` (V, K) int32: the model's top-K next tokens after each single token,
    best first; ``unigram`` (V,) int32: token ids ranked by the unigram, or empty."""

    topk: np.ndarray
    unigram: np.ndarray

    def __post_init__(self) -> None:
        topk = np.ascontiguousarray(self.topk, dtype=np.int32)
        if topk.ndim != 2 or topk.shape[1] < 1:
            raise DraftwiseError(f"a bigram table needs a (V, K) array, got shape {topk.shape}")
        v = topk.shape[0]
        if topk.size and (topk.min() < 0 or topk.max() >= v):
            raise DraftwiseError(f"bigram table ids must lie in 0..{v - 1}")
        uni = np.ascontiguousarray(self.unigram, dtype=np.int32).reshape(-1)
        if uni.size and (uni.size != v or uni.min() < 0 or uni.max() >= v):
            raise DraftwiseError(f"a unigram ranking must be a permutation of 0..{v - 1}")
        object.__setattr__(self, "topk", topk)
        object.__setattr__(self, "unigram", uni)

    @property
    def vocab_size(self) -> int:
        return int(self.topk.shape[0])

    @property
    def k(self) -> int:
        return int(self.topk.shape[1])

    def drafts(self, token: int, k: int, w: int) -> np.ndarray:
        """(min(k, K), w) int64: the extended-bigram drafts after ``token`` (greedy chains)."""
        if not 0 <= token < self.vocab_size:
            raise DraftwiseError(f"token {token} outside the bigram table (size {self.vocab_size})")
        k = min(k, self.k)
        out = np.empty((k, max(w, 0)), np.int64)
        if w <= 0 or k <= 0:
            return out
        cur = self.topk[token, :k]
        out[:, 0] = cur
        top1 = self.topk[:, 0]
        for j in range(1, w):  # w - 1 vectorised gathers
            cur = top1[cur]
            out[:, j] = cur
        return out

    # ----- persistence ------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str], tokenizer_id: str) -> None:
        """Write the table atomically as ``.npz`` (no pickle), recording ``tokenizer_id``."""
        table_io.write_table(
            path, KIND, tokenizer_id, {"vocab": self.vocab_size, "k": self.k},
            {"topk": self.topk, "unigram": self.unigram},
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str], tokenizer_id: str) -> BigramTable:
        """Read a table written by :meth:`save`; refuses another tokenizer or a bad file."""
        meta, arrays = table_io.read_table(path, KIND, tokenizer_id, ["vocab", "k"], ["topk", "unigram"])
        topk = arrays["topk"]
        table_io.check(topk.shape == (meta["vocab"], meta["k"]), path, f"topk shape {topk.shape}")
        try:
            return cls(topk, arrays["unigram"])
        except DraftwiseError as exc:
            raise DraftwiseError(f"table file '{os.fspath(path)}' is inconsistent: {exc}") from None


def build_bigram_table(
    topk_fn: Callable[[np.ndarray], np.ndarray],
    vocab_size: int,
    k: int = 20,
    batch_size: int = 512,
    unigram: np.ndarray | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> BigramTable:
    """Call ``topk_fn`` on every token id in batches of ``batch_size``; ``topk_fn(ids (B,))``
    returns the model's top ``k`` next tokens (B, >= k) for each one-token sequence.
    ``progress(done, total)`` is called after each batch."""
    if not 1 <= k <= MAX_K:
        raise DraftwiseError(f"bigram k must be in 1..{MAX_K}, got {k}")
    if vocab_size < 1 or batch_size < 1:
        raise DraftwiseError(f"bad bigram build sizes: vocab_size={vocab_size}, batch_size={batch_size}")
    k = min(k, vocab_size)
    table = np.empty((vocab_size, k), np.int32)
    for s in range(0, vocab_size, batch_size):
        ids = np.arange(s, min(s + batch_size, vocab_size), dtype=np.int64)
        got = np.asarray(topk_fn(ids))
        if got.ndim != 2 or got.shape[0] != ids.size or got.shape[1] < k:
            raise DraftwiseError(f"topk_fn returned shape {got.shape} for {ids.size} tokens, k={k}")
        table[s : s + ids.size] = got[:, :k]
        if progress is not None:
            progress(s + ids.size, vocab_size)
    return BigramTable(table, unigram if unigram is not None else np.zeros(0, np.int32))


def unigram_ranking(embed: np.ndarray, lm_head: np.ndarray) -> np.ndarray:
    """(V,) token ids, most likely first, from input embeddings ``embed`` (V, C) and output
    embeddings ``lm_head`` (V, C): ascending ``||u_x - mean(u)||_V`` (see module docstring)."""
    e = np.asarray(embed, np.float64)
    u = np.asarray(lm_head, np.float64)
    if e.ndim != 2 or u.shape != e.shape:
        raise DraftwiseError(f"embeddings must both be (V, C), got {e.shape} and {u.shape}")
    cov = e.T @ e / e.shape[0]  # (C, C)
    diff = u - u.mean(axis=0, keepdims=True)  # (V, C)
    d2 = np.einsum("vc,cd,vd->v", diff, cov, diff)  # (V,) squared V-norm
    return np.argsort(d2, kind="stable").astype(np.int32)
