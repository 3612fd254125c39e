"""The candidate cache of CARD (seed 002, sections 2.2-2.4): a draft model grows a tree of
candidate continuations with path scores; the target takes its best part; correction
keeps what descends from the accepted tokens.

Words (seed 002): a node's *path score* is the product of the draft model's conditional
probabilities along its path from the root (kept here as a sum of log-probabilities).
One growth step takes the *primary* set, the ``beam`` (K) best not yet expanded nodes of
the deepest layer, runs the draft model over them in one tree forward and adds the
``topk`` (k) most likely children of each: the K x k *secondary* candidates. The next
step's primary set is the K best of those (equations 1-9). Every node stays in the
tree, so the target may verify any of them.

Node 0 is the *root*: the last context token, not cached by the draft model. Nodes are
stored in creation order, which is topological (a parent before its children).

*Correction* (section 2.4): when the target emits tokens ``t_1..t_m`` after the root, the
cache walks them down the tree. If all are there (a *hit*), the path's nodes become
cached context of the draft model and the subtree below ``t_m`` is kept, re-rooted at
``t_m``, with its computed keys and values; everything else is dropped. On a *miss* the
matched part that was computed is committed, the rest of the context is prefilled, and
the tree restarts from the target's token.

Example with a tiny table model (``tests/core/fake_draft.py``)::

    cache = CandidateCache(beam=2, topk=2, max_depth=3)
    cache.sync(lm, context)         # draft cache := context[:-1], tree := the root
    while cache.can_grow(lm):
        cache.grow(lm)              # one draft forward per layer
    tree, probs = cache.snapshot().query(context, budget=6)   # the 6 best nodes
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from draftwise.core.draft_lm import DraftLM
from draftwise.core.tree import DraftTree
from draftwise.errors import DraftwiseError


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size)
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def subtree_mask(parents: np.ndarray, node: int) -> np.ndarray:
    """(M,) bool: ``node`` and its descendants (``parents`` topologically ordered)."""
    inside = np.zeros(parents.size, bool)
    inside[node] = True
    for i in range(node + 1, parents.size):
        p = parents[i]
        if p >= 0 and inside[p]:
            inside[i] = True
    return inside


@dataclass(frozen=True)
class Snapshot:
    """An immutable copy of the candidate tree, safe to read from another thread.

    ``context`` ends with the root token (node 0); ``score`` is each node's log path
    score from the root and ``logp`` its conditional log-probability under the draft.
    """

    context: np.ndarray  # (C,) int64
    tokens: np.ndarray  # (M,) int64
    parents: np.ndarray  # (M,) int64, -1 for the root
    depth: np.ndarray  # (M,) int64, 0 for the root
    score: np.ndarray  # (M,) float64
    logp: np.ndarray  # (M,) float64

    def find(self, context: np.ndarray) -> int:
        """The node whose path spells the tokens of ``context`` after this snapshot's
        root (the root itself when ``context`` equals the snapshot's), or -1."""
        c = self.context.size
        if context.size < c or not np.array_equal(context[:c], self.context):
            return -1
        node = 0
        for tok in context[c:].tolist():
            hits = np.flatnonzero((self.parents == node) & (self.tokens == tok))
            if not hits.size:
                return -1
            node = int(hits[0])
        return node

    def query(
        self, context: np.ndarray, budget: int, chain: bool = False
    ) -> tuple[DraftTree, np.ndarray]:
        """The ``budget`` best nodes by path score below the node matching ``context``'s
        last token, as a DraftTree, with each node's draft probability (N,). Empty on a
        miss. Ties go to the shallower node, so the chosen nodes always include their
        ancestors (a child's score never exceeds its parent's). ``chain``: the best path
        instead (CARD's target verifies one sequence): the best child, repeatedly."""
        node = self.find(np.asarray(context, np.int64))
        if node < 0 or budget <= 0:
            return DraftTree.empty(), np.zeros(0)
        if chain:
            return self._best_path(node, budget)
        inside = subtree_mask(self.parents, node)
        inside[node] = False
        cand = np.flatnonzero(inside)
        if not cand.size:
            return DraftTree.empty(), np.zeros(0)
        order = np.lexsort((cand, self.depth[cand], -self.score[cand]))[:budget]
        chosen = np.sort(cand[order])
        remap = np.full(self.tokens.size, -1, np.int64)
        remap[chosen] = np.arange(chosen.size)
        parents = self.parents[chosen]
        new_parents = np.where(parents == node, -1, remap[np.maximum(parents, 0)])
        if np.any(new_parents[parents != node] < 0):  # cannot happen: see the docstring
            raise DraftwiseError("internal: best candidates do not form a subtree")
        return DraftTree(self.tokens[chosen], new_parents), np.exp(self.logp[chosen])


    def _best_path(self, node: int, budget: int) -> tuple[DraftTree, np.ndarray]:
        path: list[int] = []
        while len(path) < budget:
            kids = np.flatnonzero(self.parents == node)
            if not kids.size:
                break
            node = int(kids[np.argmax(self.score[kids])])  # first of equals: creation order
            path.append(node)
        idx = np.asarray(path, np.int64)
        return DraftTree.chain(self.tokens[idx].tolist()), np.exp(self.logp[idx])


class CandidateCache:
    """The growing candidate tree and the draft model's cache state; see the module
    docstring. Not thread-safe: one thread owns it (CARD's worker publishes snapshots)."""

    def __init__(self, beam: int, topk: int, max_depth: int, max_nodes: int = 512) -> None:
        for name, val, lo in (("beam", beam, 1), ("topk", topk, 1), ("max_depth", max_depth, 1)):
            if val < lo:
                raise DraftwiseError(f"{name} must be >= {lo}, got {val}")
        self.beam, self.topk, self.max_depth, self.max_nodes = beam, topk, max_depth, max_nodes
        self.context: np.ndarray | None = None  # ends with the root; lm caches context[:-1]
        self._new_tree(0)
        self.hits = self.misses = 0

    def _new_tree(self, root: int) -> None:
        self.tokens, self.parents, self.depth = [root], [-1], [0]
        self.score, self.logp, self.slot = [0.0], [0.0], [-1]

    # ----- correction ---------------------------------------------------------------
    def sync(self, lm: DraftLM, context: np.ndarray) -> bool:
        """Bring the draft model's cache to ``context[:-1]`` and the tree's root to
        ``context[-1]``, keeping what descends from the new tokens. Returns whether the
        new root was found in the tree (a hit)."""
        context = np.asarray(context, np.int64).reshape(-1)
        if context.size == 0:
            raise DraftwiseError("cannot draft after an empty context")
        old = self.context
        if old is not None and lm.cache_len == old.size - 1 and context.size >= old.size \
                and np.array_equal(context[: old.size], old):
            chain = self._walk(context[old.size :].tolist())
            if len(chain) == context.size - old.size + 1:
                self._reroot(lm, chain)
                self.context = context.copy()
                self.hits += 1
                return True
            done = [n for n in chain if self.slot[n] >= 0]  # computed: an ancestor-closed prefix
            lm.keep(np.asarray([self.slot[n] for n in done], np.int64), len(done))
        else:
            cached = old[:-1] if old is not None else context[:0]
            lm.trim(min(_common_prefix(cached, context[:-1]), lm.cache_len))
        if context.size >= lm.context_limit:  # a draft with a shorter context: stop drafting
            lm.trim(0)
            self.context = None
            self._new_tree(0)
            return False
        if context.size - 1 > lm.cache_len:
            lm.prefill(context[lm.cache_len : -1])
        self.context = context.copy()
        self._new_tree(int(context[-1]))
        self.misses += old is not None
        return False

    def _walk(self, tokens: list[int]) -> list[int]:
        """Nodes from the root down along ``tokens``, as far as the tree has them."""
        chain, node = [0], 0
        parents, toks = np.asarray(self.parents), np.asarray(self.tokens)
        for tok in tokens:
            hits = np.flatnonzero((parents == node) & (toks == tok))
            if not hits.size:
                break
            node = int(hits[0])
            chain.append(node)
        return chain

    def _reroot(self, lm: DraftLM, chain: list[int]) -> None:
        """Commit ``chain[:-1]`` to the draft cache, keep the subtree of ``chain[-1]``."""
        v = chain[-1]
        keep = np.flatnonzero(subtree_mask(np.asarray(self.parents), v))  # topological
        kept_rows = [self.slot[n] for n in keep if self.slot[n] >= 0]
        slots = [self.slot[n] for n in chain[:-1]] + kept_rows
        lm.keep(np.asarray(slots, np.int64), len(chain) - 1)
        remap = {int(n): i for i, n in enumerate(keep)}
        d0, s0 = self.depth[v], self.score[v]
        new_slot, next_slot = [], 0
        for n in keep.tolist():
            if self.slot[n] >= 0:
                new_slot.append(next_slot)
                next_slot += 1
            else:
                new_slot.append(-1)
        self.tokens = [self.tokens[n] for n in keep]
        self.parents = [-1 if n == v else remap[self.parents[n]] for n in keep.tolist()]
        self.depth = [self.depth[n] - d0 for n in keep]
        self.score = [self.score[n] - s0 for n in keep]
        self.logp = [0.0 if n == v else self.logp[n] for n in keep.tolist()]
        self.slot = new_slot

    # ----- growth -------------------------------------------------------------------
    def frontier(self) -> list[int]:
        """Not yet computed nodes of the deepest layer that has any, best first."""
        open_ = [i for i, s in enumerate(self.slot) if s < 0]
        if not open_:
            return []
        deepest = max(self.depth[i] for i in open_)
        layer = [i for i in open_ if self.depth[i] == deepest]
        return sorted(layer, key=lambda i: (-self.score[i], i))

    def can_grow(self, lm: DraftLM, max_depth: int | None = None) -> bool:
        """Whether one more layer fits (depth, node and cache limits); ``max_depth``
        lowers the depth limit for this call (a sequential drafter with a small budget)."""
        front = self.frontier()
        depth = self.max_depth if max_depth is None else min(max_depth, self.max_depth)
        if not front or self.context is None or self.depth[front[0]] >= depth:
            return False
        rows = min(self.beam, len(front))
        if len(self.tokens) + rows * self.topk > self.max_nodes:
            return False
        return lm.cache_len + lm.scratch_len + rows <= lm.context_limit

    def grow(self, lm: DraftLM, max_depth: int | None = None) -> int:
        """One draft forward over the primary set; adds its K x k children. Returns the
        rows computed (0 when the tree cannot grow)."""
        if not self.can_grow(lm, max_depth):
            return 0
        primary = self.frontier()[: self.beam]
        s0, r = lm.scratch_len, len(primary)
        mask = np.zeros((r, s0 + r), bool)
        for i, node in enumerate(primary):
            p = self.parents[node]
            while p >= 0:  # ancestors were expanded before: they have slots
                mask[i, self.slot[p]] = True
                p = self.parents[p]
            mask[i, s0 + i] = True
        tokens = np.asarray([self.tokens[n] for n in primary], np.int64)
        depths = np.asarray([self.depth[n] for n in primary], np.int64)
        ids, logp = lm.expand(tokens, depths, mask, self.topk)  # (R, k) each
        for i, node in enumerate(primary):
            self.slot[node] = s0 + i
            for tok, lp in zip(ids[i].tolist(), logp[i].tolist(), strict=True):
                if not np.isfinite(lp):
                    continue
                self.tokens.append(int(tok))
                self.parents.append(node)
                self.depth.append(self.depth[node] + 1)
                self.score.append(self.score[node] + float(lp))
                self.logp.append(float(lp))
                self.slot.append(-1)
        return r

    # ----- reading ------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        ctx = self.context if self.context is not None else np.zeros(0, np.int64)
        return Snapshot(
            ctx,
            np.asarray(self.tokens, np.int64),
            np.asarray(self.parents, np.int64),
            np.asarray(self.depth, np.int64),
            np.asarray(self.score, np.float64),
            np.asarray(self.logp, np.float64),
        )

    def __len__(self) -> int:
        return len(self.tokens)
