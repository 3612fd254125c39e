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

from collections.abc import Sequence

import numpy as np

from draftwise.core.drafters.base import Drafter
from draftwise.core.tree import DraftTree, merge_trees
from draftwise.errors import DraftwiseError


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

    def update(self, context: np.ndarray, n_new: int) -> None:
        for m in self.members:
            m.update(context, n_new)
