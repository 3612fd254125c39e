"""SoloPays: one drafted token pays where 1 + its measured acceptance tokens in a solo
step's time beat one token in a plain step's."""

from __future__ import annotations

import pytest

from draftwise.core.solo_sampling import SoloPays


def _timed(s: SoloPays, solo: float, plain: float, n: int = 4) -> None:
    for _ in range(n):  # (each way's first step of a text is not timed)
        s.timed("solo", solo)
        s.timed("plain", plain)


def test_drafting_pays_where_its_tokens_per_step_time_beat_plain_steps() -> None:
    s = SoloPays(prior=(0.0, 0))
    assert s.pays()  # nothing known: try
    _timed(s, solo=7.0, plain=6.0)
    for x in [1, 0, 0, 0] * 12:  # a = 0.25 over 48 drafts, credited with 2 standard errors
        s.judged(x)
    assert s.acceptance == pytest.approx(0.25) and s.optimistic() == pytest.approx(0.375)
    assert s.pays()  # 1.375 x 6.0 > 7.0
    _timed(s, solo=9.0, plain=6.0, n=8)  # the median of the last WINDOW: 9.0 > 8.25
    assert s.step_ms("solo") == 9.0 and not s.pays()


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
    uncertainty (two standard errors of a mean of 9: 0.36, so drafting goes on: a text
    is not sent the plain way, where no draft is judged, by a few early rejections);
    thirty-five give 1.2 / 39 (0.086 credited: 1.09 x 6.0 < 7.0, plain); ``reset``
    returns to the prior."""
    s = SoloPays(prior=(0.3, 4))
    _timed(s, solo=7.0, plain=6.0)
    assert s.acceptance == 0.3 and s.pays()
    for _ in range(5):
        s.judged(0)
    assert s.acceptance == pytest.approx(1.2 / 9)
    assert s.optimistic() == pytest.approx(0.36, abs=0.01) and s.pays()
    for _ in range(30):
        s.judged(0)
    assert s.acceptance == pytest.approx(1.2 / 39)
    assert s.optimistic() == pytest.approx(0.086, abs=0.001) and not s.pays()
    s.reset()
    assert s.acceptance == 0.3 and s.steps == 0 and s.step_ms("solo") is None


def test_each_way_is_timed_first_then_the_other_explored_one_step_in_n() -> None:
    """Solo, then plain, until each has ``min_steps`` timed steps (a way's first step of
    a text not counted); then the better way, and every ``explore_every``-th step the
    other. ``new_text`` forgets the step times and keeps the acceptance."""
    s = SoloPays(explore_every=4, min_steps=2, prior=(0.0, 0))
    ways = []
    for _ in range(6):
        w = s.choose()
        ways.append(w)
        s.timed(w, 7.0 if w == "solo" else 6.0)
    assert ways == ["solo"] * 3 + ["plain"] * 3
    s.judged(0)  # a = 0: plain pays
    assert [s.choose() for _ in range(8)] == ["plain", "solo", "plain", "plain"] * 2
    s.new_text()
    assert s.acceptance == 0.0 and s.step_ms("plain") is None and s.choose() == "solo"


@pytest.mark.parametrize(
    "kwargs",
    [{"explore_every": 1}, {"rate": 0.0}, {"rate": 1.5}, {"prior": (1.5, 4)}, {"prior": (0.3, -1)},
     {"min_steps": 0}],
)
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="SoloPays needs"):
        SoloPays(**kwargs)  # type: ignore[arg-type]
