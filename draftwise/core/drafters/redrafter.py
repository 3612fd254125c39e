"""ReDrafter (seed 001): a recurrent draft network conditioned on the target's last
hidden state drafts ``bw`` beams of ``t`` tokens; their shared prefixes are merged into
one tree that the target verifies in one forward.

The algorithm (beam search, dedup, budget) is here once; a backend supplies only the
tensor step behind ``RecurrentNet`` (``backends/cuda/redrafter/net.py``). The network needs
the target's hidden state of the last cached token: the backend keeps it after every
``prefill``/``commit``. When it is not there for the current cache (a backend used by
someone else in between), the drafter proposes nothing for that step: plain decoding.

Example::

    d = ReDrafter(net, bw=2, t=4)
    tree = d.propose(context, budget=16)   # the beams' distinct prefixes and the pruned ones
    d.last.packed, d.last.unpacked         # nodes verified vs tokens in the beams
    d.last_beam                            # (2, 4): the beams' width and length
"""

from __future__ import annotations

import hashlib
import math
from typing import Protocol, runtime_checkable

import numpy as np

from draftwise.core.beam import Beams, BeamTree, beam_search, chain_tree, dedup_beams
from draftwise.core.tree import DraftTree
from draftwise.errors import DraftwiseError

FINGERPRINT_ROWS = 1024


def embed_fingerprint(rows: np.ndarray, shape: tuple[int, int]) -> str:
    """A short hash of a target's embedding matrix of ``shape`` from its first
    ``FINGERPRINT_ROWS`` rows (float32, any backend), rounded to bfloat16 first so the
    same weights loaded in any dtype give one fingerprint.

    Example::

        >>> embed_fingerprint(np.zeros((2, 3), np.float32), (2, 3))[:8]
        '910238ea'
    """
    bits = np.ascontiguousarray(rows[:FINGERPRINT_ROWS], np.float32).view(np.uint32)
    # round to nearest even on the 16 dropped bits, as a float32 -> bfloat16 cast does
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(
        0xFFFF0000
    )
    h = hashlib.sha256(f"{tuple(shape)}".encode())
    h.update(rounded.astype(np.uint32).view(np.float32).tobytes())
    return h.hexdigest()[:32]


@runtime_checkable
class RecurrentNet(Protocol):
    """The tensor step of a ReDrafter network on the target's device."""

    # (K,) int64: target id of each draft-vocabulary column; a step may extend it in
    # ``start`` (by the context's other ids: ``context_vocab``), read after it
    vocab_ids: np.ndarray

    def start(self, cache_len: int, context: np.ndarray) -> bool:
        """Take the target's hidden state of the last cached token when the cache holds
        ``cache_len`` tokens (``context``: those tokens and the root, for a network that
        attends over them); False when the backend has none for that length."""

    def step(self, tokens: np.ndarray, parents: np.ndarray) -> np.ndarray:
        """(B,) target ids, (B,) rows of the previous step (-1: the initial state) ->
        (B, K) log-probabilities over the draft vocabulary."""

    # Optional: ``index(context)``, the context's entries and extra ids ahead of the first
    # ``start`` (what that ``start`` would add): ``begin`` calls it, so a text's first
    # proposal does not index the whole prompt.
    # Optional: ``chain(root, t, min_path=None) -> ((n,) target ids, (n,) log-probs)``, the
    # width-1 beam in one call (the compiled CPU step has it), ending early where a path
    # log-probability falls below ``min_path``'s next entry; ``ReDrafter`` takes it when
    # bw == 1.


