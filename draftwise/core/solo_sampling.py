"""Whether one drafted token pays when sampling: ``auto``'s choice at temperature > 0.

When sampling, ``auto`` drafts one token with its precise member (``solo``) or nothing
(``plain``). A drafted token is kept only where it is the very token the target samples,
so a solo step emits ``1 + a`` tokens on average, ``a`` its measured acceptance. With
``ms_solo`` and ``ms_plain`` the recent whole steps' times of each way (drafting, verify
and bookkeeping), drafting pays when

    (1 + a) * ms_plain > ms_solo.

``a`` is credited with ``OPTIMISM`` standard errors of its estimate (``optimistic``): a
step that takes the plain way judges no draft, so a text whose first few drafts were
rejected by chance would stay plain, its acceptance measured only on the one step in
``explore_every`` that drafts. Counted on 26 seeded Spec-Bench texts (T = 0.8, AMD EPYC
Zen 4): the plain way took 44% of the steps, in texts whose drafts, where taken, were
accepted 0.28 of the time (a solo step cost 1.2-1.3 plain ones there: drafting paid);
with the credit 16% (warm-up and exploration mostly), tokens a step 1.13-1.19 -> 1.23-1.25,
and `auto` 0.986 -> 1.009x and 1.001 -> 1.047x `none` in two in-process runs (a fixed
one-token chain: 1.018x and 1.099x).

``a`` is a running mean over judged drafts that starts from ``PRIOR`` (a mean and its
weight in steps: the plain mean of the first ``1 / rate`` steps with the prior's, then
weighted ``rate`` a step), kept across texts until ``reset``; the times are the medians of
each way's last ``WINDOW`` steps of the text (a way's first step of a text not counted:
a drafter may index the prompt then). Each way is timed ``MIN_STEPS`` times first, and
one step in ``explore_every`` takes the other way, so both stay measured.

Why not the whole steps' tokens per ms of both ways, as the greedy path does
(``StepRates``): a solo step emits 1 or 2 tokens, and a running rate over ~10 such steps
is noise (+-15%) against an edge of 5-10%; taken that way ``auto`` drafted in 40% of
the steps of seeded Spec-Bench and made 0.98-1.02x ``none`` where a fixed one-token chain
made 1.05-1.07x (AMD EPYC Zen 3, five ``draftwise bench`` runs over two sessions), though
the acceptance it met (0.26-0.29 a draft) paid for drafting there. And not the cost
curve's price of a second row: at 1 and 2 rows it is a small difference of two noisy
measurements (a stored 4bit sampling curve here read 5.42 / 5.42 ms at context 256 and
5.38 / 6.56 at 1,024, where live verifies differ by 0.5-0.8 ms at both).

Example::

    >>> s = SoloPays(explore_every=4, min_steps=1)
    >>> s.choose()                       # each way is timed first
    'solo'
    >>> s.timed("solo", 7.0); s.timed("solo", 7.0)     # (a way's first step: not counted)
    >>> s.choose()
    'plain'
    >>> s.timed("plain", 6.0); s.timed("plain", 6.0)
    >>> s.acceptance, s.pays()           # the prior: 1.3 x 6.0 > 7.0
    (0.3, True)
    >>> for _ in range(60):
    ...     s.judged(accepted=0)         # never accepted: a ~ 0.02
    >>> [s.choose() for _ in range(4)]   # plain; solo still tried 1 in 4
    ['plain', 'solo', 'plain', 'plain']
"""

from __future__ import annotations

import math
import statistics
from collections import deque

WAYS = ("solo", "plain")
RATE = 0.02  # the weight of a judged draft in the running acceptance (about the last 50)
# the acceptance before any draft was judged, and its weight in drafts: the shipped
# ReDrafter's one-token drafts were accepted 0.26-0.29 of the time in seeded Spec-Bench
# at T = 0.8 (the first token's overlap with the target's distribution, 0.39 there,
# bounds it). Without a prior a text's first draft, rejected 70% of the time, read a = 0.
PRIOR = (0.3, 4)
# standard errors the acceptance is credited with when deciding (``optimistic``)
OPTIMISM = 2.0
WINDOW = 15  # a way's step times: the median of its last this many in the text
MIN_STEPS = 3  # each way's steps timed before the comparison decides
WARMUP = 1  # a way's first steps of a text, not timed


