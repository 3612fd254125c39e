"""Flags shared by every app, so ``generate``, ``chat``, ``serve`` and ``bench`` agree."""

from __future__ import annotations

import argparse
from typing import Any

from draftwise.api import BACKENDS
from draftwise.drafting import PartSpec, check_spec, drafter_names
from draftwise.core.decode import check_request
from draftwise.core.sampling import SamplingParams
from draftwise.errors import DraftwiseError


DRAFT_MODEL_DRAFTERS = ("draft", "card")  # the drafters --draft-model applies to


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="local HF-format model directory, .gguf file, or Hugging Face Hub name ORG/NAME "
                   "(the hub cache first, else downloaded; default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--no-download", action="store_true",
                   help="never download a hub model: use the local hub cache only (as HF_HUB_OFFLINE=1)")
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="compute backend (default: auto)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16", "4bit", "8bit"],
                   help="weights/compute dtype (default: the device's fastest lossless mode: torch on a CPU "
                   "with the compiled 4-bit kernel (AVX2 or AVX-512 VNNI) or bf16 instructions takes 4bit "
                   "for a model from a Q4 GGUF (the file's own 4-bit weights, as the embedded model); "
                   "otherwise bfloat16 with bf16 instructions (both with --invariant), float32 "
                   "elsewhere; mlx its own; see draftwise tune --modes)")
    p.add_argument("--invariant", default="auto", action=argparse.BooleanOptionalAction,
                   help="batch-invariant verification: speculative output bit-equal to plain "
                        "decoding in low precision (default: on for torch bf16 and 4bit on CPU)")


def add_drafter_args(
    p: argparse.ArgumentParser, default: str = "auto", draft_model: bool = True
) -> None:
    """``--drafter``, ``--budget`` and (unless the app has its own) ``--draft-model``."""
    p.add_argument("--drafter", default=default,
                   help=f"drafter: {', '.join(drafter_names())} (default: {default})")
    p.add_argument("--budget", type=int, default=16,
                   help="draft tree size in tokens, excluding the root (default: 16)")
    if not draft_model:
        return
    p.add_argument("--draft-model", default=None, metavar="PATH",
                   help="draft model for --drafter draft or card: a local HF directory or .gguf "
                        "with the model's tokenizer (default: the model's own first layers)")


def with_draft_model(spec: str, path: str) -> str:
    """``spec`` with ``model=PATH`` added to its ``draft``/``card`` parts.

    Example::

        >>> with_draft_model("card:beam=4", "/m/draft")
        'card:beam=4,model=/m/draft'
    """
    parsed = check_spec(spec)
    if not any(p.name in DRAFT_MODEL_DRAFTERS for p in parsed.parts):
        raise DraftwiseError(f"--draft-model needs --drafter draft or card, got {spec!r}")
    if any(c in path for c in ",+:=") or not path.strip():
        raise DraftwiseError(f"--draft-model path {path!r} may not contain ',', '+', ':' or '='")
    parts = []
    for part in parsed.parts:
        if part.name in DRAFT_MODEL_DRAFTERS:
            part = PartSpec(part.name, {**part.options, "model": path}, part.budget)
        parts.append(str(part))
    return "+".join(parts)


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", "-m", type=int, default=256, help="new tokens at most (default: 256)")
    p.add_argument("--temp", type=float, default=0.0, help="sampling temperature; 0 = greedy (default: 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default: 1.0 = off)")
    p.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens (0 = off)")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min-p x the top probability")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="CTRL-style penalty (1.0 = off)")
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling")


def sampling_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for ``draftwise.stream_generate`` from parsed flags, checked
    here so that a bad flag fails before a model is loaded."""
    SamplingParams(
        temperature=args.temp, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
    )
    check_spec(args.drafter)  # names and options, before any model loads
    if getattr(args, "draft_model", None):  # every app then builds the same drafter
        args.drafter = with_draft_model(args.drafter, args.draft_model)
    if args.max_tokens < 1:
        raise DraftwiseError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.budget < 0:
        raise DraftwiseError(f"--budget must be >= 0, got {args.budget}")
    check_request(args.max_tokens, args.budget)  # the upper bounds too, before a model loads
    return dict(
        max_tokens=args.max_tokens, temp=args.temp, top_p=args.top_p, top_k=args.top_k,
        min_p=args.min_p, repetition_penalty=args.repetition_penalty, seed=args.seed,
        budget=args.budget, drafter=args.drafter,
    )
