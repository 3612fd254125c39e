"""The contract between the hardware-agnostic core and a model backend.

A backend owns the model weights and one KV cache. The core drives it with four calls per
generation: ``reset``/``trim`` and ``prefill`` once, then ``verify`` + ``commit`` per step.

Conventions (see ``draftwise.core.tree``):

- The cache holds the first ``cache_len`` tokens of the sequence. The *root* is the next
  token, not yet cached.
- ``verify(root, tree)`` runs ONE forward pass over the ``N + 1`` rows
  ``[root, tree nodes]`` at positions ``cache_len + tree.verify_positions()`` with
  ``tree.verify_mask()`` (plus full visibility of the cache) and returns, per row, the
  target model's prediction of the next token. It writes the rows' keys/values after
  the cache but does not grow ``cache_len``.
- ``commit(keep)`` keeps the rows ``keep`` (indices into the ``N + 1`` rows, row 0 first,
  each the parent of the next) in the cache, compacted into place, and grows
  ``cache_len`` by ``len(keep)``. Everything else written by ``verify`` is dropped.

Example, plain decoding of one token (an empty tree)::

    backend.reset(); backend.prefill(prompt[:-1])
    out = backend.verify(prompt[-1], DraftTree.empty(), need_logits=False)
    backend.commit(np.array([0]))          # the root is now cached
    next_token = int(out.argmax[0])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np

from draftwise.core.device import DeviceInfo
from draftwise.core.sampling import SamplingParams
from draftwise.core.tree import DraftTree


class Verified:
    """What one verification pass returns to the core (already on the host).

    ``argmax`` (N+1,) int64: the target's greedy next token for each row; ``logits``
    (N+1, V) float32 raw logits, when asked for; with logits, optionally ``sample``: a
    compiled ``core.sampling.next_token`` of a row, ``sample(row, recent, params, u) ->
    token``, that the decoder calls in its place. A backend may give ``argmax`` and
    ``logits`` as functions instead (``lazy_argmax``, ``lazy_logits``), called once on
    first read: a sampling step whose rows are sampled by ``sample`` never reads either
    (AMD EPYC Zen 5: 0.06-0.09 ms a step of float32 copies and argmax saved).

    Example::

        >>> v = Verified(lazy_argmax=lambda: np.array([3]))
        >>> v.argmax.tolist(), v.logits
        ([3], None)
    """

    __slots__ = ("_argmax", "_logits", "sample", "_lazy_argmax", "_lazy_logits")

    def __init__(
        self,
        argmax: np.ndarray | None = None,
        logits: np.ndarray | None = None,
        sample: Callable[[int, np.ndarray, SamplingParams, float], int] | None = None,
        *,
        lazy_argmax: Callable[[], np.ndarray] | None = None,
        lazy_logits: Callable[[], np.ndarray] | None = None,
    ) -> None:
        if (argmax is None) == (lazy_argmax is None):
            raise TypeError("Verified needs exactly one of argmax and lazy_argmax")
        if logits is not None and lazy_logits is not None:
            raise TypeError("Verified takes logits or lazy_logits, not both")
        self._argmax, self._lazy_argmax = argmax, lazy_argmax
        self._logits, self._lazy_logits = logits, lazy_logits
        self.sample = sample

    @property
    def argmax(self) -> np.ndarray:
        if self._argmax is None:
            assert self._lazy_argmax is not None
            self._argmax, self._lazy_argmax = self._lazy_argmax(), None
        return self._argmax

    @property
    def logits(self) -> np.ndarray | None:
        if self._lazy_logits is not None:
            self._logits, self._lazy_logits = self._lazy_logits(), None
        return self._logits


@runtime_checkable
class Backend(Protocol):
    """What the decoding loop needs from a model backend."""

    name: str  # e.g. "torch-cpu-float32"
    vocab_size: int
    context_limit: int  # maximum sequence length (positions) the model supports

    @property
    def cache_len(self) -> int: ...

    def device_info(self) -> DeviceInfo:
        """What this backend computes on (cost profiles are keyed by it)."""

    def reset(self) -> None:
        """Empty the KV cache."""

    def trim(self, n: int) -> None:
        """Keep only the first ``n`` cached tokens (``n <= cache_len``)."""

    def prefill(self, tokens: np.ndarray) -> None:
        """Append ``tokens`` (T,) to the cache, computing their keys and values."""

    def verify(self, root: int, tree: DraftTree, need_logits: bool) -> Verified:
        """One forward over ``[root, tree nodes]``; see the module docstring."""

    def commit(self, keep: np.ndarray) -> None:
        """Keep rows ``keep`` of the last ``verify`` in the cache; see the module docstring."""


@runtime_checkable
class Overlapping(Protocol):
    """A backend whose verify returns control before the device finishes (CUDA): it
    calls ``while_waiting`` (when set) after launching a verify's device work and before
    waiting for its result, so host work overlaps the step. The decoder sets it for one
    generation (``Background`` drafters)."""

    while_waiting: Callable[[], None] | None


@runtime_checkable
class SamplingVerifier(Protocol):
    """A backend that can sample every verify row where its logits are (on the device).
    ``device_sampling`` says whether the decoder should: True where the logits live off
    the host (CUDA); on CPU the host samples only the rows acceptance visits."""

    device_sampling: bool

    def verify_sampled(
        self, root: int, tree: DraftTree, params: SamplingParams, u: np.ndarray, recent: np.ndarray
    ) -> np.ndarray:
        """Like ``verify``, but returns (N+1,) tokens: row ``r`` sampled as
        ``next_token(logits[r], recent[r], params, u[r])`` with ``u`` (N+1,) and the
        penalty windows ``recent`` (N+1, W)."""
