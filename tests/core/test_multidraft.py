"""Multi-draft recursive rejection sampling is exact (chi-square, with a power check), and
its acceptance against sample-and-match's on a worked case."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from draftwise.core.multidraft import expected_acceptance, recursive_rejection


def dist(rng: np.random.Generator, v: int, sharp: float) -> np.ndarray:
    x = np.exp(rng.standard_normal(v) * sharp)
    return x / x.sum()


def emitted(p, q, k, n, rng, rule=recursive_rejection):  # type: ignore[no-untyped-def]
    cdf = np.cumsum(q)
    out = np.empty(n, np.int64)
    for i in range(n):
        drafts = np.minimum(np.searchsorted(cdf, rng.random(k), side="right"), q.size - 1)
        out[i] = rule(p, q, drafts.tolist(), rng.random(k + 1))[1]
    return out


def chi2_p(samples: np.ndarray, p: np.ndarray) -> float:
    obs = np.bincount(samples, minlength=p.size)
    exp = p * samples.size
    keep = exp >= 5
    return float(stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue)


@pytest.mark.parametrize("k, seed", [(1, 0), (2, 1), (4, 2), (4, 3)])
def test_recursive_rejection_emits_the_target_distribution(k, seed):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    p, q = dist(rng, 6, 1.2), dist(rng, 6, 1.2)
    out = emitted(p, q, k, 6000, rng)
    assert chi2_p(out, p) > 0.01


def test_chi_square_has_power():
    """The same check rejects a rule that is slightly off: accepting a draft without the
    residual update (the classic bug) on the same distributions."""
    rng = np.random.default_rng(1)
    p, q = dist(rng, 6, 1.2), dist(rng, 6, 1.2)

    def no_residual(p, q, drafts, u):  # type: ignore[no-untyped-def]
        for i, x in enumerate(drafts):
            if u[i] * q[x] < p[x]:
                return i, int(x)
        cdf = np.cumsum(p)
        return -1, int(np.searchsorted(cdf, u[-1], side="right"))

    out = emitted(p, q, 2, 6000, rng, no_residual)
    assert chi2_p(out, p) < 0.01


def test_expected_acceptance_worked_case():
    p = np.array([0.5, 0.3, 0.2])
    q = p.copy()  # a perfect draft: recursive rejection always accepts the first draft
    match, rrs = expected_acceptance(p, q, 1, np.random.default_rng(0), trials=500)
    assert match == pytest.approx(0.5) and rrs == 1.0
    match2, _ = expected_acceptance(p, q, 2, np.random.default_rng(0), trials=10)
    assert match2 == pytest.approx(0.8)
