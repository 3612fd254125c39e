"""Several drafters in one tree: ``cacheback+ssd`` proposes the union of both trees.

Each member proposes with the whole budget; the trees are merged (shared prefixes
deduplicated) and cut breadth-first to the budget, earlier members first within a depth.
Every member learns from every step. A node's ``source`` says which member proposed it.

Example::

    >>> from draftwise.core.drafters.base import NoDrafter
    >>> c = Combined([NoDrafter(), NoDrafter()])
    >>> c.name, len(c.propose(np.array([1, 2]), budget=8))
    ('none+none', 0)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from draftwise.core.atomic import atomic_file
from draftwise.core.drafters.base import Drafter, close_drafter
from draftwise.core.tree import DraftTree, merge_trees
from draftwise.errors import DraftwiseError


@runtime_checkable
class Persistent(Protocol):
    """A drafter whose learnt state can be written to and read from one file."""

    def save(self, path: str | os.PathLike[str], tokenizer_id: str) -> None: ...

    def load(self, path: str | os.PathLike[str], tokenizer_id: str) -> Any: ...


def member_path(path: str | os.PathLike[str], index: int, member: Drafter) -> Path:
    """Where member ``index`` of a composite drafter saved at ``path`` keeps its state."""
    return Path(f"{os.fspath(path)}.{index}-{member.name}")


def save_members(members: Sequence[Drafter], path: str | os.PathLike[str], tokenizer_id: str) -> None:
    """Save every persistent member beside ``path`` (one file each, atomic per file)."""
    for i, m in enumerate(members):
        if isinstance(m, Persistent):
            m.save(member_path(path, i, m), tokenizer_id)
    with atomic_file(path, "w") as f:  # a crash mid-save leaves the previous index whole
        f.write("".join(f"{i} {m.name}\n" for i, m in enumerate(members)))


def load_members(members: Sequence[Drafter], path: str | os.PathLike[str], tokenizer_id: str) -> None:
    """Load the members saved by ``save_members``; a member without a file stays as is."""
    if not Path(path).is_file():
        raise DraftwiseError(f"no saved drafter state at '{path}'")
    for i, m in enumerate(members):
        if isinstance(m, Persistent) and member_path(path, i, m).is_file():
            m.load(member_path(path, i, m), tokenizer_id)


def beams_of(members: Sequence[Drafter]) -> tuple[int, int] | None:
    """(rows, length) of the beams the members drafted for their last proposal (beam
    drafters such as ReDrafter keep ``last_beam``): widths summed, the longest length;
    None when no member drafted beams.

    Example::

        >>> from draftwise.core.drafters.base import NoDrafter
        >>> beams_of([NoDrafter()]) is None
        True
    """
    shapes = [s for m in members if (s := getattr(m, "last_beam", None))]
    if not shapes:
        return None
    return sum(bw for bw, _ in shapes), max(t for _, t in shapes)


class Combined:
    """The union of several drafters' trees within one budget."""

    def __init__(self, members: Sequence[Drafter]) -> None:
        if not members:
            raise DraftwiseError("a combined drafter needs at least one member")
        self.members = list(members)
        self.name = "+".join(m.name for m in self.members)

    def reset(self) -> None:
        for m in self.members:
            m.reset()

    def begin(self, prompt: np.ndarray) -> None:
        for m in self.members:
            m.begin(prompt)

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        if budget <= 0:
            return DraftTree.empty()
        trees = [m.propose(context, budget) for m in self.members]
        return merge_trees(trees, budget)

    @property
    def last_beam(self) -> tuple[int, int] | None:
        return beams_of(self.members)

    def update(self, context: np.ndarray, n_new: int) -> None:
        for m in self.members:
            m.update(context, n_new)

    def save(self, path: str | os.PathLike[str], tokenizer_id: str) -> None:
        save_members(self.members, path, tokenizer_id)

    def close(self) -> None:
        for m in self.members:
            close_drafter(m)

    def load(self, path: str | os.PathLike[str], tokenizer_id: str) -> None:
        load_members(self.members, path, tokenizer_id)


class Capped:
    """A drafter whose trees never exceed ``cap`` nodes, whatever budget the caller gives:
    the ``budget=N`` option of a drafter spec (``cacheback:budget=4``), so one run can
    compare several tree sizes of the same drafter.

    Example::

        >>> from draftwise.core.drafters.base import NoDrafter
        >>> Capped(NoDrafter(), 4).name
        'none:budget=4'
    """

    def __init__(self, inner: Drafter, cap: int) -> None:
        if not isinstance(cap, int) or isinstance(cap, bool) or cap < 0:
            raise DraftwiseError(f"drafter option budget must be an integer >= 0, got {cap!r}")
        self.inner = inner
        self.cap = cap
        self.name = f"{inner.name}:budget={cap}"

    def reset(self) -> None:
        self.inner.reset()

    def begin(self, prompt: np.ndarray) -> None:
        self.inner.begin(prompt)

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        return self.inner.propose(context, min(budget, self.cap))

    @property
    def last_beam(self) -> tuple[int, int] | None:
        return beams_of([self.inner])

    def stats(self) -> dict[str, int]:
        """The inner drafter's counters, if it keeps any (the bench reports them)."""
        inner = getattr(self.inner, "stats", None)
        return dict(inner()) if callable(inner) else {}

    def update(self, context: np.ndarray, n_new: int) -> None:
        self.inner.update(context, n_new)

    def save(self, path: str | os.PathLike[str], tokenizer_id: str) -> None:
        save_members([self.inner], path, tokenizer_id)

    def close(self) -> None:
        close_drafter(self.inner)

    def load(self, path: str | os.PathLike[str], tokenizer_id: str) -> None:
        load_members([self.inner], path, tokenizer_id)
