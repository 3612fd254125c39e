"""``scripts/train_drafter_timed.py`` (the recipe a lent GPU runs) end to end on the CPU with
tiny sizes: data, a timed probe, training, a loadable checkpoint and its summary."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.scripts import SCRIPTS  # noqa: E402


def _tiny_run(model_dir, tmp_path, prompt, train_batch: int = 16) -> list[str]:
    """The script's command for a tiny CPU run over the 12 prompts ``prompt(i)``, without
    ``--out``."""
    prompts = tmp_path / "p.jsonl"
    rows = [{"id": f"t-{i}", "prompt": prompt(i), "response": None} for i in range(12)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [sys.executable, str(SCRIPTS / "train_drafter_timed.py"),
            "--model", str(model_dir), "--prompts", str(prompts), "--device", "cpu",
            "--budget", "120", "--batch", "4", "--gen-len", "4", "--max-prompt", "16",
            "--prefill-rows", "4", "--train-batch", str(train_batch), "--context-rows", "4"]


@pytest.mark.slow
def test_a_tiny_timed_run_writes_a_checkpoint_and_its_summary(default_model_dir, tmp_path):
    out = tmp_path / "rd"
    base = _tiny_run(default_model_dir, tmp_path, lambda i: f"Count from {i} to {i + 5}.")
    cmd = [*base, "--out", str(out),
           "--temp", "0.8", "--temp-every", "2",  # batch 1 sampled, 0 and 2 greedy
           "--sample-first", "2"]  # (batch 1's first 2 tokens, then greedy)
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["batches"] == 3 and summary["steps"] >= 1 and summary["temp"] == 0.8
    assert summary["temp_every"] == 2 and summary["sampled_rows"] == 4
    assert summary["sample_first"] == 2
    assert summary["train_tokens"] > 0 and summary["heldout_tokens"] > 0
    assert len(summary["heldout_chain_acceptance"]) == 5
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["context_dim"] == 256 and (out / "model.safetensors").is_file()
    assert not (out / "train_state.pt").exists() and not summary["stopped_at_deadline"]


@pytest.mark.slow
def test_a_run_carries_on_from_a_checkpoint_with_later_batches(default_model_dir, tmp_path):
    """``--init`` starts from a checkpoint (its draft vocabulary kept) and ``--first-batch``
    skips that many batches of the length-sorted prompts; a missing checkpoint, one made
    for other weights, or a first batch past the prompts' batches is refused in one line
    before the model loads."""
    from safetensors.torch import load_file

    base = _tiny_run(default_model_dir, tmp_path,
                     lambda i: f"Name {i} colours, then {i + 2} fruits.")
    first = tmp_path / "rd1"
    subprocess.run([*base, "--out", str(first)], check=True, capture_output=True, timeout=600)
    second = tmp_path / "rd2"
    subprocess.run([*base, "--out", str(second), "--init", str(first), "--first-batch", "1"],
                   check=True, capture_output=True, timeout=600)
    summary = json.loads((second / "summary.json").read_text())
    assert summary["init"] == str(first) and summary["first_batch"] == 1
    assert summary["batches"] == 2 and summary["steps"] >= 1  # batches 1 and 2 of 3
    ids = [load_file(str(d / "model.safetensors"))["vocab_ids"] for d in (first, second)]
    assert ids[0].tolist() == ids[1].tolist()
    grown = tmp_path / "rd-grown"  # one more ResBlock, zero at first (``ReDrafterNet.grown``)
    subprocess.run([*base, "--out", str(grown), "--init", str(first), "--resblocks", "2"],
                   check=True, capture_output=True, timeout=600)
    assert json.loads((grown / "summary.json").read_text())["resblocks"] == 2
    assert json.loads((grown / "config.json").read_text())["resblocks"] == 2
    other = tmp_path / "other"  # the first checkpoint, as if made for other weights
    other.mkdir()
    for f in first.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(cfg | {"fingerprint": "0" * 32}))
    for extra, words in ((["--init", str(tmp_path / "nothing")], "no ReDrafter checkpoint"),
                         (["--init", str(other)], "trained for other model weights"),
                         (["--first-batch", "3"], "make 3 batches"),
                         (["--first-batch", "-1"], "must be >= 0"),
                         (["--temp", "-1"], "--temp must be a finite number >= 0"),
                         (["--temp-every", "0"], "--temp-every must be >= 1"),
                         (["--sample-first", "-2"], "--sample-first must be >= 0, got -2"),
                         (["--sample-first", "8"], "--sample-first 8 samples at --temp: give"),
                         (["--started-at", "0"], "not within the last --budget"),
                         (["--resblocks", "0"], "--resblocks must be 1..8"),
                         (["--context-dim", "100"], "must be 0 or a multiple of 16 (the"),
                         (["--context-dim", "48", "--context-heads", "5"], "and of --context-heads 5"),
                         (["--init", str(grown), "--resblocks", "1"],
                          "cannot grow a network of 2 ResBlocks to 1"),
                         (["--init", str(first), "--context-dim", "128"],
                          "--init " + str(first) + " has 256/4")):
        got = subprocess.run([*base, "--out", str(tmp_path / "rd3"), *extra],
                             capture_output=True, text=True, timeout=300)
        assert got.returncode != 0 and words in got.stderr.strip().splitlines()[-1]
        assert not (tmp_path / "rd3").exists()


@pytest.mark.slow
def test_training_stops_at_the_budgets_deadline(default_model_dir, tmp_path):
    """``--started-at`` counts what ran before the script into ``--budget``: here its
    deadline (the budget less 40 s for evaluation) has passed before training starts, so
    training stops after its first step, and the network is still saved and evaluated."""
    import time

    out = tmp_path / "rd"
    base = _tiny_run(default_model_dir, tmp_path, lambda i: f"List {i} animals that swim.", 2)
    cmd = [*base,
           "--out", str(out), "--started-at", str(time.time() - 79), "--data-share", "0.99"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_at_deadline"] and summary["steps"] == 1
    assert len(summary["heldout_chain_acceptance"]) == 5 and (out / "model.safetensors").is_file()
