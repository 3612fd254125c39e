"""The ``draftwise`` command: one entry point, a subcommand per app.

Every app module has ``setup_arg_parser(parser)`` and ``main(args) -> int``. A mistake
the user can fix (``DraftwiseError``) prints one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from draftwise.errors import DraftwiseError

APPS = {
    "generate": ("draftwise.apps.generate", "generate text for one prompt"),
    "build-table": ("draftwise.apps.build_table", "build a frozen Cacheback n-gram table from a corpus"),
    "bench": ("draftwise.apps.bench.cli", "measure drafters' speedup over plain decoding"),
    "chat": ("draftwise.apps.chat", "chat in the terminal, multi-turn, streamed"),
    "serve": ("draftwise.apps.serve", "OpenAI-compatible HTTP server (FastAPI + uvicorn)"),
    "tune": ("draftwise.apps.tune", "measure this device's verify cost curve for --drafter auto"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="draftwise", description="Lossless speculative decoding for local LLMs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in APPS.items():
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=help_text, description=mod.__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.setup_arg_parser(p)
        p.set_defaults(_module=mod)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._module.main(args) or 0)
    except DraftwiseError as exc:
        print(f"draftwise: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ndraftwise: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
