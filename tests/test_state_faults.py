"""Drafter state files under faults: ``kill -9`` while a session saves leaves the previous
file loadable; a corrupt file at start is refused, named, and never overwritten."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftwise.errors import DraftwiseError

ROOT = Path(__file__).resolve().parents[1]
DRAFTERS = ["ssd", "cacheback", "cacheback+ssd"]  # the last is saved as an index + members

# A process that loads the state, teaches the drafters some random text, then saves
# them over and over until it is killed.
CHILD = r"""
import sys
from pathlib import Path
import numpy as np
from tests.test_state_faults import DRAFTERS, make_session
session = make_session(Path(sys.argv[1]), Path(sys.argv[2]))  # loads what is there
assert not session.load_errors, session.load_errors
rng = np.random.default_rng(int(sys.argv[3]))
for name in DRAFTERS:
    d = session.model.drafter(name)
    prompt = rng.integers(0, 40000, 64)
    d.begin(prompt)
    d.update(np.concatenate([prompt, rng.integers(0, 40000, 3000)]), 3000)
session.save()
print("saved", flush=True)
while True:
    session.save()
"""


def make_session(cache_dir: Path, model_dir: Path):  # type: ignore[no-untyped-def]
    from draftwise.api import Model
    from draftwise.models.tokenizer import Tokenizer
    from draftwise.session import Session
    from tests.fakes import FakeBackend  # saving and loading never touch the model

    model = Model(FakeBackend(), Tokenizer.from_dir(model_dir), model_dir, progress=None)
    for name in DRAFTERS:
        model.drafter(name)
    return Session(model, cache_dir=cache_dir)


def test_kill_9_while_saving_leaves_a_loadable_file(tmp_path, default_model_dir):
    runs, killed_mid_write, seen_temps = 10, 0, 0
    rng = random.Random(0)
    for i in range(runs):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(tmp_path), str(default_model_dir), str(i)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)},
        )
        try:
            assert child.stdout is not None and child.stdout.readline() == "saved\n"
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
        temps = sum(p.suffix == ".tmp" for p in tmp_path.iterdir())  # left by the kill
        killed_mid_write += temps > seen_temps
        seen_temps = temps
        session = make_session(tmp_path, default_model_dir)
        assert session.load_errors == [], session.load_errors
        assert session.model.drafters["ssd"].store.total >= 3064 * (i + 1)  # every run's text
    print(f"\n{runs} kills, {killed_mid_write} left a half-written temporary file")


def test_a_corrupt_state_file_is_refused_and_kept(tmp_path, default_model_dir):
    bad = tmp_path / "ssd.drafter"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    session = make_session(tmp_path, default_model_dir)
    assert len(session.load_errors) == 1 and str(bad) in session.load_errors[0]
    with pytest.raises(DraftwiseError, match="cannot be loaded") as info:
        session.check_loaded()
    assert str(bad) in str(info.value)
    session.close()  # saves the other drafters, never over the file it could not read
    assert bad.read_bytes() == b"PK\x03\x04 not really a zip"
    assert (tmp_path / "cacheback.drafter").is_file()


@pytest.mark.torch
@pytest.mark.slow
def test_serve_refuses_to_start_on_a_corrupt_state_file(tmp_path, default_model_dir):
    pytest.importorskip("torch")
    pytest.importorskip("fastapi")
    bad = tmp_path / "cacheback.drafter"
    bad.write_bytes(b"garbage")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "draftwise",
            "serve",
            "--model",
            str(default_model_dir),
            "--backend",
            "torch",
            "--dtype",
            "float32",
            "--port",
            "0",
            "--cache-dir",
            str(tmp_path),
            "--drafter",
            "cacheback",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 2, out.stderr
    assert str(bad) in out.stderr and "cannot be loaded" in out.stderr
    assert bad.read_bytes() == b"garbage"
