"""The tensor step a draft model supplies to the core: next-token top-k for tree rows.

A draft language model (a smaller model with the target's tokenizer, or the target's own
first layers) keeps its own KV cache. Like the target's backend (``core.backend``) it
holds the first ``cache_len`` tokens of the context; after them come *scratch* slots,
one per tree node it has computed, in the order they were computed. The algorithms that
grow and prune draft trees (``core.drafters.candidate_cache``) live in the core and only
call the methods below, so every backend implements the same few tensor operations.

Example (a root and two of its children, on any ``DraftLM``)::

    lm.reset(); lm.prefill(context[:-1])                       # cache: context but the root
    ids, logp = lm.expand(np.array([root]), np.array([0]), np.ones((1, 1), bool), k=2)
    # ids (1, 2): the two most likely next tokens after the root, logp their log-probs
    kids = ids[0]
    mask = np.array([[1, 1, 0], [1, 0, 1]], bool)             # each child sees the root + itself
    ids2, _ = lm.expand(kids, np.array([1, 1]), mask, k=2)     # scratch slots 1 and 2
    lm.keep(np.array([0, 1]), n_commit=2)   # root and child 0 were accepted: now cached
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np

from draftwise.errors import DraftwiseError


@runtime_checkable
class DraftLM(Protocol):
    """A draft model's forward over tree rows, with a cache of context + scratch slots."""

    name: str
    vocab_size: int  # ids it may propose are below this (the target's vocabulary)
    context_limit: int  # cached tokens + scratch slots never exceed this

    @property
    def cache_len(self) -> int:
        """Context tokens cached (scratch slots not counted)."""

    @property
    def scratch_len(self) -> int:
        """Tree rows computed since the last ``prefill``/``trim``/``keep``."""

    def reset(self) -> None:
        """Empty the cache and the scratch."""

    def trim(self, n: int) -> None:
        """Keep the first ``n`` cached tokens; drops the scratch."""

    def prefill(self, tokens: np.ndarray) -> None:
        """Append ``tokens`` (T,) to the cached context; drops the scratch."""

    def expand(
        self, tokens: np.ndarray, depths: np.ndarray, mask: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """One forward over ``R`` new scratch rows: ``tokens`` (R,) at positions
        ``cache_len + depths`` (R,); ``mask`` (R, S + R) bool says which scratch slots
        (the S existing ones, then the new rows) each row sees, on top of the whole
        cached context. Returns the ``k`` most likely next tokens of each row, best
        first, as ids (R, k) int64 and log-probabilities (R, k) float32."""

    def keep(self, slots: np.ndarray, n_commit: int) -> None:
        """Keep only scratch ``slots`` (K,), compacted in that order; their first
        ``n_commit`` become cached context tokens (a chain, in order), the rest stay
        scratch rows numbered from 0."""


class ScratchSlots:
    """The scratch bookkeeping every backend's draft model shares, as a mixin placed
    before the backend class (``class TorchDraftLM(ScratchSlots, TorchBackend)``): a
    count of the scratch rows computed since the last ``prefill``/``trim``/``reset``
    (which drop them), the check every ``expand`` starts with, and ``keep``; the backend
    supplies only ``_move_slots`` (its tensor gather) and the cache length ``_len``.

    Example::

        r, s0 = self.scratch_rows(tokens, mask)   # R new rows after S0 existing ones
        ...                                       # the backend's forward
        self._scratch += r
    """

    _scratch: int = 0
    # the backend's tensor gather: cache slots ``src`` (K,) (absolute) to ``dst .. dst + K``
    _move_slots: Callable[[np.ndarray, int], None]

    @property
    def scratch_len(self) -> int:
        return self._scratch

    def reset(self) -> None:
        super().reset()  # type: ignore[misc]
        self._scratch = 0

    def trim(self, n: int) -> None:
        super().trim(n)  # type: ignore[misc]
        self._scratch = 0

    def prefill(self, tokens: np.ndarray) -> None:
        self._scratch = 0
        super().prefill(tokens)  # type: ignore[misc]

    def scratch_rows(self, tokens: np.ndarray, mask: np.ndarray) -> tuple[int, int]:
        """(R, S0): the new rows ``tokens`` (R,) and the scratch rows before them, once
        ``mask`` is (R, S0 + R) and the cache has room for them (else a one-line error)."""
        r, s0 = int(tokens.size), self._scratch
        if mask.shape != (r, s0 + r):
            raise DraftwiseError(f"draft mask must be ({r}, {s0 + r}), got {mask.shape}")
        self._check_room("draft", s0 + r)  # type: ignore[attr-defined]
        return r, s0

    def keep(self, slots: np.ndarray, n_commit: int) -> None:
        """``DraftLM.keep``: validated here, the rows moved by the backend."""
        slots = np.asarray(slots, np.int64).reshape(-1)
        if not 0 <= n_commit <= slots.size or (
            slots.size and (slots.min() < 0 or slots.max() >= self._scratch)
        ):
            raise DraftwiseError(
                f"keep {slots.tolist()} (commit {n_commit}) outside {self._scratch} scratch rows"
            )
        n = self._len  # type: ignore[attr-defined]
        if slots.size and not np.array_equal(slots, np.arange(slots.size)):
            self._move_slots(n + slots, n)
        self._len = n + n_commit
        self._scratch = int(slots.size) - n_commit
