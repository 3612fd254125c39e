"""``auto`` sizing of draft-model trees from both cost curves (``core.draftplan``), with
synthetic curves: the plan equals a brute-force search over explicitly grown trees, moves
the right way when either curve or the acceptance changes, learns from what was
emitted, and drives the sequential and CARD drafters losslessly."""

from __future__ import annotations

import numpy as np
import pytest

from draftwise.core.costmodel import CostModel
from draftwise.core.drafters.base import NoDrafter
from draftwise.core.drafters.card import CardDrafter
from draftwise.core.drafters.draft_model import DraftModelDrafter
from draftwise.core.draftplan import DraftPlanner, plan_draft
from draftwise.core.tree import DraftTree
from draftwise.errors import DraftwiseError
from tests.core.test_draft_drafters import GREEDY, HOT, run, similar_draft


def linear(base: float, per_row: float) -> CostModel:
    return CostModel(rows=[1, 128], ms=[base, base + 127 * per_row])


def brute_force(verify, draft, p, beam, topk, max_depth, max_budget, parallel):  # type: ignore[no-untyped-def]
    """Grow each depth's tree node by node (explicit parent links), then try every
    budget: the best (tokens per ms, depth, budget)."""
    best = (1.0 / float(verify.cost(1, 256)), 0, 0)
    for depth in range(1, max_depth + 1):
        nodes: list[float] = []  # path probabilities of all nodes
        frontier = [1.0]  # the root
        draft_ms = 0.0
        for d in range(depth):
            draft_ms += float(draft.cost(len(frontier), 256))
            row = p[min(d, p.shape[0] - 1)]
            kids = [pp * row[min(j, row.size - 1)] for pp in frontier for j in range(topk)]
            nodes += kids
            frontier = sorted(kids, reverse=True)[:beam]
        ranked = sorted(nodes, reverse=True)
        for n in range(1, min(max_budget, len(ranked)) + 1):
            tokens = 1.0 + sum(ranked[:n])
            ver = float(verify.cost(n + 1, 256))
            ms = max(ver, draft_ms) if parallel else ver + draft_ms
            if tokens / ms > best[0] + 1e-12:
                best = (tokens / ms, depth, n)
    return best


@pytest.mark.parametrize("beam,topk,parallel", [(1, 1, False), (3, 2, False), (2, 3, True)])
def test_plan_equals_brute_force_over_grown_trees(beam, topk, parallel):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(beam * 10 + topk)
    for _ in range(6):
        p = np.sort(rng.uniform(0.05, 0.95, (5, 4)), axis=1)[:, ::-1]  # rank 0 likeliest
        verify = linear(rng.uniform(20, 60), rng.uniform(0.1, 3.0))
        draft = linear(rng.uniform(0.5, 15), rng.uniform(0.01, 1.0))
        plan = plan_draft(verify, draft, p, beam, topk, 5, 12, 256, parallel)
        rate, depth, budget = brute_force(verify, draft, p, beam, topk, 5, 12, parallel)
        assert (plan.depth, plan.budget) == (depth, budget)
        assert plan.rate == pytest.approx(rate)


def test_plan_follows_both_curves_and_the_acceptance():
    verify = linear(50.0, 1.0)
    good = np.full((8, 4), 0.8)
    cheap, costly = linear(2.0, 0.1), linear(30.0, 1.0)
    deep = plan_draft(verify, cheap, good, 2, 2, 8, 32)
    shallow = plan_draft(verify, costly, good, 2, 2, 8, 32)
    assert deep.depth > shallow.depth >= 1
    assert plan_draft(verify, costly, np.full((8, 4), 0.05), 2, 2, 8, 32).depth == 0  # plain
    # parallel: drafting overlaps the verify, so a step costs less than draft + verify
    par = plan_draft(verify, costly, good, 2, 2, 8, 32, parallel=True)
    assert par.rate > shallow.rate and par.ms < shallow.ms and par.depth >= 1
    # a steep verify curve verifies fewer nodes of the same tree
    steep = plan_draft(linear(50.0, 20.0), cheap, good, 2, 2, 8, 32)
    assert steep.budget < deep.budget
    assert plan_draft(verify, cheap, good, 2, 2, 8, 0).depth == 0  # no budget: plain


