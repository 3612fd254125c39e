"""scripts/replay_drafters.py: its oracle backend must reproduce decoding exactly, or the
tuning it supports would be fitted to a wrong simulation."""

import importlib.util
from pathlib import Path

import numpy as np

from draftwise.core.autotune import CostModel
from draftwise.core.decode import Decoder
from draftwise.drafting import make_drafter
from draftwise.core.drafters.base import NoDrafter
from draftwise.core.sampling import SamplingParams
from tests.fakes import FakeBackend


def _oracle_cls():
    path = Path(__file__).resolve().parents[1] / "scripts" / "replay_drafters.py"
    spec = importlib.util.spec_from_file_location("replay_drafters", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.OracleBackend


def test_oracle_replays_a_real_run_step_for_step():
    be = FakeBackend(vocab_size=6, sharpness=4.0)
    prompt = [1, 2, 3, 1, 2, 3, 1]
    plain = [t for s in Decoder(be).steps(prompt, NoDrafter(), SamplingParams(), 60) for t in s.tokens]
    real = list(Decoder(be).steps(prompt, make_drafter("cacheback"), SamplingParams(), 60))
    cost = CostModel(rows=[1, 64], ms=[10.0, 73.0])
    oracle = _oracle_cls()(6, 512, cost)
    oracle.seq = prompt + plain
    sim = list(Decoder(oracle).steps(prompt, make_drafter("cacheback"), SamplingParams(), 60))
    assert [s.tokens for s in sim] == [s.tokens for s in real]  # same steps, same accepts
    assert [s.drafted for s in sim] == [s.drafted for s in real]
    # each pass priced from the curve: cost(r rows) = 10 + (r - 1) ms
    assert np.isclose(oracle.verify_ms, sum(10.0 + s.drafted for s in real))
