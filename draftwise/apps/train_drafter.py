"""``draftwise train-drafter``: train a ReDrafter for a model on the training corpus.

Data: the model's own greedy continuations of corpus prompts (never benchmark prompts),
generated batched, with its hidden states; then teacher-forced training of the
recurrent drafter. Both phases write atomic checkpoints under ``--out`` and a second
run with the same ``--out`` resumes where the first stopped.

Example::

    draftwise train-drafter --out ~/redrafter --corpus ../shared/corpus/prompts.jsonl
    draftwise generate --drafter redrafter:path=~/redrafter --prompt "Hello"
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

from draftwise.errors import DraftwiseError
from draftwise.models.resolve import resolve_model
from draftwise.training.recipe import TrainRecipe, train_redrafter


def setup_arg_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="draftwise train-drafter")
    p.add_argument("--model", default=None, help="HF dir or .gguf (default: the embedded model)")
    p.add_argument("--out", required=True, help="checkpoint directory (resumed when present)")
    p.add_argument(
        "--corpus",
        default="../shared/corpus/prompts.jsonl",
        help="JSONL prompts to continue (not benchmark prompts)",
    )
    for f in fields(TrainRecipe):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    p.add_argument("--quiet", action="store_true")
    return p


def main(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    prompts = Path(args.corpus).expanduser()
    if not prompts.is_file():
        raise DraftwiseError(f"no corpus prompts file at {prompts}")
    recipe = TrainRecipe(**{f.name: getattr(args, f.name) for f in fields(TrainRecipe)})
    recipe.check()
    model_dir = resolve_model(args.model)
    summary = train_redrafter(model_dir, Path(args.out).expanduser(), prompts, recipe, args.quiet)
    print(json.dumps(summary, indent=1))
    return 0
