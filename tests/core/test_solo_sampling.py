"""SoloPays: one drafted token is kept unless its measured acceptance is below the
drafting's share of a plain step (where it cannot pay)."""

from __future__ import annotations

import pytest

from draftwise.core.solo_sampling import SoloPays


def test_drafting_goes_on_until_its_acceptance_cannot_pay_for_the_drafting() -> None:
    s = SoloPays(prior=(0.0, 0))
    assert s.pays(0.5)  # nothing known: try
    for x in [1, 0, 0, 0] * 12:  # a = 0.25 over 48 drafts, credited with 2 standard errors
        s.judged(x)
    assert s.acceptance == pytest.approx(0.25) and s.optimistic() == pytest.approx(0.375)
    assert s.pays(0.3) and s.choose(0.3) == "solo"  # 0.375 >= 0.3
    assert not s.pays(0.4) and s.choose(0.4) == "plain"
    assert s.pays(0.0)  # a draft that costs nothing never loses


def test_acceptance_is_a_plain_mean_first_then_a_running_one() -> None:
    """The first 1 / rate judged drafts weigh alike (one early rejection does not decide
    for fifty); later ones weigh ``rate`` each, so the mean follows the text."""
    s = SoloPays(rate=0.1, prior=(0.0, 0))
    for x in [0] + [1] * 9:
        s.judged(x)
    assert s.acceptance == pytest.approx(0.9)
    for _ in range(40):
        s.judged(0)
    assert s.acceptance == pytest.approx(0.9 * 0.9**40)


def test_the_prior_counts_as_drafts_of_its_mean() -> None:
    """A prior (0.3, 4): five early rejections leave a = 1.2 / 9, credited with its
    uncertainty (two standard errors of a mean of 9: 0.36, so drafting goes on at a
    floor of 0.15: a text is not sent the plain way, where no draft is judged, by a few
    early rejections); thirty-five give 1.2 / 39 (0.086 credited: plain); ``reset``
    returns to the prior."""
    s = SoloPays(prior=(0.3, 4))
    assert s.acceptance == 0.3 and s.pays(0.15)
    for _ in range(5):
        s.judged(0)
    assert s.acceptance == pytest.approx(1.2 / 9)
    assert s.optimistic() == pytest.approx(0.36, abs=0.01) and s.pays(0.15)
    for _ in range(30):
        s.judged(0)
    assert s.acceptance == pytest.approx(1.2 / 39)
    assert s.optimistic() == pytest.approx(0.086, abs=0.001) and not s.pays(0.15)
    s.reset()
    assert s.acceptance == 0.3 and s.steps == 0


def test_plain_steps_still_draft_one_in_explore_every() -> None:
    """Where drafting cannot pay, every ``explore_every``-th step in a row drafts (its
    draft is judged: a text that turns predictable is noticed); an accepted draft there
    can bring drafting back."""
    s = SoloPays(explore_every=4, prior=(0.0, 0))
    s.judged(0)  # a = 0
    assert [s.choose(0.1) for _ in range(8)] == ["plain", "plain", "plain", "solo"] * 2
    for _ in range(3):
        s.judged(1)  # a = 0.75
    assert s.choose(0.1) == "solo"


@pytest.mark.parametrize(
    "kwargs",
    [{"explore_every": 1}, {"rate": 0.0}, {"rate": 1.5}, {"prior": (1.5, 4)}, {"prior": (0.3, -1)}],
)
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="SoloPays needs"):
        SoloPays(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("floor", [-0.1, float("nan")])
def test_a_bad_floor_is_refused(floor: float) -> None:
    with pytest.raises(ValueError, match="SoloPays needs a floor"):
        SoloPays().choose(floor)