def test_plan_refuses_bad_inputs():
    with pytest.raises(DraftwiseError, match="probabilities"):
        plan_draft(linear(1, 1), linear(1, 1), np.full((2, 2), 1.5), 1, 1, 2, 4)
    with pytest.raises(DraftwiseError, match="beam=0"):
        plan_draft(linear(1, 1), linear(1, 1), np.full((2, 2), 0.5), 0, 1, 2, 4)


def test_planner_learns_acceptance_and_probes_when_plain():
    verify, draft = linear(50.0, 1.0), linear(10.0, 0.5)
    planner = DraftPlanner(verify, draft, beam=1, topk=1, max_depth=4, probe_every=3)
    plans = [planner.plan(100, 8) for _ in range(3)]
    assert [p.depth for p in plans[:2]] == [0, 0]  # the prior (p = 0.2) does not pay
    assert plans[2].probe and plans[2].depth == 4  # the third plain plan is a probe
    assert planner.counts["probes"] == 1 and planner.counts["plain_plans"] == 2
    context = np.arange(300, dtype=np.int64)
    for end in range(100, 160, 4):  # a chain that is always right
        planner.record(DraftTree.chain(context[end : end + 4].tolist()), end)
        planner.update(context[: end + 8])
    learnt = planner.plan(160, 8)
    assert learnt.depth >= 3 and not learnt.probe
    assert planner.acc.hits[0, 0, 0] / planner.acc.tries[0, 0, 0] > 0.9


@pytest.mark.parametrize("parallel", [False, True])
def test_planned_drafters_stay_lossless_and_respect_the_budget(parallel):  # type: ignore[no-untyped-def]
    verify, draft = linear(20.0, 0.2), linear(1.0, 0.05)  # a cheap draft: plans draft
    planner = DraftPlanner(verify, draft, beam=2, topk=2, max_depth=4, parallel=parallel)
    if parallel:
        drafter: object = CardDrafter(similar_draft(), beam=2, topk=2, depth=4, planner=planner)
    else:
        drafter = DraftModelDrafter(similar_draft(), beam=2, topk=2, depth=4, planner=planner)
    try:
        for params, seed in ((GREEDY, None), (HOT, 7)):
            plain, _, _ = run(NoDrafter(), params, seed=seed)
            out, steps, _ = run(drafter, params, seed=seed, delay=0.002 if parallel else 0.0)
            assert out == plain
            assert all(s.drafted <= 8 for s in steps)
            drafted = sum(s.drafted > 0 for s in steps)  # the plan drafts (CARD: when the
            assert drafted >= (1 if parallel else len(steps) // 2)  # worker is in time)
        assert planner.plan(100, 8).depth >= 1  # learnt: the draft is mostly right
        stats = drafter.stats()  # type: ignore[attr-defined]
        assert stats["plans"] >= stats["plain_plans"] + 1 and stats["planned_depth"] > 0
    finally:
        if parallel:
            drafter.close()  # type: ignore[attr-defined]


def test_brute_force_helper_sees_every_budget():
    # the reference itself: with free verification every node pays, so the whole tree
    free = CostModel(rows=[1, 128], ms=[1.0, 1.0])
    rate, depth, budget = brute_force(free, CostModel([1, 128], [1e-9, 1e-9]),
                                      np.full((3, 2), 0.5), 2, 2, 3, 100, False)
    assert (depth, budget) == (3, 2 + 4 + 4)


def test_plain_plans_leave_the_draft_model_idle():
    """When no draft pays, the sequential drafter runs no draft forward and no prefill."""
    planner = DraftPlanner(linear(20.0, 1.0), linear(400.0, 10.0), beam=2, topk=2,
                           max_depth=4, probe_every=10_000)
    lm = similar_draft()
    drafter = DraftModelDrafter(lm, beam=2, topk=2, depth=4, planner=planner)
    plain, _, _ = run(NoDrafter(), GREEDY)
    out, steps, _ = run(drafter, GREEDY)
    assert out == plain and not any(s.drafted for s in steps)
    assert lm.forwards == 0 and lm.cache_len == 0
    assert drafter.stats()["plain_plans"] == drafter.stats()["plans"] > 0
