"""The drafter interface: propose a tree for the current context, learn from the result.

A drafter sees only token ids (numpy arrays); it knows nothing of the model, the
tokenizer or the device. The decoding loop calls, per generation::

    drafter.begin(prompt)                    # warm up on the prompt
    loop:
        tree = drafter.propose(context, budget)   # context includes the root token
        ... verify, accept ...
        drafter.update(context, n_new)           # context now ends with n_new new tokens

``reset()`` forgets everything learnt (a fresh drafter); state otherwise carries across
generations, which is what a chat or a server wants.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from draftwise.core.tree import DraftTree


@runtime_checkable
class Drafter(Protocol):
    name: str

    def reset(self) -> None:
        """Forget all learnt state."""

    def begin(self, prompt: np.ndarray) -> None:
        """Called once per generation with the prompt (T,) before the first step."""

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        """A tree of at most ``budget`` nodes guessing what follows ``context`` (T,)."""

    def update(self, context: np.ndarray, n_new: int) -> None:
        """``context`` (T,) now ends with ``n_new`` tokens emitted by the last step."""


@runtime_checkable
class PathAware(Protocol):
    """A drafter that plans for the verify path in use: ``sampling`` is True when each
    step brings every row's logits to the host (temperature > 0, a penalty), False for
    greedy argmax. The decoder tells it once per generation."""

    def plan_for(self, sampling: bool) -> None: ...


@runtime_checkable
class CostObserver(Protocol):
    """A drafter that plans with a verify cost curve and learns it from live timings:
    the decoder reports every tree verify (``rows`` including the root, the cache length
    before it, its milliseconds)."""

    def observe_verify(self, rows: int, context_len: int, ms: float) -> None: ...


@runtime_checkable
class Background(Protocol):
    """A drafter with bookkeeping that does not decide its next draft (scoring past
    trees for its acceptance model, say). The decoder runs ``background`` once a step
    while the device computes the verify (``backend.while_waiting``, where the backend
    overlaps; else right after the verify), so the host work hides under the step."""

    def background(self) -> None: ...


@runtime_checkable
class Closeable(Protocol):
    """A drafter that holds something to release (CARD's worker thread)."""

    def close(self) -> None:
        """Stop and release it; the drafter may start again on its next ``begin``."""


def close_drafter(drafter: Drafter) -> None:
    """``drafter.close()`` when it has one (composites forward it to their members)."""
    if isinstance(drafter, Closeable):
        drafter.close()


class NoDrafter:
    """Plain decoding: proposes nothing, so every step emits exactly one token."""

    name = "none"

    def reset(self) -> None:
        pass

    def begin(self, prompt: np.ndarray) -> None:
        pass

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        return DraftTree.empty()

    def update(self, context: np.ndarray, n_new: int) -> None:
        pass
