"""The ``draftwise`` command line: one-line errors (exit 2) and help texts without markup."""

from __future__ import annotations

import re

import pytest

from draftwise.apps.cli import APPS, main, plain_help


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["generate", "--prompt", "hi", "--max-tokens", "abc"], "invalid int value: 'abc'"),
        (["generate", "--prompt", "hi", "--temp", "warm"], "invalid float value: 'warm'"),
        (["generate", "--prompt", "hi", "--budget", "1.5"], "invalid int value: '1.5'"),
        (["serve", "--port", "http"], "invalid int value: 'http'"),
        (["chat", "--seed", "x1"], "invalid int value: 'x1'"),
        (["generate", "--prompt", "hi", "--backend", "tpu"], "invalid choice: 'tpu'"),
        (["generate"], "one of the arguments --prompt/-p --prompt-file is required"),
        (["generate", "--prompt", "hi", "--no-such-flag"], "unrecognized arguments: --no-such"),
        (["bogus"], "invalid choice: 'bogus'"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_argparse_mistakes_print_one_line(argv, needle, capsys):
    code, out, err = run(argv, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("draftwise: error: ") and needle in lines[0], err
    assert out == ""


@pytest.mark.parametrize("command", [None, *APPS])
def test_help_shows_no_markup(command, capsys):
    code, out, _ = run(["--help"] if command is None else [command, "--help"], capsys)
    assert code == 0 and "usage: draftwise" in out
    assert "``" not in out, out
    assert not re.search(r"\S::$", out, flags=re.MULTILINE), out


def test_plain_help():
    assert plain_help("``draftwise chat``: ``/reset``\n\nExample::\n\n    x::y\n") == (
        "draftwise chat: /reset\n\nExample:\n\n    x::y\n"
    )
    assert plain_help(None) is None
