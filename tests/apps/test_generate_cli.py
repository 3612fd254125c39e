"""`draftwise generate` end to end in a subprocess: JSON output and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.torch
pytest.importorskip("torch")


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "draftwise", *args], capture_output=True,
                          text=True, input=stdin, timeout=600)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--prompt", "   "], "prompt is empty"),
        (["--prompt", "hi", "--drafter", "bogus"], "unknown drafter 'bogus'"),
        (["--prompt", "hi", "--max-tokens", "-3"], "--max-tokens must be >= 1, got -3"),
        (["--prompt", "hi", "--max-tokens", str(10**12)],
         "max_tokens must be at most 16777216, got 1000000000000"),
        (["--prompt", "hi", "--budget", "100000"], "draft budget must be at most 4096, got 100000"),
        (["--prompt", "hi", "--temp", "-1"], "temperature must be >= 0"),
        (["--prompt", "hi", "--model", "/no/such/model"], "/no/such/model"),
        (["--prompt-file", "/no/such/file.txt"], "/no/such/file.txt"),
        (["--prompt", "hi", "--drafter", "ssd", "--draft-model", "/x"],
         "--draft-model needs --drafter draft or card"),
        (["--prompt", "hi", "--drafter", "card:layers=0"], "card option layers must be >= 1"),
        (["--prompt", "hi", "--drafter", "draft", "--draft-model", "/no/such/draft"],
         "model not found: '/no/such/draft'"),
    ],
)
def test_bad_input_one_line_error(args, needle, default_model_dir):
    r = cli("generate", *args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_prompt_over_context_limit(default_model_dir, tmp_path):
    f = tmp_path / "long.txt"
    f.write_text("word " * 9000)
    r = cli("generate", "--prompt-file", str(f), "--backend", "torch")
    assert r.returncode == 2
    assert "context limit" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_json_output(default_model_dir):
    r = cli("generate", "--prompt", "Repeat after me: the cat sat on the mat. The cat sat on the mat.",
            "--drafter", "cacheback:budget=6", "--max-tokens", "24", "--json", "--backend", "torch")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("text", "token_ids", "steps", "mean_accepted", "tokens_per_s", "draft_ms", "verify_ms"):
        assert key in out
    assert 0 < len(out["token_ids"]) <= 24 and out["steps"] <= len(out["token_ids"])
    assert out["mean_accepted"] == pytest.approx(len(out["token_ids"]) / out["steps"], rel=1e-3)
    # The tree size used per step is reported; the spec's budget=6 caps it.
    assert 0 < out["mean_tree_nodes"] <= 6 and 0 <= out["plain_steps"] <= out["steps"]


@pytest.mark.slow
def test_draft_model_flag_end_to_end(default_model_dir):
    """``--drafter card --draft-model DIR`` (the default model drafting for itself) emits
    the plain tokens."""
    args = ["--prompt", "Name three prime numbers.", "--max-tokens", "12", "--json"]
    plain = json.loads(cli("generate", *args, "--drafter", "none").stdout)
    r = cli("generate", *args, "--drafter", "card:beam=2,topk=2,depth=3",
            "--draft-model", str(default_model_dir))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["token_ids"] == plain["token_ids"]
    assert out["drafter"] == f"card:beam=2,topk=2,depth=3,model={default_model_dir}"
