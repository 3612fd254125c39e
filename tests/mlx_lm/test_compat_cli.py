"""``python -m draftwise.mlx_lm.generate`` / ``.server``: mlx-lm's flags, one-line errors."""

from __future__ import annotations

import subprocess
import sys

import pytest


def module(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", f"draftwise.mlx_lm.{name}", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize(
    "name, args, needle",
    [
        ("generate", ["--max-tokens", "abc"], "argument --max-tokens/-m: invalid int value: 'abc'"),
        ("generate", ["--temp", "hot"], "argument --temp: invalid float value: 'hot'"),
        ("generate", ["--kv-bits", "4"], "unrecognized arguments: --kv-bits 4"),
        ("generate", ["--draft-model", "/models/tiny"], "model not found: '/models/tiny'"),
        ("generate", ["--xtc-probability", "0.5"], "unrecognized arguments"),
        ("generate", ["--min-p", "0.1", "--min-tokens-to-keep", "3"], "min_tokens_to_keep=3"),
        ("server", ["--port", "http"], "argument --port: invalid int value: 'http'"),
        ("server", ["--draft-model", "/models/tiny"], "model not found: '/models/tiny'"),
    ],
)
def test_mistakes_print_one_line(name, args, needle):
    r = module(name, *args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("draftwise: error: "), r.stderr
    assert needle in lines[0], r.stderr


@pytest.mark.parametrize("name", ["generate", "server"])
def test_help(name):
    r = module(name, "--help")
    assert r.returncode == 0 and r.stderr == "", r.stderr  # no runpy warning either
    assert "``" not in r.stdout and "--max-tokens" in r.stdout and "--draft-model" in r.stdout


def test_server_maps_flags_onto_draftwise_serve(monkeypatch):
    from draftwise.apps import serve
    from draftwise.mlx_lm import server

    seen = {}
    monkeypatch.setattr(serve, "main", lambda args: seen.setdefault("args", args) and 0)
    argv = "--model m --host 0.0.0.0 --port 9000 --temp 0.5 --top-p 0.9 --max-tokens 64".split()
    assert server.main(server.setup_arg_parser().parse_args(argv)) == 0
    args = seen["args"]
    assert (args.model, args.host, args.port, args.temp, args.top_p, args.max_tokens) == (
        "m",
        "0.0.0.0",
        9000,
        0.5,
        0.9,
        64,
    )
    assert args.drafter == "auto" and args.num_draft_tokens == 3
    server.main(server.setup_arg_parser().parse_args(["--draft-model", "d"]))
    assert seen["args"].drafter == "auto"  # setdefault kept the first call's args
    seen.clear()
    server.main(server.setup_arg_parser().parse_args(["--draft-model", "d"]))
    assert seen["args"].drafter == "draft:model=d,beam=1,topk=1,depth=3"


def test_generate_module_is_callable_as_the_function():
    code = (
        "from draftwise.mlx_lm.generate import stream_generate\n"
        "from draftwise.mlx_lm import generate\n"
        "from draftwise.errors import DraftwiseError\n"
        "try:\n    generate(object(), object(), 'hi')\n"
        "except DraftwiseError as exc:\n    print(exc)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "model must come from draftwise.mlx_lm.load" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow
@pytest.mark.torch
def test_generate_runs_like_mlx_lm(torch_model):  # type: ignore[no-untyped-def]
    import draftwise

    prompt = "Name three primes."
    r = module(
        "generate",
        "--prompt",
        prompt,
        "--max-tokens",
        "12",
        "--backend",
        "torch",
        "--dtype",
        "float32",
        "--verbose",
        "False",
    )
    assert r.returncode == 0, r.stderr
    # mlx_lm.generate applies the chat template to --prompt, as draftwise's own API does
    assert r.stdout == draftwise.generate(torch_model, prompt, max_tokens=12) + "\n"
    r = module(
        "generate",
        "--prompt",
        prompt,
        "--max-tokens",
        "12",
        "--backend",
        "torch",
        "--dtype",
        "float32",
        "--drafter",
        "none",
    )
    assert r.returncode == 0 and r.stdout.startswith("=" * 10 + "\n"), r.stderr
    assert "Generation: " in r.stdout and "Peak memory: " in r.stdout
