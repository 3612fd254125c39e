"""Whether one drafted token pays when sampling: ``auto``'s choice at temperature > 0.

When sampling, ``auto`` drafts one token with its precise member (``solo``) or nothing
(``plain``). A drafted token is kept only where it is the very token the target samples,
so a solo step emits ``1 + a`` tokens on average, ``a`` its measured acceptance, and costs
a plain step, the drafting and a second verify row. Drafting is kept unless ``a`` is
below ``floor``, the drafting's time over a plain step's: there even a free second row
could not make it pay (``auto`` measures both, ``AutoDrafter._draft_share``). ``a`` is
credited with ``OPTIMISM`` standard errors of its estimate (``optimistic``): a step that
takes the plain way judges no draft, so a text whose first few drafts were rejected by
chance would stay plain, its acceptance measured only on the one step in
``explore_every`` that drafts.

Why not the whole steps' times of both ways, ``(1 + a) * ms_plain > ms_solo``, as this
class decided until 2026-11-29: near break-even (``a`` about 0.3 against a solo step
costing 1.2-1.3 plain ones, seeded Spec-Bench at T = 0.8) two medians of ~15 noisy steps
decide, the plain way was taken in ~20% of the steps where drafting paid, and each way
had to be timed in every text. Measured in one process on held-out corpus prompts
(``scripts/corpus_prompts.py --per 8``, methods rotating prompt by prompt, two passes,
AMD EPYC Zen 4; ``bench/results/specbench-4bit-zen4/session-m``): at T = 0.8, 56
prompts, `auto` by step times 0.964x / 1.004x `none`, by this floor 1.009x / 1.032x (a
fixed one-token chain 1.005x / 1.047x); where drafting loses (T = 1.5, 28 prompts: the
fixed chain 0.79x / 0.80x) 0.904x / 0.920x by step times, 0.939x / 0.940x by the floor.
The floor ignores the second row's price (a small difference of two noisy verify times:
a stored 4bit sampling curve read 5.42 / 5.42 ms at 1 / 2 rows at context 256), so
between it and the true break-even drafting goes on and loses a little.

``a`` is a running mean over judged drafts that starts from ``PRIOR`` (a mean and its
weight in drafts: the plain mean of the first ``1 / rate`` drafts with the prior's, then
weighted ``rate`` a draft), kept across texts until ``reset``.

Example::

    >>> s = SoloPays(explore_every=4)
    >>> s.choose(floor=0.15)             # the prior: 0.3 (credited 0.76) >= 0.15
    'solo'
    >>> for _ in range(60):
    ...     s.judged(accepted=0)         # never accepted: a ~ 0.02
    >>> [s.choose(floor=0.15) for _ in range(4)]   # plain; solo still tried 1 in 4
    ['plain', 'plain', 'plain', 'solo']
    >>> s.choose(floor=0.0)              # drafting costs nothing: it never loses
    'solo'
"""

from __future__ import annotations

import math

RATE = 0.02  # the weight of a judged draft in the running acceptance (about the last 50)
# the acceptance before any draft was judged, and its weight in drafts: the shipped
# ReDrafter's one-token drafts were accepted 0.26-0.29 of the time in seeded Spec-Bench
# at T = 0.8 (the first token's overlap with the target's distribution, 0.39 there,
# bounds it). Without a prior a text's first draft, rejected 70% of the time, read a = 0.
PRIOR = (0.3, 4)
# standard errors the acceptance is credited with when deciding (``optimistic``)
OPTIMISM = 2.0


class SoloPays:
    """Acceptance of one-token drafts; ``choose`` says whether the next step drafts
    (``"solo"``) or not (``"plain"``)."""

    def __init__(
        self, explore_every: int = 8, rate: float = RATE, prior: tuple[float, int] = PRIOR
    ) -> None:
        if explore_every < 2 or not 0.0 < rate <= 1.0 or not 0.0 <= prior[0] <= 1.0 or prior[1] < 0:
            raise ValueError(
                f"SoloPays needs explore_every >= 2, 0 < rate <= 1 and a prior in [0, 1] with "
                f"a weight >= 0, got {explore_every}, {rate}, {prior}"
            )
        self.explore_every, self.rate, self.prior = explore_every, rate, prior
        self.reset()

    def reset(self) -> None:
        """Forget every judged draft: the acceptance returns to the prior."""
        # running mean of accepted drafts (None: no prior and nothing judged yet)
        self.acceptance: float | None = self.prior[0] if self.prior[1] else None
        self.steps = 0  # drafts judged
        self._plain = 0  # plain choices in a row (every explore_every-th drafts)

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

    def pays(self, floor: float) -> bool:
        """Whether drafting may pay: the acceptance (``optimistic``) reaches ``floor``, the
        drafting's time over a plain step's (True while nothing is known of it)."""
        a = self.optimistic()
        return a is None or a >= floor

    def choose(self, floor: float) -> str:
        """The next step's way: ``"solo"`` where drafting may pay (``pays``), else
        ``"plain"``, except every ``explore_every``-th step in a row, which drafts (its
        draft is judged: the acceptance stays measured)."""
        if not floor >= 0.0:  # (NaN too)
            raise ValueError(f"SoloPays needs a floor >= 0, got {floor}")
        if self.pays(floor):
            self._plain = 0
            return "solo"
        self._plain += 1
        if self._plain % self.explore_every == 0:
            return "solo"
        return "plain"
