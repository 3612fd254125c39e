"""scripts/replay_drafters.py: its oracle backend must reproduce decoding exactly, or the
tuning it supports would be fitted to a wrong simulation."""

import numpy as np

from draftwise.core.autotune import CostModel
from draftwise.core.decode import Decoder
from draftwise.drafting import make_drafter
from draftwise.core.drafters.base import NoDrafter
from draftwise.core.sampling import SamplingParams
from tests.fakes import FakeBackend
from tests.scripts import load_script


def _oracle_cls():
    return load_script("replay_drafters").OracleBackend


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

    mod = load_script("replay_drafters")
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


def test_bookkeeping_runs_inside_the_verify_and_hides_under_it_only_on_a_device_curve():
    """With a GPU's curve (``overlap``) the oracle runs the decoder's ``while_waiting``
    inside each verify, as the CUDA backend does, and takes up to the verify's priced
    ms of it off the critical path (``hidden_ms``); without, it runs after the verify
    and nothing is hidden. The tokens are the same either way."""
    import time

    from draftwise.core.drafters.cacheback import Cacheback

    be = FakeBackend(vocab_size=6, sharpness=4.0)
    prompt = [1, 2, 3, 1, 2, 3, 1]
    plain = [t for s in Decoder(be).steps(prompt, NoDrafter(), SamplingParams(), 40) for t in s.tokens]
    outs, hidden = [], []
    for overlap in (True, False):
        oracle = _oracle_cls()(6, 512, CostModel(rows=[1, 64], ms=[10.0, 73.0]))
        oracle.seq, oracle.overlap = prompt + plain, overlap
        where = []

        class Busy(Cacheback):
            def background(self) -> None:  # 2 ms of CPU time, noting whether a verify is on
                where.append(oracle.in_verify)
                t0 = time.process_time()
                while time.process_time() - t0 < 0.002:
                    pass

        real_verify = oracle.verify

        def verify(*a, **kw):
            oracle.in_verify = True
            try:
                return real_verify(*a, **kw)
            finally:
                oracle.in_verify = False

        oracle.in_verify, oracle.verify = False, verify
        steps = list(Decoder(oracle).steps(prompt, Busy(), SamplingParams(), 40))
        outs.append([t for s in steps for t in s.tokens])
        hidden.append(oracle.hidden_ms)
        assert where == [overlap] * len(steps)  # once a step, inside the verify or after it
        if overlap:  # each 2 ms under a verify priced at 10 ms or more: all of it hidden
            assert 2.0 * len(steps) * 0.95 <= oracle.hidden_ms <= 10.0 * len(steps)
    assert outs[0] == outs[1] == plain[: len(outs[0])]
    assert hidden[1] == 0.0
