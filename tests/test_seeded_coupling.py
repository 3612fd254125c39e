"""scripts/seeded_coupling.py: its agreement rates must be the chances it names, or the
conclusion drawn from them (a shared uniform does not beat argmax drafting) is unfounded."""

import numpy as np
import pytest

from draftwise.core.sampling import sample
from tests.scripts import load_script


def _agreement():
    return load_script("seeded_coupling").agreement


def test_a_perfect_drafter_agrees_at_every_uniform():
    p = np.random.default_rng(0).dirichlet(np.full(50, 0.3))
    r = _agreement()(p, p.copy())
    assert r["id order"] == pytest.approx(1.0) and r["sorted"] == pytest.approx(1.0)
    assert r["argmax"] == r["best"] == p.max()


def test_the_id_order_rate_is_what_the_sampler_and_a_drafter_inverting_q_do():
    """Monte Carlo over the engine's own sampler (``core.sampling.sample``, id order)."""
    rng = np.random.default_rng(1)
    p, q = rng.dirichlet(np.full(12, 0.5)), rng.dirichlet(np.full(12, 0.5))
    us = rng.random(40_000)
    same = np.mean([sample(p, u) == sample(q, u) for u in us])
    assert _agreement()(p, q)["id order"] == pytest.approx(same, abs=0.01)


def test_the_sorted_rate_inverts_each_side_in_its_own_descending_order():
    rng = np.random.default_rng(2)
    p, q = rng.dirichlet(np.full(9, 0.5)), rng.dirichlet(np.full(9, 0.5))
    op, oq = np.argsort(-p, kind="stable"), np.argsort(-q, kind="stable")
    us = rng.random(40_000)
    same = np.mean([op[sample(p[op], u)] == oq[sample(q[oq], u)] for u in us])
    assert _agreement()(p, q)["sorted"] == pytest.approx(same, abs=0.01)


def test_mismatched_shapes_are_refused():
    with pytest.raises(ValueError, match="alike"):
        _agreement()(np.ones(3) / 3, np.ones(4) / 4)


def test_the_gumbel_rate_is_the_chance_both_sides_pick_the_same_token_at_one_noise():
    """Gumbel-max sampling: each side emits argmax(log dist + g) for one shared noise
    vector g; the rate is how often the two agree (Monte Carlo here, on fresh noise)."""
    rng = np.random.default_rng(4)
    p, q = rng.dirichlet(np.full(10, 0.5)), rng.dirichlet(np.full(10, 0.5))
    g = rng.gumbel(size=(40_000, 10))
    same = np.mean(np.argmax(np.log(p) + g, 1) == np.argmax(np.log(q) + g, 1))
    assert _agreement()(p, q, draws=40_000)["gumbel"] == pytest.approx(same, abs=0.01)


def test_no_coupling_beats_the_overlap_and_argmax_may():
    """Every rule that emits a sample of q agrees with p's sample at most sum min(p, q)
    of the time (the maximal coupling); argmax drafting does not sample q and can pass it."""
    rng = np.random.default_rng(5)
    for _ in range(20):
        p, q = rng.dirichlet(np.full(8, 0.4)), rng.dirichlet(np.full(8, 0.4))
        r = _agreement()(p, q, draws=20_000)
        for k in ("id order", "sorted"):
            assert r[k] <= r["overlap"] + 1e-12, (k, r)
        assert r["gumbel"] <= r["overlap"] + 0.02, r  # Monte Carlo error
    r = _agreement()(np.array([0.9, 0.05, 0.05]), np.array([0.34, 0.33, 0.33]))
    assert r["argmax"] == pytest.approx(0.9) and r["overlap"] == pytest.approx(0.44)
