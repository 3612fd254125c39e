"""Which way of drafting gives more tokens per ms now, from whole measured steps.

``auto`` can draft two ways: ``full`` (every member, merged, the cost-curve planner
choosing the subtree) and ``solo`` (its most precise member alone, one short chain, no
merging or planning). On a steep cost curve (a CPU, where a second verify row costs
7-17% of a step) the planner's bookkeeping and the cheap members' shallow guesses can
cost more than they bring on ordinary prose, while on repetitive text (extraction,
roleplay) the full tree's long copied spans win by far. ``StepRates`` measures both on
the text at hand: tokens emitted per wall ms of a whole step (drafting, verify and all
bookkeeping included), as running sums per way, and takes the better one, trying the
other every ``explore_every``-th step.

What is drafted changes; what is emitted never does (the target verifies every token).

Example::

    >>> r = StepRates(("full", "solo"), explore_every=4, min_steps=1, warmup=0)
    >>> r.choose()                              # each is tried first
    'full'
    >>> r.observe("full", tokens=1.2, ms=4.0)
    >>> r.choose()
    'solo'
    >>> r.observe("solo", tokens=1.5, ms=3.5)
    >>> [r.choose() for _ in range(4)]          # solo is faster; full tried 1 in 4
    ['solo', 'full', 'solo', 'solo']
"""

from __future__ import annotations

from collections.abc import Sequence

RATE = 0.1  # the weight of a step in a way's running sums (about the last 10 count)
WARMUP = 1  # a way's first steps of a text, not counted (``StepRates.observe``)


class StepRates:
    """Running tokens and ms per way of drafting; ``choose`` picks the next step's."""

    def __init__(
        self, ways: Sequence[str], explore_every: int = 8, min_steps: int = 3, rate: float = RATE,
        warmup: int = WARMUP,
    ) -> None:
        if len(ways) < 1 or len(set(ways)) != len(ways):
            raise ValueError(f"StepRates needs distinct ways, got {list(ways)}")
        if explore_every < 2 or min_steps < 1 or not 0.0 < rate <= 1.0 or warmup < 0:
            raise ValueError(
                f"StepRates needs explore_every >= 2, min_steps >= 1, 0 < rate <= 1, "
                f"warmup >= 0, got {explore_every}, {min_steps}, {rate}, {warmup}"
            )
        self.ways = tuple(ways)
        self.explore_every, self.min_steps, self.rate = explore_every, min_steps, rate
        self.warmup = warmup
        self.reset()

    def reset(self) -> None:
        """Forget every measurement (a new text)."""
        self.tokens = dict.fromkeys(self.ways, 0.0)  # running sums, weighted
        self.ms = dict.fromkeys(self.ways, 0.0)
        self.steps = dict.fromkeys(self.ways, 0)  # steps measured, per way
        self.new_text()

    def new_text(self) -> None:
        """A new text on the same machine: the rates are kept (what each way costs here
        carries over), each way's first steps of the text are again not counted."""
        self.warm = dict.fromkeys(self.ways, 0)  # warm-up steps seen, per way
        self._turn = 0

    def speed(self, way: str) -> float | None:
        """Tokens per ms of ``way`` lately; None before it was measured."""
        ms = self.ms[way]
        return self.tokens[way] / ms if self.steps[way] and ms > 0 else None

    def observe(self, way: str, tokens: float, ms: float) -> None:
        """A step drafted ``way`` emitted ``tokens`` in ``ms`` (the whole step). A way's
        first ``warmup`` steps of a text are not counted: a drafter's first proposal of
        a text indexes the whole prompt (10x a step or more), which says nothing of the
        steps after it."""
        if not ms > 0 or tokens < 0:
            return
        if self.warm[way] < self.warmup:
            self.warm[way] += 1
            return
        # the n-th step weighs 1 / n until that falls below ``rate``: the plain mean of
        # a way's first 1 / rate steps, then running sums. (A first step kept at weight
        # 1 and each later one at ``rate`` let one step decide for ten: a one-token
        # chain's first step rejected, its rate read 0.139 tokens/ms against plain's
        # 0.158 where it made 0.176 on average, and being tried one step in
        # EXPLORE_EVERY, it stayed below for most of a text.)
        w = max(self.rate, 1.0 / (self.steps[way] + 1))
        self.tokens[way] += w * (tokens - self.tokens[way])
        self.ms[way] += w * (ms - self.ms[way])
        self.steps[way] += 1

    def choose(self) -> str:
        """The way for the next step: while some way has fewer than ``min_steps``
        measured steps, the least measured (first listed on a tie); else the fastest,
        and every ``explore_every``-th step the runner-up."""
        self._turn += 1
        fewest = min(self.ways, key=lambda w: self.steps[w])
        if self.steps[fewest] < self.min_steps:
            return fewest
        ranked = sorted(self.ways, key=lambda w: -(self.speed(w) or 0.0))
        if len(ranked) > 1 and self._turn % self.explore_every == 0:
            return ranked[1]
        return ranked[0]
