"""`draftwise build-table` on tiny corpora with the default model's tokenizer (no weights run)."""

from __future__ import annotations

import json

import pytest

from draftwise.apps.cli import main
from draftwise.core.drafters.frozen_table import FrozenTable
from draftwise.models.tokenizer import Tokenizer


def test_build_table_text_and_jsonl(tmp_path, default_model_dir, capsys):
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat.\n" * 50 + "the cat ran.\n")
    rows = tmp_path / "p.jsonl"
    rows.write_text(
        json.dumps({"prompt": "Say hi.", "response": "Hello there, friend!"})
        + "\n"
        + json.dumps({"prompt": "No answer here.", "response": None})
        + "\n\n"
    )
    out = tmp_path / "table.npz"
    rc = main(
        ["build-table", "--corpus", str(text), str(rows), "--out", str(out), "--fc", "4", "--quiet"]
    )
    assert rc == 0 and "wrote" in capsys.readouterr().out
    tok = Tokenizer.from_dir(default_model_dir)
    t = FrozenTable.load(out, tok.identity())
    assert (t.ll, t.fl, t.fc) == (1, 3, 4)
    cat = tuple(tok.encode(" cat"))
    assert tok.decode(list(t.query(cat)[0])) == " sat on the"  # 50 times vs " ran." once
    # the JSONL response was counted in chat format: prompt end-of-turn, then the assistant turn
    hello = tok.encode("Hello there, friend!")
    chat = tok.encode_chat(
        [
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "Hello there, friend!"},
        ],
        add_generation_prompt=False,
    )
    i = chat.index(hello[0])
    assert tuple(chat[i + 1 : i + 4]) in t.query((chat[i],))
    assert tuple(chat[i - 3 : i]) in t.query((chat[i - 4],))


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--fc", "0"], "--fc must be >= 1, got 0"),
        (["--corpus", "/no/such/corpus.txt"], "/no/such/corpus.txt"),
        (["--out", "/no/such/dir/t.npz"], "/no/such/dir"),
    ],
)
def test_build_table_bad_args(tmp_path, default_model_dir, capsys, extra, needle):
    text = tmp_path / "t.txt"
    text.write_text("hello world\n")
    args = ["build-table", "--corpus", str(text), "--out", str(tmp_path / "o.npz"), "--quiet"]
    assert main(args + extra) == 2
    assert needle in capsys.readouterr().err


def test_bad_jsonl_line(tmp_path, default_model_dir, capsys):
    rows = tmp_path / "p.jsonl"
    rows.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    assert (
        main(["build-table", "--corpus", str(rows), "--out", str(tmp_path / "o.npz"), "--quiet"])
        == 2
    )
    assert "line 2" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.torch
def test_self_generate_adds_counts(tmp_path, default_model_dir, capsys):
    pytest.importorskip("torch")
    rows = tmp_path / "p.jsonl"
    rows.write_text(json.dumps({"prompt": "Name three colours.", "response": None}) + "\n")
    out = tmp_path / "t.npz"
    args = [
        "build-table",
        "--corpus",
        str(rows),
        "--out",
        str(out),
        "--quiet",
        "--backend",
        "torch",
    ]
    assert main(args) == 0
    alone = int(capsys.readouterr().out.split(" from ")[1].split()[0])
    assert main(args + ["--self-generate", "1", "--gen-tokens", "8"]) == 0
    with_gen = int(capsys.readouterr().out.split(" from ")[1].split()[0])
    assert alone < with_gen <= 2 * alone + 8  # the prompt again + at most 8 sampled tokens
