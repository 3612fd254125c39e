"""``python -m draftwise.mlx_lm.server``: mlx-lm's ``mlx_lm.server`` command on draftwise.

It runs ``draftwise serve`` (the same OpenAI-compatible app: ``/v1/chat/completions``,
``/v1/completions``, ``/v1/models``, ``/health``) with mlx-lm's flag names for what
draftwise supports: ``--model``, ``--host``, ``--port``, ``--temp``, ``--top-p``,
``--top-k``, ``--min-p``, ``--max-tokens``, ``--log-level``, ``--draft-model``,
``--num-draft-tokens``, ``--trust-remote-code``; draftwise's own flags (``--drafter``,
``--budget``, ``--backend``, ...) work too.

Example::

    python -m draftwise.mlx_lm.server --port 8080 --max-tokens 512
"""

from __future__ import annotations

import argparse
import sys

from draftwise.apps.cli import OneLineParser, run_app
from draftwise.mlx_lm.generation import draft_model_drafter


def setup_arg_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    from draftwise.apps import serve

    p = p or OneLineParser(
        prog="python -m draftwise.mlx_lm.server",
        description="OpenAI-compatible server with mlx-lm's flags on draftwise's lossless engine.",
    )
    serve.setup_arg_parser(p)  # has --draft-model (draftwise serve's, the same meaning)
    p.add_argument(
        "--num-draft-tokens", type=int, default=3, help="tokens the draft model drafts per step"
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="accepted for mlx-lm scripts; draftwise never runs model code",
    )
    return p


def main(args: argparse.Namespace) -> int:
    """Map mlx-lm's draft-model flags onto a drafter, then run ``draftwise serve``."""
    from draftwise.apps import serve

    spec = draft_model_drafter(args.draft_model, args.num_draft_tokens)
    if spec is not None:
        args.drafter = spec
    return serve.main(args)


if __name__ == "__main__":
    sys.exit(run_app(main, setup_arg_parser().parse_args()))
