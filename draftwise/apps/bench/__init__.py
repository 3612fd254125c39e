"""``draftwise bench``: Spec-Bench-style speed measurements (see ``bench.cli``).

Example::

    draftwise bench --prompts prompts.jsonl --limit 1 --drafters none,cacheback --out runs/b
"""

from draftwise.apps.bench.cli import main, setup_arg_parser

__all__ = ["main", "setup_arg_parser"]
