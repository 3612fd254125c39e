"""Auto-tuning: each step, verify the part of the draft tree that pays for itself.

Two models decide the tree:

- ``CostModel``: the measured latency of verifying ``r`` rows at context length ``c`` on
  this device (``draftwise tune`` measures it; ``cost(r, c)`` interpolates).
- ``AcceptanceModel``: for each drafter, depth and sibling rank, the probability that a
  node is accepted given that its parent was, as Beta-smoothed, slowly forgetting counts.
  A drafter that states its own probability of a node (``DraftTree.prob``: ReDrafter's
  beam probabilities) is binned by that probability instead of by rank
  (``PROB_EDGES``): the counts calibrate it online.

Given the drafters' full tree (every member's tree, merged without a cut, so that one
member's many shallow guesses cannot push out another's deep ones), a node's chance of
being accepted is the product of the conditional probabilities on its path. Taking nodes
best-first (a path never gains probability, so parents come before children), ``n``
nodes give ``1 + sum(p)`` expected tokens for ``cost(n + 1)`` time; ``choose_subtree``
keeps the ``n`` (up to the step's budget) that maximises their ratio, and ``n = 0``
(plain decoding) when no tree pays for itself.

Learning needs no verification: every proposed tree (pruned or not) is scored later
against the tokens the model actually emitted, so a drafter that is switched off keeps
being evaluated and comes back when it starts to guess well again.

Example: a flat cost curve keeps the whole tree, a steep one keeps nothing::

    >>> t = DraftTree.chain([1, 2, 3])
    >>> acc = AcceptanceModel(prior=(1.0, 1.0))         # p = 0.5 per node
    >>> flat = CostModel(rows=[1, 64], ms=[10.0, 10.0])
    >>> len(choose_subtree(t, acc, flat, context_len=100))
    3
    >>> steep = CostModel(rows=[1, 64], ms=[10.0, 640.0])
    >>> len(choose_subtree(t, acc, steep, context_len=100))
    0
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from draftwise.core.acceptance_model import (  # noqa: F401  (re-exported: the auto-tuning API)
    AUTO_PRIOR,
    PROB_EDGES,
    PROB_PRIOR,
    AcceptanceModel,
    matched,
    prob_bins,
)
from draftwise.core.costmodel import CostModel
from draftwise.core.drafters.base import Background, Drafter
from draftwise.core.drafters.compose import beams_of, load_members, save_members
from draftwise.core.solo_calibration import SoloCalibration
from draftwise.core.solo_sampling import SoloPays
from draftwise.core.step_rates import StepRates
from draftwise.core.tree import DraftTree, merge_trees, path_reduce
from draftwise.errors import DraftwiseError


def choose_subtree(
    tree: DraftTree,
    acc: AcceptanceModel,
    cost: CostModel,
    context_len: int,
    max_nodes: int | None = None,
    index: tuple[np.ndarray, ...] | None = None,
) -> DraftTree:
    """The best-first prefix of ``tree`` (at most ``max_nodes`` nodes) with the most
    expected tokens per ms (``index``: ``acc.index(tree)``, when already known)."""
    return plan_subtree(tree, acc, cost, context_len, max_nodes, index)[0]


def plan_subtree(
    tree: DraftTree,
    acc: AcceptanceModel,
    cost: CostModel,
    context_len: int,
    max_nodes: int | None = None,
    index: tuple[np.ndarray, ...] | None = None,
) -> tuple[DraftTree, float, float]:
    """``choose_subtree``'s tree with its expected tokens per step (the bonus token
    included) and its verify ms on ``cost``.

    Example::

        >>> acc = AcceptanceModel(prior=(1.0, 1.0))          # p = 0.5 per node
        >>> t, tokens, ms = plan_subtree(DraftTree.chain([1, 2]), acc,
        ...                              CostModel(rows=[1, 64], ms=[10.0, 10.0]), 100)
        >>> len(t), tokens, ms
        (2, 1.75, 10.0)
    """
    if len(tree) == 0 or max_nodes == 0:
        return DraftTree.empty(), 1.0, float(cost.cost_upto(1, context_len)[0])
    path_p = path_reduce(tree.parents, acc.node_probs(tree, index), np.multiply, tree.max_depth)
    order = (-path_p).argsort(kind="stable")  # best first, ties by index: parents first
    size = len(tree)
    limit = size if max_nodes is None else min(max_nodes, size)
    gain = np.empty(limit + 1)  # (n+1,) expected tokens per step with the n best nodes
    gain[0] = 0.0
    path_p[order[:limit]].cumsum(out=gain[1:])
    gain += 1.0
    ms = cost.cost_upto(limit + 1, context_len)  # (n+1,) verify time of n nodes
    n = int((gain / ms).argmax())
    chosen = tree.subset(order[:n]) if n else DraftTree.empty()
    return chosen, float(gain[n]), float(ms[n])


# a step whose drafting cannot pay skips it, but every EXPLORE_EVERY-th step still drafts
EXPLORE_EVERY = 8
# a member whose drafting costs at least this share of a plain step is gated: it drafts
# only while, by the planner's own account, the steps it drafts in give more tokens per
# ms (drafting included) than the same steps would without it (``AutoDrafter._gate``).
# 0.04 until 2026-11-29, when SSD (~0.12 ms a proposal) and the broad Cacheback (~0.09)
# sat under it on the 4bit default model (a plain step ~3.5 ms); gated, they drafted where
# the planner said they paid: 1.308x / 1.291x `none` against 1.290x / 1.278x ungated
# (greedy, 76 held-out corpus and copying prompts, two in-process runs, AMD EPYC Zen 4)
GATE_SHARE = 0.02
GATE_RATE = 0.1  # weight of a step's evidence in a gated member's running verdict
GATE_TIMES = 9  # a member's drafting ms: the median of its last proposals' times
PLAIN_EVERY = 4  # while the live cost curve lacks a timed plain step, one in this many is
# while the planner keeps small trees (fewer than SMALL_TREE nodes: a steep curve, where
# the prices of one and two rows decide) and the live curve lacks recent timings of a
# plain or a two-row verify, one drafting step in PLAIN_EVERY verifies no node, or the
# likeliest first node alone: a price the planner never picks is otherwise never learnt,
# and one learnt long ago is of another time (``CostModel.wants_rows``)
SMALL_TREE = 4
# ``solo`` drafting (``core.step_rates``): the precise member alone, one chain of at most
# SOLO_T tokens, tried where the curve is steep (verifying 4 rows costs SOLO_STEEP x one
# row or more: not on a GPU's flat curve). 1.2 before the 4bit kernel's int8 products
# made 4 rows 1.1-1.25x one row on the AMD EPYC Zen 5 VM: auto then merged every member
# on such text and drafted with the ReDrafter alone 5 steps in 425 (writing and coding,
# 2 Spec-Bench prompts each: 362 tok/s against `none`'s 385); at 1.05, 209-287 in
# 346-362 (394-430 against 385-421; `redrafter:bw=1,t=3` 412-457; two runs). A chain
# token is verified where its path probability (the member's own, calibrated on held-out
# corpus prompts: accepted 0.14-0.19 of the time at 0.1-0.3, 0.92-0.99 at 0.9-1.0) pays
# for its verify row and the chain step that drafted it at the solo way's measured
# tokens per ms (``AutoDrafter._solo_floor``); a chain step costs CHAIN_STEP x a plain
# step (0.10-0.13 ms against 2.6-2.9 on the AMD EPYC Zen 5 VM; 0.05-0.06 ms since the chain's
# vpdpbusd products and threaded context attention, where 0.025 measured the same as 0.04:
# 393-419 against 391-426 tok/s, 26 Spec-Bench prompts, three alternations)
SOLO_T = 3
# When sampling, the solo way drafts up to SAMPLED_T tokens: the first in any case (the
# way was chosen to draft: ``SoloPays``), the next where its path probability, read
# through this text's calibration, pays as in greedy chains; and in copy steps (the copy
# member has seen the text's last tokens) it verifies that member's span beside the
# chain, whatever ``SoloPays`` said. Alternating in one process, 26 seeded Spec-Bench
# first turns (T = 0.8, two and three passes, AMD EPYC Zen 5, 2026-11-30): 1.144x and
# 1.147x `none` against 1.114x and 1.113x with one token and no span (the span alone
# 1.131x; two tokens alone 1.142x and 1.121x, 1.132x); `redrafter:bw=1,t=1` 1.135x, 1.153x
SAMPLED_T = 2
SAMPLED_SPAN = True  # the copy steps' span when sampling (False: the chain alone, as before)
# When sampling, the curve's steepness, the drafting's share of a plain step (``SoloPays``)
# and what a second chain token must bring are re-read every SAMPLED_REREAD steps, and
# one verify in SAMPLED_OBSERVE corrects the curve: they move slowly, and each costs a
# few microseconds of Python right after a verify, when its caches are cold (auto's own
# work was ~0.06 ms a sampled step where drafting and verifying took ~3 ms, AMD EPYC Zen 5)
SAMPLED_REREAD = 8
SAMPLED_OBSERVE = 4
SOLO_STEEP = 1.05
CHAIN_STEP = 0.04
BURST = 3  # a full step that emitted this many tokens is followed by another full step
# A copy step's solo way verifies the copy member's span beside the chain: its most recent
# follower of the text's last tokens, at most this many nodes (one follower: FL tokens).
# Alternating in one process on the AMD EPYC Zen 5 VM (26 Spec-Bench first turns): 1.381x
# and 1.322x `none` against 1.335x and 1.323x with the chain alone in copy steps (two runs;
# MAT 1.91-1.92 against 1.87), the 20 copying prompts of ``scripts/corpus_copy_prompts.py``
# 1.747x against 1.723x; a first try, copy steps always taking this way, made as much as
# with the full way still tried there (1.343x each)
COPY_SPAN = 3


class AutoDrafter:
    """Combines drafters and verifies, each step, only the part of their tree that pays.

    ``max_budget`` bounds what the members propose; the verified tree is chosen by
    ``choose_subtree``. ``last_budget`` is the node count verified in the last step.
    """

    name = "auto"

    def __init__(
        self,
        members: Sequence[Drafter],
        cost: CostModel,
        max_budget: int = 64,
        sampling_cost: Callable[[], CostModel] | None = None,
        copy_member: int | None = None,
    ) -> None:
        """``cost``: the greedy path's curve; ``sampling_cost``: gives the curve measured
        with logits (asked for on the first generation at temperature > 0; ``None``:
        plan with ``cost`` on both paths); ``copy_member``: the index of a member that
        says whether the text's last tokens occurred before (``seen_before``: a copied
        span), which then picks the greedy way on a steep curve (``propose``); ``None``:
        whole steps' measured rates pick it (``StepRates``)."""
        if not members:
            raise DraftwiseError("the auto drafter needs at least one member drafter")
        if copy_member is not None and not (
            0 <= copy_member < len(members) and hasattr(members[copy_member], "seen_before")
        ):
            raise DraftwiseError(
                f"auto copy_member must index a member with seen_before (0..{len(members) - 1}), "
                f"got {copy_member!r}"
            )
        self._copy = copy_member
        # a copy member that can note the tokens it is not shown (``Cacheback.note_unseen``)
        # is kept behind like the others; another is shown every token before each check
        self._copy_notes = copy_member is not None and hasattr(members[copy_member], "note_unseen")
        self.members = list(members)
        self.greedy_cost = cost
        self.cost = cost  # the curve of the path in use (see plan_for)
        self._sampling_cost = sampling_cost
        self.max_budget = max_budget
        self._prob_sources = [
            i for i, m in enumerate(self.members) if getattr(m, "states_probabilities", False)
        ]
        self.acc = AcceptanceModel(n_sources=len(self.members), prob_sources=self._prob_sources)
        self.last_budget = 0
        self._p1 = 1.0  # the best first-node probability of the last proposal (optimistic)
        self._skipped = 0  # steps in a row that skipped drafting
        self.skipped_total = 0
        self._plain_turn = 0
        # beam members (ReDrafter): their width and length are sized each step from what
        # the cost-curve planner took of their last tree (``_size_beams``), up to the
        # member's own settings (kept here: the largest sizes)
        self._beams = {
            i: (int(m.bw), int(m.t))  # type: ignore[attr-defined]
            for i, m in enumerate(self.members)
            if getattr(m, "sized_by_planner", False)
        }
        # (full tree, root index, its acceptance cells) awaiting the tokens that judge it
        self._pending: deque[tuple[DraftTree, int, tuple[np.ndarray, ...]]] = deque()
        self._context: np.ndarray | None = None  # the last update's, for ``background``
        self._bg_members = [m for m in self.members if isinstance(m, Background)]
        # per member: running ms of its proposals, and (gated members) the running log
        # of (tokens/ms with it) / (tokens/ms without it) on the steps it drafted in,
        # and the steps since it last drafted
        n = len(self.members)
        self.member_ms: list[float | None] = [None] * n
        self._times: list[deque[float]] = [deque(maxlen=GATE_TIMES) for _ in range(n)]
        self._solo_ms: deque[float] = deque(maxlen=GATE_TIMES)  # sampling's one-token drafts
        self.member_edge: list[float | None] = [None] * n
        self._member_idle = [0] * n
        self.member_skipped = [0] * n  # proposals each member sat out (gated)
        # ``solo``: the first member that states its probabilities and is sized by the
        # planner (the ReDrafter) drafting alone. Greedy, on a steep curve: with a
        # ``copy_member``, taken where that member has not seen the text's last tokens
        # before, and where it has (a copied span, where the other members' long guesses
        # may pay) chosen against the full way by those steps' measured rates
        # (``_copy_rates`` below); without one, by measured tokens per ms of whole steps
        # (``core.step_rates``). Those rates chose the full way in a third of the steps of
        # held-out corpus prompts where it brought 1.51 tokens a step against solo's
        # 1.91 (noise of ~10 steps' running means picks the slower way; the warm-up and
        # exploring steps add to it); by the copy rule auto made 1.212x `none` against
        # 1.175x on those and copying prompts (AMD EPYC Zen 4, 2026-11-29;
        # ``docs/autotune.md``)
        self._sampling = False  # the decoder's path (plan_for): solo chains are greedy's
        self._solo = next((i for i in self._prob_sources if i in self._beams), None)
        # when sampling, ``plain`` (no draft at all) instead of ``full``. A drafted token is
        # then accepted with the target's probability of it (0.2-0.3 on Spec-Bench at
        # T = 0.8), so the full way's copied spans rarely go on, and on a steep curve it
        # paid for itself nowhere: seeded Spec-Bench, AMD EPYC Zen 5, `auto` 0.93x `none`
        # (full 0.89x, solo 0.95-0.99x on 13 prompts); with full, solo and plain timed,
        # 0.94-1.07x (0.99x on average), with solo and plain 0.98-1.12x (1.04x), three
        # alternations of 26 prompts, where `redrafter:bw=1,t=1` gave 1.02-1.15x (1.07x);
        # in `draftwise bench` (42 turns) 0.98x with three ways, 0.97x and 0.99x with two.
        # Choosing solo or plain from the model instead ((1 + solo's acceptance) / (two
        # rows + drafting) against one over one row) measured 0.97x against 1.00x.
        # (Where the curve is not steep, a GPU's, every step takes the full way.) On the
        # greedy path a third way, plain, gave 1.10x against 1.12x without it (AMD EPYC
        # Zen 3, `draftwise bench` 42 turns, one run each, 2026-11-27: summarization
        # 1.01x against 0.96x, coding 0.98x against 1.06x); not kept.
        # Those two ways compared by whole steps' tokens per ms (``StepRates``) drafted
        # in 40% of seeded Spec-Bench steps, 0.98-1.02x `none` where a fixed one-token
        # chain made 1.05-1.07x (AMD EPYC Zen 3, five runs), and by the medians of each
        # way's recent step times 0.99x against the chain's 1.05x (AMD EPYC Zen 4,
        # 2026-11-29, medians of 3 runs): when sampling, the choice is ``SoloPays``'s,
        # solo unless the drafts' running acceptance is below the drafting's share of a
        # plain step (``_draft_share``), where it cannot pay.
        self._greedy_rates: StepRates | None = None
        self.sampled: SoloPays | None = None
        if self._solo is not None:
            self._greedy_rates = StepRates(("full", "solo"), EXPLORE_EVERY)
            self.sampled = SoloPays(EXPLORE_EVERY)
        self.rates = self._greedy_rates
        # the two ways' whole steps timed in copy steps alone (where the copy member has
        # seen the text's last tokens): there the faster is taken, the other tried every
        # EXPLORE_EVERY-th such step. The full way always taken there lost to the solo
        # way on prose and even on copying tasks on the AMD EPYC Zen 5 VM (its 4-row
        # verify 1.13x one row; full steps 0.46-0.53 tokens per ms against solo's
        # 0.62-0.88), alternating in one process: corpus prompts 1.201x against 1.173x,
        # copying prompts 1.621x / 1.605x, Spec-Bench (42 turns) 1.280x / 1.241x. These
        # rates are kept from text to text (``StepRates.new_text``), solo tried first:
        # measured afresh in each text, each way's first steps there cost what a wrong
        # way costs (Spec-Bench, same VM: 1.199x / 1.279x against 1.190x / 1.254x)
        self._copy_rates = (StepRates(("solo", "full"), EXPLORE_EVERY)
                            if self._greedy_rates is not None else None)
        self._copy_step = False  # whether the last greedy step was a copy step
        # tokens each member has not been shown yet (``update``): while steps draft with
        # the solo member alone or not at all, the others catch up in one ``update``
        # when they next draft (or at ``begin`` or ``save``), from ``_context`` (the last
        # update's, which holds those tokens)
        self._behind = [0] * len(self.members)
        self.way = "full"  # the way of the last proposal
        self.solo_steps = 0
        self._step_start: float | None = None  # perf_counter at the last proposal
        self._emitted: int | None = None  # tokens the last step emitted (``update``)
        # the solo chains' floors read through how far the member's path probabilities
        # overstated its acceptance in this text (``core.solo_calibration``), and the
        # path probabilities of the last greedy solo chain, judged at ``update``
        self._solo_cal = SoloCalibration(SOLO_T)
        self._solo_paths: list[float] | None = None
        self._solo_chain: list[int] | None = None  # a copy step's chain, beside a span
        # when sampling: ``_sampled_reading``'s last reading and the calls since, and the
        # verifies seen (``observe_verify`` corrects the curve with one in SAMPLED_OBSERVE)
        self._reading: tuple[bool, float, list[float]] | None = None
        self._reading_age = 0
        self._observed = 0

    def observe_verify(self, rows: int, context_len: int, ms: float) -> None:
        """A verify's measured time corrects the curve in use (``CostModel.observe``);
        when sampling, one verify in ``SAMPLED_OBSERVE``."""
        if self._sampling:
            self._observed += 1
            if self._observed % SAMPLED_OBSERVE:
                return
        self.cost.observe(rows, context_len, ms)

    def plan_for(self, sampling: bool) -> None:
        """Plan with the cost curve of the verify path in use (called by the decoder)."""
        self._sampling = sampling
        self.rates = None if sampling else self._greedy_rates
        if not sampling or self._sampling_cost is None:
            self.cost = self.greedy_cost
        else:
            self.cost = self._sampling_cost()

    def reset(self) -> None:
        for m in self.members:
            m.reset()
        self._behind = [0] * len(self.members)
        if self.sampled is not None:
            self.sampled.reset()
        for i, (bw, t) in self._beams.items():  # a new text starts at the full settings
            self.members[i].bw, self.members[i].t = bw, t  # type: ignore[attr-defined]
        self.acc = AcceptanceModel(n_sources=len(self.members), prob_sources=self._prob_sources)
        self._pending.clear()
        self._context = None
        self._p1, self._skipped = 1.0, 0
        self._new_text()

    def _new_text(self) -> None:
        """Step timing and the solo chains' calibration start afresh (the time between two
        generations is no step; how overconfident the member is depends on the text)."""
        self._step_start, self._emitted = None, None
        self._solo_cal.reset()
        self._reading, self._reading_age, self._observed = None, 0, 0
        self._solo_paths = None
        self._solo_chain = None
        if self.rates is not None:
            self.rates.reset()
        if self._copy_rates is not None:  # kept: what each way costs on this machine
            self._copy_rates.new_text()
        self._copy_step = False

    def begin(self, prompt: np.ndarray) -> None:
        self._catch_up(self._context)  # the last text's tokens, before the new one
        self._pending.clear()
        self._context = None
        self._new_text()
        for m in self.members:
            m.begin(prompt)

    def _catch_up(self, context: np.ndarray | None) -> None:
        """Show each member the tokens it was not shown (``_behind``), the last of
        ``context``, in one ``update``."""
        if context is None:
            return
        for i, k in enumerate(self._behind):
            if k:
                self._show(i, context)

    def _show(self, i: int, context: np.ndarray) -> None:
        """Show member ``i`` the tokens it was not shown, the last of ``context``."""
        k, self._behind[i] = self._behind[i], 0
        self.members[i].update(context, k)

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        cap = min(budget, self.max_budget)
        if self.rates is not None:
            now = time.perf_counter()
            if (self._step_start is not None and self._emitted is not None
                    and self.way in self.rates.ways):  # (full when not steep: not timed)
                ms = (now - self._step_start) * 1e3
                self.rates.observe(self.way, self._emitted, ms)
                if self._copy_step and self._copy_rates is not None:
                    self._copy_rates.observe(self.way, self._emitted, ms)
            self._copy_step = False
            burst = self.way == "full" and (self._emitted or 0) >= BURST
            self._step_start, self._emitted = now, None
            # a copied span being accepted goes on (not a measured choice)
            steep = not burst and self._steep(context.size)
            if not steep:
                self.way = "full"
            elif self._copy is not None:  # every member where a span may be copied
                self._copy_step = self._copying(context)
                if not self._copy_step:
                    self.way = "solo"
                else:  # a span may be copied: the way faster in such steps
                    assert self._copy_rates is not None  # (made with the greedy rates)
                    self.way = self._copy_rates.choose()
            else:
                self.way = self.rates.choose()
        elif self._sampling and self.sampled is not None:
            steep, share, _ = self._sampled_reading(context.size)
            self.way = self.sampled.choose(share) if steep else "full"
            # where a span may be copied, the solo way with it (the span is accepted with
            # the target's probability of it: high where the text is copied)
            self._copy_step = (SAMPLED_SPAN and steep and self._copy is not None
                               and self._copying(context))
            if self._copy_step:
                self.way = "solo"
        if self.way == "solo" and cap > 0:
            tree = self._propose_solo(context, cap)
            return self._with_copy_span(context, tree, cap) if self._copy_step else tree
        if self.way == "plain":
            self.last_budget = 0
            return DraftTree.empty()
        self._catch_up(context)  # the members draft: show them every token first
        if cap <= 0:
            self.last_budget = 0
            return DraftTree.empty()
        # Nothing can pay: not even the likeliest first token (as priced in the last
        # proposal) makes a two-row verify worth its cost. Skip the members' drafting
        # then, but draft every EXPLORE_EVERY-th step so acceptance keeps being learnt.
        if self._skipped < EXPLORE_EVERY - 1 and not self._first_node_pays(context.size):
            self._skipped += 1
            self.skipped_total += 1
            self.last_budget = 0
            return DraftTree.empty()
        self._skipped = 0
        # the curve is being corrected live but a plain step was never timed: verify one
        # in PLAIN_EVERY steps until it has been (what a tree is weighed against)
        self._plain_turn = (self._plain_turn + 1) % PLAIN_EVERY
        small = self.last_budget < SMALL_TREE  # small trees: one- and two-row prices matter
        if self._plain_turn == 0 and (self.cost.wants_plain() or small and self.cost.wants_rows(1)):
            self.last_budget = 0
            return DraftTree.empty()
        # merged uncut: a breadth-first cut would let one member's shallow guesses push
        # out another's deep ones; the choice below keeps the best ``cap`` nodes instead
        c1 = self.cost.costs_to(1, context.size)[0]
        trees, ran = [], []
        for i, m in enumerate(self.members):
            if not self._runs(i, c1):
                trees.append(DraftTree.empty())
                continue
            t0 = time.perf_counter()
            trees.append(m.propose(context, cap))
            self._times[i].append((time.perf_counter() - t0) * 1e3)
            # a median: a text's first proposal may index the whole prompt (10x a step);
            # of at most GATE_TIMES floats, in Python (np.median of 9: ~40 us, warm)
            self.member_ms[i] = float(statistics.median(self._times[i]))
            ran.append(i)
        full = merge_trees(trees)
        index = self.acc.index(full)  # (source, depth, rank) cells: planning and scoring
        self._pending.append((full, context.size, index))
        first = full.depth == 1
        self._p1 = float(self.acc.node_probs(full, index)[first].max()) if first.any() else 0.0
        chosen, tokens, ms = plan_subtree(full, self.acc, self.cost, context.size, cap, index)
        self._judge(trees, ran, tokens, ms, context.size, cap, c1)
        if (self._plain_turn == 1 and small and len(chosen) != 1 and first.any()
                and self.cost.wants_rows(2)):
            # the likeliest first node alone: a two-row verify the curve can learn from
            probs = np.where(first, self.acc.node_probs(full, index), -1.0)  # (N,)
            chosen = full.subset(np.array([int(probs.argmax())]))
        self.last_budget = len(chosen)
        if self._beams:
            self._size_beams(chosen)
        return chosen

    def _copying(self, context: np.ndarray) -> bool:
        """Whether the copy member has seen the text's last tokens before (counting the
        tokens it was not shown yet, which ``update`` noted)."""
        i = self._copy
        assert i is not None
        if self._behind[i] and not self._copy_notes:
            self._show(i, context)
        # (else the tokens it was not shown were noted: ``update``)
        return bool(self.members[i].seen_before(context))  # type: ignore[attr-defined]

    def _with_copy_span(self, context: np.ndarray, chain: DraftTree, cap: int) -> DraftTree:
        """A copy step's solo tree: the chain and the copy member's span (its most recent
        follower of the text's last tokens, ``COPY_SPAN`` nodes at most) merged, the
        chain's nodes first within ``cap``. The member is shown the tokens it missed
        first; the chain's own tokens are kept for its calibration (``update``)."""
        i = self._copy
        assert i is not None
        if self._behind[i]:
            self._show(i, context)
        span = self.members[i].propose(context, min(COPY_SPAN, cap))
        if not len(span):
            return chain
        self._solo_chain = chain.tokens.tolist()
        merged = merge_trees([chain, span], budget=cap)
        assert merged.source is not None  # (merge_trees sets it: 0 chain, 1 span)
        members = np.array([self._solo, i], np.int16)
        self.last_budget = len(merged)
        return DraftTree._trusted(merged.tokens, merged.parents, members[merged.source],
                                  merged.depth, merged.prob, merged.max_depth)

    def _sampled_reading(self, context_len: int) -> tuple[bool, float, list[float]]:
        """When sampling: (``_steep``, ``_draft_share``, ``_solo_need`` for ``SAMPLED_T``
        tokens), read afresh every ``SAMPLED_REREAD`` calls and at a new text."""
        if self._reading is None or self._reading_age >= SAMPLED_REREAD:
            self._reading = (self._steep(context_len), self._draft_share(context_len),
                             self._solo_need(SAMPLED_T, context_len))
            self._reading_age = 0
        self._reading_age += 1
        return self._reading

    def _steep(self, context_len: int) -> bool:
        """Whether verifying 4 rows costs ``SOLO_STEEP`` x one row or more (``solo`` is
        worth trying)."""
        c = self.cost.costs_to(4, context_len)
        return c[3] >= SOLO_STEEP * c[0]

    def _propose_solo(self, context: np.ndarray, cap: int) -> DraftTree:
        """The ``solo`` way: the precise member alone drafts one beam of up to ``SOLO_T``
        tokens (``SAMPLED_T`` when sampling, the first kept in any case) and keeps those
        that pay (``_solo_floor``); its sizes for the full way are kept. No merging,
        planning or scoring."""
        i = self._solo
        assert i is not None
        m = self.members[i]
        sizes = m.bw, m.t  # type: ignore[attr-defined]
        # a member that can end its chain early; when sampling, up to SAMPLED_T tokens, the
        # first kept in any case (a drafted token is then accepted with the target's
        # probability of it, which the member's own overstates: the calibration learns by
        # how much in each text; with floors calibrated on greedy acceptance alone, chains
        # of SOLO_T made 0.94x none where one token made 0.99x, AMD EPYC Zen 5, 2026-11-26)
        floors = hasattr(m, "min_path")
        t = min(cap, (SAMPLED_T if self._sampling else SOLO_T) if floors else 1)
        m.bw, m.t = 1, t  # type: ignore[attr-defined]
        if floors:  # (t,) what each depth must bring, as floors on the member's own
            if self._sampling:  # (read every SAMPLED_REREAD steps, for SAMPLED_T tokens)
                reading = self._reading or self._sampled_reading(context.size)
                fl = self._solo_cal.floors(reading[2][:t])
                fl[0] = 0.0  # SoloPays chose to draft: the first token in any case
            else:
                fl = self._solo_cal.floors(self._solo_need(t, context.size))
            m.min_path = fl  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        try:
            tree = m.propose(context, t)
            if self._sampling:  # what a one-token draft costs (``_draft_share``)
                self._solo_ms.append((time.perf_counter() - t0) * 1e3)
        finally:
            m.bw, m.t = sizes  # type: ignore[attr-defined]
            if floors:
                m.min_path = None  # type: ignore[attr-defined]
        self.solo_steps += 1
        n = len(tree)
        self.last_budget = n
        if floors and n and tree.prob is not None:  # its path probabilities (a chain)
            paths, p = [], 1.0
            for q in tree.prob.tolist():
                p *= q
                paths.append(p)
            self._solo_paths = paths
        return DraftTree._trusted(tree.tokens, tree.parents, np.full(n, i, np.int16),
                                  tree.depth, tree.prob, tree.max_depth)

    def _draft_share(self, context_len: int) -> float:
        """The solo member's drafting of one token (the median of its recent ones) over
        a plain step's cost at ``context_len``: the least acceptance at which drafting
        can pay when sampling (``SoloPays``); 0.0 before it has drafted.

        Example: a one-token draft 0.45 ms, a plain step 3.5 ms: 0.129."""
        if not self._solo_ms:
            return 0.0
        c1 = float(self.cost.costs_to(1, context_len)[0])
        return float(statistics.median(self._solo_ms)) / c1 if c1 > 0 else 0.0

    def _solo_floor(self, t: int, context_len: int) -> np.ndarray:
        """``_solo_need`` as a (t,) array."""
        return np.array(self._solo_need(t, context_len))

    def _solo_need(self, t: int, context_len: int) -> list[float]:
        """(t,) the least path probability of a solo chain's token at each depth that
        pays: token j adds its verify row (``cost(j + 1) - cost(j)``) and, past the
        first, its chain step (``CHAIN_STEP`` x a plain step); it pays where the tokens
        it is expected to bring (its path probability) per ms added reach the solo
        way's tokens per ms (one per plain step before it was measured).

        Example: a plain step 2.8 ms, 2 rows 3.1, 3 rows 3.5; solo at 0.45 tokens/ms:
        depth 1 needs 0.3 x 0.45 = 0.135, depth 2 (0.4 + 0.112) x 0.45 = 0.23."""
        c = self.cost.costs_to(t + 1, context_len)  # ms at 1..t+1 rows
        rate = self.rates.speed("solo") if self.rates is not None else None
        rate = rate or 1.0 / c[0]
        floor, best = [], -math.inf  # in Python floats: t is small, this a per-step path
        for j in range(t):
            # the first token's drafting is paid before the chain could stop
            need = (c[j + 1] - c[j] + (CHAIN_STEP * c[0] if j else 0.0)) * rate
            best = need if need > best else best
            floor.append(best)
        return floor  # (t,) Python floats (``SoloCalibration.floors`` reads them)

    def _gated(self, i: int, c1: float) -> bool:
        """Whether member ``i``'s drafting is costly enough to be gated (``GATE_SHARE``
        of a plain step of ``c1`` ms; unknown until it has drafted once)."""
        ms = self.member_ms[i]
        return ms is not None and ms >= GATE_SHARE * c1

    def _runs(self, i: int, c1: float) -> bool:
        """Member ``i`` drafts this step: a cheap one always; a gated one while its
        verdict (``member_edge``) says it pays, and every ``EXPLORE_EVERY``-th step
        regardless, so the verdict follows the text."""
        edge = self.member_edge[i]
        if not self._gated(i, c1) or edge is None or edge > 0.0:
            self._member_idle[i] = 0
            return True
        self._member_idle[i] += 1
        if self._member_idle[i] >= EXPLORE_EVERY:
            self._member_idle[i] = 0
            return True
        self.member_skipped[i] += 1
        return False

    def _judge(
        self, trees: list[DraftTree], ran: list[int], tokens: float, ms: float,
        context_len: int, cap: int, c1: float,
    ) -> None:
        """Update each gated member's verdict that drafted this step: the planner's
        expected tokens per ms (its drafting and the verify) with the member's tree
        against the best plan of the others' trees alone (their drafting only)."""
        draft_ms = sum(self.member_ms[i] or 0.0 for i in ran)
        for i in ran:
            if not self._gated(i, c1):
                continue
            others = merge_trees([t for j, t in enumerate(trees) if j != i])
            _, tok_wo, ms_wo = plan_subtree(others, self.acc, self.cost, context_len, cap)
            own = self.member_ms[i] or 0.0
            with_i = tokens / (ms + draft_ms)
            without = tok_wo / (ms_wo + draft_ms - own)
            x = float(np.log(with_i / without))
            old = self.member_edge[i]
            self.member_edge[i] = x if old is None else old + GATE_RATE * (x - old)

    def _first_node_pays(self, context_len: int) -> bool:
        """One draft token accepted with the last proposal's best first-node probability
        ``p1`` pays when ``(1 + p1) / cost(2) > 1 / cost(1)``."""
        c1, c2 = self.cost.costs_to(2, context_len)
        return (1.0 + self._p1) * c1 > c2

    def _size_beams(self, chosen: DraftTree) -> None:
        """Next step's beam width and length of each beam member: one more than the
        widest level and the depth the planner kept of its nodes this step (at least 1,
        at most the member's settings), so drafting effort follows what the device's cost
        curve affords instead of always paying for ``bw x t`` beam tokens.

        Example: a member at bw=4, t=5 whose nodes the planner kept at depths 1, 1, 2
        drafts at bw=3, t=3 next."""
        for i, (bw_max, t_max) in self._beams.items():
            if chosen.source is None:  # no sources: none of its nodes can be told apart
                depth = np.zeros(0, np.int64)
            else:
                depth = chosen.depth[chosen.source == i]  # (kept nodes of member i,)
            used_t = int(depth.max()) if depth.size else 0
            used_bw = int(np.bincount(depth).max()) if depth.size else 0
            bw, t = min(bw_max, used_bw + 1), min(t_max, used_t + 1)
            self.members[i].bw, self.members[i].t = bw, t  # type: ignore[attr-defined]

    @property
    def last_beam(self) -> tuple[int, int] | None:
        """(rows, length) of the beams drafted for the last proposal (``beams_of``)."""
        return beams_of([self.members[i] for i in self._beams])

    @property
    def beam_sizes(self) -> dict[int, tuple[int, int]]:
        """(bw, t) each beam member drafts with next, by member index."""
        m = self.members
        return {i: (m[i].bw, m[i].t) for i in self._beams}  # type: ignore[attr-defined]

    def save(self, path: str | os.PathLike[str], tokenizer_id: str) -> None:
        """Save the members' learnt state (the acceptance model is cheap to relearn)."""
        self._catch_up(self._context)
        save_members(self.members, path, tokenizer_id)

    def load(self, path: str | os.PathLike[str], tokenizer_id: str) -> None:
        load_members(self.members, path, tokenizer_id)

    def update(self, context: np.ndarray, n_new: int) -> None:
        # a step that drafted with the solo member alone, or not at all: the others are
        # shown its tokens when they next draft (``_catch_up``; at temperature > 0 that
        # is the next text's ``begin``: ~0.1 ms a step saved, AMD EPYC Zen 3)
        lazy = self.way == "plain" or self.way == "solo"
        for i, m in enumerate(self.members):
            if lazy and i != self._solo:
                self._behind[i] += n_new
                if i == self._copy and self._copy_notes:
                    # the copy member answers ``seen_before`` for them all the same, at
                    # a few tuples a step where showing them costs ~10x (``_copying``)
                    m.note_unseen(context, n_new)
            else:  # the last k tokens of the context are new to it
                self._behind[i] += n_new
                self._show(i, context)
        paths, self._solo_paths = self._solo_paths, None
        chain, self._solo_chain = self._solo_chain, None
        if self._sampling and self.way == "solo" and self.sampled is not None and self.last_budget:
            # the chain's first token: kept when the step emitted it and a token after it
            # (beside a copy span: when the first token emitted is the chain's own)
            first = n_new >= 2 and (chain is None or (
                len(chain) > 0 and int(context[context.size - n_new]) == chain[0]))
            self.sampled.judged(1 if first else 0)
        if paths is not None and self.way == "solo":  # the chain's accepted prefix
            kept = n_new - 1
            if chain is not None:  # a copy span beside it: what the chain alone matched
                new = context[context.size - n_new :].tolist()
                kept = 0
                while kept < len(chain) and kept < n_new and chain[kept] == new[kept]:
                    kept += 1
            self._solo_cal.observe(paths, kept)
        self._emitted = n_new  # the step's tokens, for ``rates`` at the next proposal
        self._context = context  # scored by ``background``, while the next verify runs

    def background(self) -> None:
        """Score pending trees once every node's fate is known (or 8 steps later): the
        acceptance model's bookkeeping, which the decoder runs while the device
        computes the next verify (a step's delay only changes what is drafted)."""
        for m in self._bg_members:
            m.background()
        context = self._context
        if context is None:
            return
        while self._pending:
            tree, root_end, index = self._pending[0]
            known = context.size - root_end
            if known < tree.max_depth and len(self._pending) < 8:
                break
            self._pending.popleft()
            self.acc.observe(tree, context[root_end : root_end + tree.max_depth], index)