class ReDrafter:
    """Beam search over a ``RecurrentNet``; see the module docstring."""

    states_probabilities = True  # its trees carry ``prob`` (``auto`` calibrates them)
    sized_by_planner = True  # as a member of ``auto``, bw and t are set each step

    def __init__(self, net: RecurrentNet, bw: int = 2, t: int = 4, pruned: bool = True) -> None:
        if bw < 1 or t < 1:
            raise DraftwiseError(f"redrafter needs bw >= 1 and t >= 1, got bw={bw}, t={t}")
        self.net, self.bw, self.t = net, bw, t
        self.pruned = pruned  # also the prefixes beam search pruned (``core.beam``)
        self.name = "redrafter"
        self.last: BeamTree | None = None  # the last proposal, with its draft probabilities
        self.last_beam: tuple[int, int] | None = None  # (bw, t) of the last proposal's beams
        # totals over the drafter's life (not cleared by ``reset``): proposals, tree nodes
        # vs beam tokens (seed 001 Figure 6 left)
        self.proposals = 0
        self.packed = 0
        self.unpacked = 0
        self.beam_rows = 0  # sum of bw over proposals (auto sizes it each step)
        self.beam_len = 0  # sum of t over proposals
        # at bw == 1: (t,) the least path probability worth verifying at each depth
        # (non-decreasing; ``auto`` sets it from the cost curve). The chain keeps the
        # tokens whose path probability reaches it and stops drafting where the next
        # token could not (its path is never more probable). None: all t tokens.
        self.min_path: np.ndarray | None = None

    def reset(self) -> None:
        self.last = None
        self.last_beam = None

    def stats(self) -> dict[str, int]:
        """Totals over every proposal: ``packed`` tree nodes for ``unpacked`` beam tokens;
        ``beam_rows`` / ``beam_len``: the sums of bw and t (mean = over ``proposals``)."""
        return {
            "proposals": self.proposals,
            "packed": self.packed,
            "unpacked": self.unpacked,
            "beam_rows": self.beam_rows,
            "beam_len": self.beam_len,
        }

    def begin(self, prompt: np.ndarray) -> None:
        # The prompt's context entries now, with the prefill, where the network keeps
        # them (``index``): else the first proposal builds them all, about ten steps'
        # drafting in one step.
        index = getattr(self.net, "index", None)
        if index is not None and prompt.size >= 2:
            index(prompt)

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        self.last, self.last_beam = None, None
        if budget < 1 or context.size < 2 or not self.net.start(int(context.size) - 1, context):
            return DraftTree.empty()
        ids = self.net.vocab_ids

        def step(tokens: np.ndarray, parents: np.ndarray) -> np.ndarray:
            # beam search sees draft-vocabulary columns; the network wants target ids
            return self.net.step(ids[tokens] if parents[0] >= 0 else tokens, parents)

        chain = getattr(self.net, "chain", None)
        floor = self._floor()  # (T,) log path floor, or None
        if self.bw == 1:
            if chain is not None:  # one beam: the network's own greedy loop
                tok, lp = chain(int(context[-1]), self.t, floor)  # (n <= T,) ids, log-probs
            else:
                one = beam_search(step, int(context[-1]), 1, self.t)
                tok, lp = ids[one.tokens[0]], one.logp[0]  # (T,), (T,)
            lp_l = lp.tolist()  # (n,) Python floats: n <= t is small
            if floor is not None:  # the tokens whose path reaches its depth's floor
                k, path = 0, 0.0  # the kept prefix
                for j, (v, f) in enumerate(zip(lp_l, floor.tolist())):
                    path += v
                    if path < f:
                        break
                    k = j + 1
                tok, lp, lp_l = tok[:k], lp[:k], lp_l[:k]
            if tok.size == 0:
                return DraftTree.empty()
            # the beam is the tree (``dedup_beams`` of one beam, in a few list operations)
            out = chain_tree(tok, lp_l, budget)
            if out is None:  # a positive log-probability (rounding): the general path
                none = np.zeros((0, 0), np.int64), np.zeros((0, 0))
                beams = Beams(tok[None], lp[None], lp.sum(keepdims=True), (none,) * (tok.size - 1))
                out = dedup_beams(beams, budget, pruned=self.pruned)
            return self._proposed(out)
        else:
            beams = beam_search(step, int(context[-1]), self.bw, self.t)
            beams = Beams(
                ids[beams.tokens],
                beams.logp,
                beams.score,
                tuple((ids[tk], lp) for tk, lp in beams.pruned),
            )
        return self._proposed(dedup_beams(beams, budget, pruned=self.pruned))

    def _proposed(self, out: BeamTree) -> DraftTree:
        """Record a proposal's tree and totals; returns the tree."""
        self.last, self.last_beam = out, (self.bw, self.t)
        self.proposals += 1
        self.beam_rows += self.bw
        self.beam_len += self.t
        self.packed += out.packed
        self.unpacked += out.unpacked
        return out.tree

    def _floor(self) -> np.ndarray | None:
        """(t,) ``log(min_path)`` at bw == 1, made non-decreasing; None without one."""
        if self.min_path is None or self.bw != 1:
            return None
        mp = [float(v) for v in np.ravel(self.min_path)]
        if np.shape(self.min_path) != (self.t,) or any(v != v for v in mp):  # v != v: NaN
            raise DraftwiseError(
                f"redrafter min_path needs {self.t} numbers, got shape {np.shape(self.min_path)}")
        # in Python floats (t is small; numpy's per-call cost, ~10 ops, was 0.08 ms a step)
        out, best = [], -math.inf
        for v in mp:
            v = min(max(v, 0.0), 1.0)
            lv = math.log(v) if v > 0.0 else -math.inf
            best = lv if lv > best else best
            out.append(best)
        return np.array(out)

    def update(self, context: np.ndarray, n_new: int) -> None:
        pass
