"""Multi-draft recursive rejection sampling (SpecInfer / SpecTr style), to compare with
the sample-and-match acceptance every drafter uses (``core.acceptance``).

Words: the *target* distribution ``p`` and the *draft* distribution ``q`` are over the
vocabulary at one tree position; ``k`` *drafts* ``x_1..x_k`` are i.i.d. samples of ``q``.
Draft ``i`` is *accepted* with probability ``min(1, p(x_i) / q(x_i))``; on a rejection
``p`` becomes the *residual* ``norm(max(p - q, 0))`` and the next draft is tried; when all
are rejected the emitted token is sampled from the last residual. Each round is one
speculative-sampling step of ``(p, q)``, so by induction the emitted token is an exact
sample of ``p``.

Sample-and-match instead samples the target's token first (one uniform) and descends
when a child carries it, so its acceptance at a node is ``p(children)``: with the draft's
top-k tokens as children that is the target mass on them. ``expected_acceptance`` gives
both numbers for one position, so the two can be measured on real distributions
(``scripts/multidraft_compare.py``).

Example::

    >>> p = np.array([0.5, 0.3, 0.2]); q = np.array([0.2, 0.6, 0.2])
    >>> recursive_rejection(p, q, [1], np.array([0.4, 0.0]))  # 0.4 < p/q = 0.5: accepted
    (0, 1)
    >>> recursive_rejection(p, q, [1], np.array([0.9, 0.0]))  # rejected: residual [1, 0, 0]
    (-1, 0)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from draftwise.core.sampling import sample


def recursive_rejection(
    p: np.ndarray, q: np.ndarray, drafts: Sequence[int], u: np.ndarray
) -> tuple[int, int]:
    """Returns (index of the accepted draft or -1, emitted token). ``p``, ``q`` (V,)
    distributions; ``drafts`` i.i.d. samples of ``q``; ``u`` (k + 1,) uniforms in [0, 1):
    one per draft, the last one samples the residual."""
    residual = np.asarray(p, np.float64)
    q = np.asarray(q, np.float64)
    for i, x in enumerate(drafts):
        if q[x] > 0 and u[i] * q[x] < residual[x]:  # u < p(x) / q(x)
            return i, int(x)
        left = np.maximum(residual - q, 0.0)
        total = left.sum()
        # p == q on the support: a rejection is then impossible, but keep it well defined
        residual = left / total if total > 0 else residual
    return -1, sample(residual, float(u[len(drafts)]))


def expected_acceptance(
    p: np.ndarray, q: np.ndarray, k: int, rng: np.random.Generator, trials: int = 2000
) -> tuple[float, float]:
    """(sample-and-match with the top-k tokens of ``q`` as children: the target mass on
    them, exact; recursive rejection with ``k`` i.i.d. drafts of ``q``: Monte Carlo)."""
    p = np.asarray(p, np.float64)
    q = np.asarray(q, np.float64)
    top = np.argpartition(-q, k - 1)[:k]
    match = float(p[top].sum())
    cdf = np.cumsum(q)
    hits = 0
    for _ in range(trials):
        drafts = np.minimum(np.searchsorted(cdf, rng.random(k) * cdf[-1], side="right"), q.size - 1)
        hits += recursive_rejection(p, q, drafts.tolist(), rng.random(k + 1))[0] >= 0
    return match, hits / trials
