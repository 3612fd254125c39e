"""Sequential draft-model drafting: the draft model grows a tree by path score (or a
chain), then the target verifies it. Any model with the target's tokenizer drafts, as
a ``core.draft_lm.DraftLM`` (a smaller model, or the target's own first layers).

Each step corrects the candidate cache with the tokens the target emitted (the subtree
below them is kept with its computed keys and values, so a long accepted guess costs
few new draft forwards), grows it layer by layer up to ``depth`` (at most ``budget``
deep), and hands the ``budget`` best nodes by path score to the target.

``beam=1, topk=1`` is a greedy chain, mlx-lm's ``num_draft_tokens``::

    chain = DraftModelDrafter.chain(lm, n=4)      # 4 greedy draft tokens per step
    tree = DraftModelDrafter(lm, beam=4, topk=4, depth=5)
    t = tree.propose(context, budget=16)          # the 16 best of up to 68 candidates
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from draftwise.core.draft_lm import DraftLM
from draftwise.core.drafters.candidate_cache import CandidateCache
from draftwise.core.tree import DraftTree

if TYPE_CHECKING:  # at run time only passed in: core.draftplan imports the drafters' package
    from draftwise.core.draftplan import DraftPlanner


class DraftModelDrafter:
    """Draft with a draft model, then verify (no overlap); see the module docstring."""

    name = "draft"

    def __init__(
        self,
        lm: DraftLM,
        beam: int = 4,
        topk: int = 4,
        depth: int = 5,
        max_nodes: int = 512,
        planner: DraftPlanner | None = None,
    ) -> None:
        self.lm = lm
        self.planner = planner  # auto: depth and budget per step from both cost curves
        self.beam, self.topk, self.depth, self.max_nodes = beam, topk, depth, max_nodes
        self.cache = CandidateCache(beam, topk, depth, max_nodes)
        self.forwards = 0  # draft forwards so far (rows of one layer each)
        self.last_probs = np.zeros(0)  # draft probability of each node of the last tree

    @classmethod
    def chain(cls, lm: DraftLM, n: int = 4) -> DraftModelDrafter:
        """A greedy chain of ``n`` draft tokens per step (mlx-lm's num_draft_tokens)."""
        return cls(lm, beam=1, topk=1, depth=n)

    def reset(self) -> None:
        if self.planner is not None:
            self.planner.reset()
        self.lm.reset()
        self.cache = CandidateCache(self.beam, self.topk, self.depth, self.max_nodes)

    def begin(self, prompt: np.ndarray) -> None:
        # the first propose prefills the draft model (prefix reused when cached)
        if self.planner is not None:
            self.planner.begin()

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        context = np.asarray(context, np.int64)
        depth = budget
        if self.planner is not None:
            plan = self.planner.plan(context.size, budget)
            depth, budget = plan.depth, plan.budget
            if depth == 0:  # a plain step: not even the draft's prefill (it catches up
                self.last_probs = np.zeros(0)  # in one forward when drafting resumes)
                return DraftTree.empty()
        self.cache.sync(self.lm, context)
        while depth > 0 and self.cache.grow(self.lm, max_depth=depth):
            self.forwards += 1
        tree, self.last_probs = self.cache.snapshot().query(context, budget)
        if self.planner is not None:
            self.planner.record(tree, context.size)
        return tree

    def stats(self) -> dict[str, int]:
        """Draft forwards so far, and with ``auto`` the planner's totals."""
        plan = self.planner.counts if self.planner is not None else {}
        return {"forwards": self.forwards, **plan}

    def update(self, context: np.ndarray, n_new: int) -> None:
        # the next propose corrects the cache with the new tokens
        if self.planner is not None:
            self.planner.update(np.asarray(context, np.int64))