class SoloPays:
    """Acceptance of one-token drafts and each way's recent step times; ``choose`` says
    whether the next step drafts (``"solo"``) or not (``"plain"``)."""

    def __init__(
        self,
        explore_every: int = 8,
        rate: float = RATE,
        prior: tuple[float, int] = PRIOR,
        min_steps: int = MIN_STEPS,
    ) -> None:
        if (explore_every < 2 or not 0.0 < rate <= 1.0 or not 0.0 <= prior[0] <= 1.0
                or prior[1] < 0 or min_steps < 1):
            raise ValueError(
                f"SoloPays needs explore_every >= 2, 0 < rate <= 1, a prior in [0, 1] with a "
                f"weight >= 0 and min_steps >= 1, got {explore_every}, {rate}, {prior}, {min_steps}"
            )
        self.explore_every, self.rate, self.prior = explore_every, rate, prior
        self.min_steps = min_steps
        self.reset()

    def reset(self) -> None:
        """Forget every measurement: the acceptance returns to the prior."""
        # running mean of accepted drafts (None: no prior and nothing judged yet)
        self.acceptance: float | None = self.prior[0] if self.prior[1] else None
        self.steps = 0  # drafts judged
        self.new_text()

    def new_text(self) -> None:
        """Forget the step times (a new text: another context length, another prompt)."""
        self._ms: dict[str, deque[float]] = {w: deque(maxlen=WINDOW) for w in WAYS}
        self._warm = dict.fromkeys(WAYS, 0)
        self._turn = 0

    def timed(self, way: str, ms: float) -> None:
        """A whole step of ``way`` took ``ms``."""
        if way not in self._ms or not ms > 0:
            return
        if self._warm[way] < WARMUP:
            self._warm[way] += 1
            return
        self._ms[way].append(ms)

    def step_ms(self, way: str) -> float | None:
        """The median of ``way``'s recent step times; None before any."""
        t = self._ms[way]
        return float(statistics.median(t)) if t else None

    def judged(self, accepted: int) -> None:
        """A drafted token was accepted (1) or not (0)."""
        x = 1.0 if accepted > 0 else 0.0
        self.steps += 1
        w = max(self.rate, 1.0 / (self.steps + self.prior[1]))
        a = self.acceptance if self.acceptance is not None else x
        self.acceptance = a + w * (x - a)

    def optimistic(self) -> float | None:
        """The acceptance plus ``OPTIMISM`` standard errors of a mean of the drafts it
        weighs (the judged ones and the prior's, at most ``1 / rate``: older ones are
        forgotten); None while nothing is known.

        Example::

            >>> s = SoloPays(prior=(0.3, 4))
            >>> round(s.optimistic(), 3)       # 0.3 + 2 * sqrt(0.3 * 0.7 / 4)
            0.758
        """
        a = self.acceptance
        if a is None:
            return None
        n = max(1.0, min(self.steps + self.prior[1], 1.0 / self.rate))
        return a + OPTIMISM * math.sqrt(a * (1.0 - a) / n)

    def pays(self) -> bool:
        """Whether ``1 + acceptance`` (``optimistic``) tokens in a solo step's time beat
        one token in a plain step's (True while either is untimed or nothing is known of
        acceptance)."""
        solo, plain, a = self.step_ms("solo"), self.step_ms("plain"), self.optimistic()
        return solo is None or plain is None or a is None or (1.0 + a) * plain > solo

    def choose(self) -> str:
        """The next step's way: while a way has fewer than ``min_steps`` timed steps,
        that one (solo first); else ``"solo"`` where drafting pays, ``"plain"`` where it
        does not, and every ``explore_every``-th step the other."""
        self._turn += 1
        for w in WAYS:
            if len(self._ms[w]) < self.min_steps:
                return w
        best, other = WAYS if self.pays() else WAYS[::-1]
        return other if self._turn % self.explore_every == 0 else best
