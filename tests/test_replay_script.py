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


def test_a_device_check_curve_or_one_of_its_variants_is_read(tmp_path):
    import json

    import pytest

    path = Path(__file__).resolve().parents[1] / "scripts" / "replay_drafters.py"
    spec = importlib.util.spec_from_file_location("replay_drafters", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    check = tmp_path / "device_check.json"
    check.write_text(json.dumps({"curves": {"llama-3.1-8b": {
        "rows": [1, 16, 64], "graph_ms": [6.2, 6.4, 6.5],
        "variants": {"16-row tiles": {"graph_ms": [5.7, 5.8, 14.2]}, "broken": {"error": "x"},
                     "chunks": {"rows": [1, 64], "graph_ms": [6.0, 6.3]}}}}}))
    assert mod.read_curve(f"{check}:llama-3.1-8b").ms.tolist() == [[6.2, 6.4, 6.5]]
    assert mod.read_curve(f"{check}:llama-3.1-8b:16-row tiles").ms.tolist() == [[5.7, 5.8, 14.2]]
    chunks = mod.read_curve(f"{check}:llama-3.1-8b:chunks")  # timed at its own row counts
    assert chunks.rows.tolist() == [1, 64] and chunks.ms.tolist() == [[6.0, 6.3]]
    for bad, says in ((f"{check}:llama-3.1-8b:broken", "no variant 'broken'"),
                      (f"{check}:tiny", "no graph curve for 'tiny'"),
                      (f"{tmp_path}/none.json:tiny", "with an existing file")):
        with pytest.raises(SystemExit, match=says):
            mod.read_curve(bad)
