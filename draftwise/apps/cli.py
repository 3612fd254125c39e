"""The ``draftwise`` command: one entry point, a subcommand per app.

Every app module has ``setup_arg_parser(parser)`` and ``main(args) -> int``. Every
mistake the user can fix prints one line and exits with status 2: flags argparse
rejects (a malformed number, a missing option) as well as ``DraftwiseError``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Callable
from typing import NoReturn

from draftwise.errors import DraftwiseError

APPS = {
    "generate": ("draftwise.apps.generate", "generate text for one prompt"),
    "build-table": (
        "draftwise.apps.build_table",
        "build a frozen Cacheback n-gram table from a corpus",
    ),
    "bench": ("draftwise.apps.bench.cli", "measure drafters' speedup over plain decoding"),
    "chat": ("draftwise.apps.chat", "chat in the terminal, multi-turn, streamed"),
    "serve": ("draftwise.apps.serve", "OpenAI-compatible HTTP server (FastAPI + uvicorn)"),
    "train-drafter": (
        "draftwise.apps.train_drafter",
        "train a ReDrafter (recurrent drafter) for a model on the training corpus",
    ),
    "tune": ("draftwise.apps.tune", "measure this device's verify cost curve for --drafter auto"),
}


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``draftwise: error: ...``), exit 2.

    argparse's own ``error`` prints the whole usage block first; the README promises one
    line per mistake, with a pointer to ``--help`` instead.

    Example::

        $ draftwise generate --prompt hi --max-tokens abc
        draftwise: error: argument --max-tokens/-m: invalid int value: 'abc' (see: ...)
    """

    def error(self, message: str) -> NoReturn:
        message = " ".join(message.split())  # argparse may wrap long messages
        self.exit(2, f"draftwise: error: {message} (see: {self.prog} --help)\n")


def plain_help(doc: str | None) -> str | None:
    """A module docstring as plain text for ``--help``: reStructuredText literals
    (double backticks) lose their backticks, and ``Example::`` becomes ``Example:``.

    Example::

        >>> plain_help("``draftwise chat``: type ``/reset``.\\n\\nExample::\\n")
        'draftwise chat: type /reset.\\n\\nExample:\\n'
    """
    if doc is None:
        return None
    text = re.sub(r"``(.+?)``", r"\1", doc, flags=re.DOTALL)
    return re.sub(r"(?<=\S)::$", ":", text, flags=re.MULTILINE)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="draftwise", description="Lossless speculative decoding for local LLMs."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in APPS.items():
        mod = importlib.import_module(module)
        p = sub.add_parser(
            name,
            help=help_text,
            description=plain_help(mod.__doc__),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.setup_arg_parser(p)
        p.set_defaults(_module=mod)
    return parser


def run_app(main_fn: Callable[[argparse.Namespace], int | None], args: argparse.Namespace) -> int:
    """Run an app's ``main(args)``; a ``DraftwiseError`` prints one line and gives 2."""
    try:
        return int(main_fn(args) or 0)
    except DraftwiseError as exc:
        print(f"draftwise: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ndraftwise: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "no_download", False):
        os.environ["HF_HUB_OFFLINE"] = "1"  # every load of this run, hub cache only (models/hub.py)
    return run_app(args._module.main, args)


if __name__ == "__main__":
    sys.exit(main())
