"""scripts/solo_floor_replay.py: its replay must price a cut chain as the decoder pays for
it, and its online calibration must learn what the tokens' acceptance says, or the
conclusion drawn from it (calibrated floors change little) is unfounded."""

import numpy as np
import pytest

from tests.scripts import load_script

COSTS = np.array([3.0, 3.2, 3.6, 4.0, 4.4])  # verify ms at 1..5 rows


def _mod():
    return load_script("solo_floor_replay")


def test_a_fixed_chain_is_priced_as_drafting_plus_its_verify():
    """Two steps: all four tokens accepted, then none. A fixed 3-token chain emits 4 + 1
    tokens in 2 x (0.3 + 2 x 0.1 + 4.0) ms (4 rows); plain decoding 1 token in 3.0 ms."""
    s = np.array([[0.9, 0.8, 0.7, 0.6, 4, 0], [0.9, 0.8, 0.7, 0.6, 0, 0]])
    got = _mod().replay(s, COSTS, 3, "fixed", 0.0, draft_ms=0.3, token_ms=0.1)
    assert got == pytest.approx(5 / (2 * (0.3 + 0.2 + 4.0)) * 3.0)


def test_raw_floors_cut_the_chain_where_the_path_probability_falls_below_them():
    """Floors at 0.4 tokens/ms: (3.2 - 3.0) x 0.4 = 0.08 at depth 1, (0.4 + 0.12) x 0.4 =
    0.208 at depth 2: a chain 0.9, 0.1, ... keeps one token (and drafted two)."""
    s = np.array([[0.9, 0.1, 0.05, 0.01, 4, 0]])
    got = _mod().replay(s, COSTS, 3, "raw", 0.4, draft_ms=0.3, token_ms=0.1)
    assert got == pytest.approx(2 / (0.3 + 0.1 + 3.2) * 3.0)


def test_the_online_calibration_raises_the_floor_of_overconfident_tokens():
    cal = _mod().OnlineCalibration(w=2.0)
    need = np.array([0.2, 0.2, 0.2, 0.2])
    assert cal.raw_floor(need)[0] <= 0.2  # the prior: the network's word
    for _ in range(200):  # tokens given 0.45-0.5 are never accepted; 0.95 always
        cal.observe(np.array([0.47]), 0)
        cal.observe(np.array([0.95]), 1)
    assert 0.5 <= cal.raw_floor(need)[0] <= 0.9  # the pooled bins below 0.5 fall short
