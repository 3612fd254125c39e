"""``SoloCalibration``: the solo chains' floors read through how far the member's path
probabilities overstated (or understated) its acceptance in the current text."""

from __future__ import annotations

import pytest

from draftwise.core.solo_calibration import SoloCalibration


def test_a_fresh_calibration_keeps_the_floors_as_asked():
    cal = SoloCalibration(depths=3)
    assert cal.floors([0.1, 0.3, 0.2]) == [0.1, 0.3, 0.3]  # non-decreasing
    assert cal.floors([0.5, 2.0]) == [0.5, 1.0]  # capped at 1


def test_an_overconfident_member_is_asked_for_more_and_an_underconfident_one_for_less():
    cal = SoloCalibration(depths=2)
    for _ in range(20):
        cal.observe([0.8, 0.6], accepted=1)  # the first always right, the second never
    said, got = 1 + 20 * 0.8, 1 + 20
    first = cal.floors([0.3, 0.05])
    assert first[0] == pytest.approx(0.3 * said / got) and first[0] < 0.3  # said 0.8, got 1
    assert first[1] == pytest.approx(0.05 * (1 + 20 * 0.6) / 1)  # said 0.6, got 0: higher


def test_depths_past_the_calibrated_ones_take_the_last_ratio_and_reset_forgets():
    cal = SoloCalibration(depths=1)
    for _ in range(9):
        cal.observe([0.5, 0.4], accepted=0)  # the second path is past the depths: ignored
    ratio = (1 + 9 * 0.5) / 1
    assert cal.floors([0.1, 0.12]) == pytest.approx([0.1 * ratio, 0.12 * ratio])
    cal.reset()
    assert cal.floors([0.1, 0.12]) == [0.1, 0.12]


def test_it_needs_a_depth():
    with pytest.raises(ValueError, match="depths >= 1, got 0"):
        SoloCalibration(depths=0)
