"""StepRates: the faster way of drafting from whole measured steps; a way's first step of
a text (a drafter indexing the prompt) is not counted."""

from __future__ import annotations

import pytest

from draftwise.core.step_rates import StepRates


def test_each_way_is_tried_then_the_faster_kept_and_the_other_explored() -> None:
    r = StepRates(("full", "solo"), explore_every=4, min_steps=1, warmup=0)
    assert r.choose() == "full"  # the least measured first
    r.observe("full", tokens=1.2, ms=4.0)
    assert r.choose() == "solo"
    r.observe("solo", tokens=1.5, ms=3.5)
    assert [r.choose() for _ in range(4)] == ["solo", "full", "solo", "solo"]
    assert r.speed("solo") == pytest.approx(1.5 / 3.5)


def test_a_ways_first_steps_of_a_text_are_not_counted() -> None:
    """The first solo step took 40 ms (the drafter indexed the prompt): not counted, so
    solo is tried again and then measured faster; after ``reset`` (a new text) the first
    step is dropped again."""
    r = StepRates(("full", "solo"), explore_every=8, min_steps=1, warmup=1)
    r.observe("full", tokens=1.0, ms=3.0)  # warm-up: dropped
    r.observe("solo", tokens=1.0, ms=40.0)  # warm-up: dropped
    assert r.steps == {"full": 0, "solo": 0} and r.speed("solo") is None
    r.observe("full", tokens=1.0, ms=3.0)
    r.observe("solo", tokens=2.0, ms=3.5)
    assert r.steps == {"full": 1, "solo": 1} and r.choose() == "solo"
    r.reset()
    r.observe("solo", tokens=1.0, ms=40.0)
    assert r.steps["solo"] == 0


def test_a_new_text_keeps_the_rates_and_drops_its_first_steps_again() -> None:
    """``new_text``: the measured rates carry over (the faster way is chosen at once), and
    each way's first step of the new text is again a warm-up, not counted."""
    r = StepRates(("solo", "full"), explore_every=8, min_steps=1, warmup=1)
    for way, tokens in (("solo", 1.0), ("full", 1.0), ("solo", 1.0), ("full", 3.0)):
        r.observe(way, tokens=tokens, ms=3.0)  # the first of each: warm-up
    assert r.choose() == "full"
    r.new_text()
    assert r.choose() == "full" and r.steps == {"solo": 1, "full": 1}
    r.observe("full", tokens=1.0, ms=40.0)  # the new text's first full step: dropped
    assert r.steps["full"] == 1 and r.speed("full") == pytest.approx(1.0)


@pytest.mark.parametrize(
    "kwargs", [{"explore_every": 1}, {"min_steps": 0}, {"rate": 0.0}, {"warmup": -1}]
)
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="StepRates needs"):
        StepRates(("full", "solo"), **kwargs)  # type: ignore[arg-type]


def test_ways_must_be_distinct() -> None:
    with pytest.raises(ValueError, match="distinct ways"):
        StepRates(("full", "full"))
