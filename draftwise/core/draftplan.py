"""How deep a draft model should draft and how much the target should verify, from the
cost curves of both models (``auto`` for the ``draft`` and ``card`` drafters).

Words: the *verify curve* ``V(r)`` is the target's measured ms to verify ``r`` rows
(``core.costmodel``), the *draft curve* ``F(r)`` the draft model's ms for one forward
over ``r`` tree rows, measured the same way. ``p[d, j]`` is the chance that a node at
depth ``d`` of sibling rank ``j`` is accepted when its parent was (the auto drafter's
``AcceptanceModel``, learnt online from what the target emitted).

A draft of depth ``D`` grown by path score (``beam`` K, ``topk`` k) has, per layer, the
K best nodes of the layer above expanded into k children each; the planner builds that
shape with the acceptance model's probabilities, and a budget of ``N`` nodes (the best by
path probability) is worth ``E(D, N) = 1 + sum of their path probabilities`` tokens.
Its cost per step is

- sequential (``draft``): ``F(rows of layer 1) + ... + F(rows of layer D) + V(N + 1)``;
- parallel (``card``, the worker drafts while the target verifies):
  ``max(V(N + 1), draft time of D layers)``: a worker slower than the verify holds the
  deeper layers back, one faster is free.

``plan`` picks the ``(D, N)`` with the most tokens per ms, ``(0, 0)`` (plain decoding)
when no draft pays for itself.

Example: a draft forward 10x cheaper than a verify pays for a deep chain when the
draft is good, nothing when it is bad::

    >>> verify = CostModel(rows=[1, 64], ms=[50.0, 50.0 + 63 * 2.0])
    >>> draft = CostModel(rows=[1, 64], ms=[5.0, 5.0 + 63 * 0.2])
    >>> good, bad = np.full((8, 4), 0.9), np.full((8, 4), 0.02)
    >>> p = plan_draft(verify, draft, good, beam=1, topk=1, max_depth=8, max_budget=16)
    >>> (p.depth, p.budget)
    (8, 8)
    >>> plan_draft(verify, draft, bad, beam=1, topk=1, max_depth=8, max_budget=16).depth
    0
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from draftwise.core.acceptance_model import AcceptanceModel
from draftwise.core.costmodel import CostModel
from draftwise.core.tree import DraftTree
from draftwise.errors import DraftwiseError


@dataclass(frozen=True)
class DraftPlan:
    """A planned step: grow ``depth`` layers, verify ``budget`` nodes."""

    depth: int
    budget: int
    tokens: float  # expected tokens per step (accepted + the bonus token)
    ms: float  # expected ms per step
    probe: bool = False  # drafted although plain pays more: acceptance must be learnt

    @property
    def rate(self) -> float:
        """Expected tokens per ms."""
        return self.tokens / self.ms


def tree_shape(
    p: np.ndarray, beam: int, topk: int, depth: int
) -> tuple[list[np.ndarray], list[int]]:
    """Path probabilities of the nodes of each layer (best first) of a depth-``depth``
    draft grown by path score, and the rows each layer's forward runs.

    ``p`` (D_max, R) conditional acceptance by depth (1-based rows: ``p[0]`` is depth 1)
    and sibling rank; depths and ranks past its end reuse its last row / column.

    >>> layers, rows = tree_shape(np.full((4, 4), 0.5), beam=2, topk=2, depth=2)
    >>> [x.tolist() for x in layers], rows
    ([[0.5, 0.5], [0.25, 0.25, 0.25, 0.25]], [1, 2])
    """
    layers, rows = [], []
    parents = np.ones(1)  # the root: reached for sure
    for d in range(depth):
        pd = p[min(d, p.shape[0] - 1)]
        cond = pd[np.minimum(np.arange(topk), pd.size - 1)]  # (k,) by sibling rank
        kids = (parents[:, None] * cond[None, :]).reshape(-1)  # (P * k,)
        kids = np.sort(kids)[::-1]
        rows.append(parents.size)
        layers.append(kids)
        parents = kids[:beam]
    return layers, rows


def plan_draft(
    verify: CostModel,
    draft: CostModel,
    p: np.ndarray,
    beam: int,
    topk: int,
    max_depth: int,
    max_budget: int,
    context_len: int = 256,
    parallel: bool = False,
) -> DraftPlan:
    """The ``(depth, budget)`` with the most expected tokens per ms; see the module
    docstring. ``p``: (D, R) conditional acceptance by depth and sibling rank."""
    p = np.asarray(p, np.float64)
    if p.ndim != 2 or p.size == 0 or np.any((p < 0) | (p > 1)):
        raise DraftwiseError(f"acceptance table must be 2-D probabilities, got shape {p.shape}")
    if min(beam, topk, max_depth) < 1 or max_budget < 0:
        raise DraftwiseError(
            f"cannot plan beam={beam}, topk={topk}, max_depth={max_depth}, max_budget={max_budget}"
        )
    plain = float(verify.cost(1, context_len))
    best = DraftPlan(0, 0, 1.0, plain)
    layers, rows = tree_shape(p, beam, topk, max_depth)
    draft_ms = np.cumsum(draft.cost(np.asarray(rows), context_len))  # (D,) ms to grow d layers
    nodes = np.zeros(0)
    for d in range(1, max_depth + 1):
        # nodes of depth <= d, best first (a child never beats its parent: ancestors first)
        nodes = np.sort(np.concatenate([nodes, layers[d - 1]]))[::-1]
        n_max = min(max_budget, nodes.size)
        if n_max == 0:
            break
        n = np.arange(1, n_max + 1)  # (N,)
        tokens = 1.0 + np.cumsum(nodes[:n_max])  # (N,)
        ver = verify.cost(n + 1, context_len)  # (N,)
        ms = np.maximum(ver, draft_ms[d - 1]) if parallel else ver + draft_ms[d - 1]
        i = int(np.argmax(tokens / ms))
        if tokens[i] / ms[i] > best.rate:
            best = DraftPlan(d, int(n[i]), float(tokens[i]), float(ms[i]))
    return best


class DraftPlanner:
    """``auto`` for a draft-model drafter: plans each step's depth and budget from both
    cost curves and the acceptance it learns (the drafter then hands the target the
    ``budget`` best nodes by the draft's path score).

    The drafter calls ``plan`` before drafting, ``record`` with the tree it proposed, and
    ``update`` with the context after the step; ``last`` is the last plan.

    Example::

        planner = DraftPlanner(verify_cost, draft_cost, beam=4, topk=4, max_depth=6)
        plan = planner.plan(context_len=300, budget=64)   # e.g. DraftPlan(depth=3, budget=7, ...)
        planner.record(tree, context_len=300)               # the tree verified
        planner.update(new_context)                         # learns what was accepted
    """

    def __init__(
        self,
        verify: CostModel,
        draft: CostModel,
        beam: int,
        topk: int,
        max_depth: int,
        parallel: bool = False,
        probe_every: int = 16,
    ) -> None:
        self.verify, self.draft = verify, draft
        self.probe_every = probe_every  # a plain plan this many times in a row: draft once
        self.beam, self.topk, self.max_depth, self.parallel = beam, topk, max_depth, parallel
        self.acc = AcceptanceModel(n_sources=1, max_depth=max(16, max_depth), max_rank=max(8, topk))
        self.last = DraftPlan(0, 0, 1.0, 1.0)
        self._plain = 0  # plain plans in a row
        self.counts = {"plans": 0, "plain_plans": 0, "probes": 0, "planned_depth": 0,
                       "planned_nodes": 0}  # totals over the drafter's life (bench stats)
        self._pending: deque[tuple[DraftTree, int]] = deque()  # (proposed tree, root index)

    def reset(self) -> None:
        self.acc = AcceptanceModel(n_sources=1, max_depth=self.acc.hits.shape[1],
                                   max_rank=self.acc.hits.shape[2])
        self._pending.clear()

    def plan(self, context_len: int, budget: int) -> DraftPlan:
        """Depth and budget for this step (``budget`` caps the nodes verified)."""
        p = (self.acc.hits / self.acc.tries)[0]  # (D, R)
        plan = plan_draft(self.verify, self.draft, p, self.beam, self.topk,
                          self.max_depth, max(budget, 0), context_len, self.parallel)
        self._plain = self._plain + 1 if plan.depth == 0 else 0
        if self._plain >= self.probe_every and budget > 0:
            # plain forever would never learn that the draft got better: probe it
            self._plain = 0
            plan = DraftPlan(self.max_depth, min(budget, self.max_depth * self.beam),
                             plan.tokens, plan.ms, probe=True)
        self.last = plan
        c = self.counts
        c["plans"] += 1
        c["plain_plans"] += plan.depth == 0
        c["probes"] += plan.probe
        c["planned_depth"] += plan.depth
        c["planned_nodes"] += plan.budget
        return plan

    def record(self, tree: DraftTree, context_len: int) -> None:
        """Remember a verified tree, to be scored against what the target emits."""
        if len(tree):
            self._pending.append((tree, context_len))

    def begin(self) -> None:
        """A new generation: trees of the last one are not scored against this one."""
        self._pending.clear()

    def update(self, context: np.ndarray) -> None:
        """Score remembered trees once every node's fate is known (or 8 steps later)."""
        while self._pending:
            tree, root_end = self._pending[0]
            if context.size < root_end:  # a new generation: the old trees say nothing
                self._pending.clear()
                return
            if context.size - root_end < tree.max_depth and len(self._pending) < 8:
                break
            self._pending.popleft()
            self.acc.observe(tree, context[root_end : root_end + tree.max_depth])
