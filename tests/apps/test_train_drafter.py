"""``draftwise train-drafter`` end to end on the real default model, tiny sizes: greedy
shards held out, teacher-forced shards trained on, a checkpoint the ``redrafter``
drafter loads; a second run resumes instead of redoing the work."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from draftwise.apps.train_drafter import main, setup_arg_parser  # noqa: E402
from draftwise.errors import DraftwiseError  # noqa: E402

TINY = [
    "--batches", "1", "--batch", "2", "--gen-len", "4", "--max-prompt", "16",
    "--forced-batches", "1", "--forced-skip", "2", "--draft-vocab", "64",
    "--epochs", "0.1", "--train-batch", "64", "--context-dim", "0", "--quiet",
]


def test_train_drafter_tiny_end_to_end(tmp_path, default_model_dir, capsys):
    prompts = tmp_path / "prompts.jsonl"
    rows = [
        {"prompt": f"Write a sentence about the number {i}.", "response": f"The number {i} "
         "is a whole number, and it comes after the one before it. " * 8}
        for i in range(40)
    ]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "ck"
    argv = ["--model", str(default_model_dir), "--out", str(out), "--corpus", str(prompts)]
    assert main(setup_arg_parser().parse_args(argv + TINY)) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["train_tokens"] == 8 * 512 and summary["heldout_greedy_tokens"] > 0
    assert summary["draft_vocab"] == 64 and len(summary["heldout_chain_acceptance"]) == 5
    assert (out / "config.json").is_file() and len(list((out / "forced").glob("*.npz"))) == 1
    before = (out / "forced" / "forced-00000.npz").stat().st_mtime_ns
    assert main(setup_arg_parser().parse_args(argv + TINY)) == 0  # resumes: data kept
    assert (out / "forced" / "forced-00000.npz").stat().st_mtime_ns == before
    # the held-out prompts would leak into training: refused before any work
    bad = TINY[:]
    bad[bad.index("--forced-skip") + 1] = "1"
    with pytest.raises(DraftwiseError, match="--forced-skip 1 would train on the held-out"):
        main(setup_arg_parser().parse_args(argv + bad))


GREEDY = [
    "--batches", "2", "--batch", "3", "--gen-len", "6", "--max-prompt", "16",
    "--draft-vocab", "64", "--epochs", "0.5", "--train-batch", "8", "--quiet",
]


def test_train_drafter_greedy_recipe_end_to_end(tmp_path, default_model_dir, capsys):
    """The default recipe's path (greedy continuations, some rows held out) at tiny sizes;
    a second run resumes from the shards and the finished training state."""
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"prompt": f"Count from {i} to {i + 5}.", "response": None} for i in range(9)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "ck"
    argv = ["--model", str(default_model_dir), "--out", str(out), "--corpus", str(prompts)]
    assert main(setup_arg_parser().parse_args(argv + GREEDY)) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["heldout_greedy_tokens"] > 0 and summary["train_tokens"] > 0
    assert summary["heldout_greedy_tokens"] + summary["train_tokens"] <= 2 * 3 * 6
    shards = sorted((out / "data").glob("shard-*.npz"))
    assert len(shards) == 2 and (out / "config.json").is_file()
    stamp = [s.stat().st_mtime_ns for s in shards]
    assert main(setup_arg_parser().parse_args(argv + GREEDY)) == 0
    assert [s.stat().st_mtime_ns for s in shards] == stamp
    assert json.loads((out / "config.json").read_text())["context_dim"] == 256  # the default
    # resuming a context network with another width: refused, nothing overwritten
    other = GREEDY + ["--context-dim", "64"]
    with pytest.raises(DraftwiseError, match="holds a drafter with --context-dim 256"):
        main(setup_arg_parser().parse_args(argv + other))
    # other data settings on the same --out would mix two shard layouts: refused
    longer = GREEDY[:]
    longer[longer.index("--gen-len") + 1] = "7"
    with pytest.raises(DraftwiseError, match=r"other settings \(gen_len 6 -> 7\)"):
        main(setup_arg_parser().parse_args(argv + longer))
    # more shards than the corpus has prompts: refused before any model work
    more = GREEDY[:]
    more[more.index("--batches") + 1] = "4"
    with pytest.raises(DraftwiseError, match="has 9 prompts; 4 shards of 3 need 12"):
        main(setup_arg_parser().parse_args(argv[:3] + [str(tmp_path / "other")] + argv[4:] + more))


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [("--batch", "0", "--batch must be >= 1, got 0"), ("--epochs", "0", "--epochs must be > 0"),
     ("--gen-len", "-3", "--gen-len must be >= 1, got -3"),
     ("--context-dim", "10", "--context-dim 10 must be a multiple of --context-heads 4"),
     ("--forced-batches", "2", "a context drafter .* trains on greedy continuations only")],
)
def test_bad_recipe_values_are_refused_first(tmp_path, flag, value, words):
    argv = ["--out", str(tmp_path / "ck"), "--corpus", str(tmp_path / "p.jsonl"), flag, value]
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    with pytest.raises(DraftwiseError, match=words):
        main(setup_arg_parser().parse_args(argv))
