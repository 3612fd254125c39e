"""Flags shared by every app, so ``generate``, ``chat``, ``serve`` and ``bench`` agree."""

from __future__ import annotations

import argparse
from typing import Any

from draftwise.api import BACKENDS
from draftwise.drafting import check_spec, drafter_names
from draftwise.core.sampling import SamplingParams
from draftwise.errors import DraftwiseError


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="local HF-format model directory or .gguf file (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="compute backend (default: auto)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16", "4bit", "8bit"],
                   help="weights/compute dtype (default: the backend's; float32 for torch)")
    p.add_argument("--invariant", default="auto", action=argparse.BooleanOptionalAction,
                   help="batch-invariant verification: speculative output bit-equal to plain "
                        "decoding in low precision (default: on for torch bf16 on CPU)")


def add_drafter_args(p: argparse.ArgumentParser, default: str = "auto") -> None:
    p.add_argument("--drafter", default=default,
                   help=f"drafter: {', '.join(drafter_names())} (default: {default})")
    p.add_argument("--budget", type=int, default=16,
                   help="draft tree size in tokens, excluding the root (default: 16)")


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
    if args.max_tokens < 1:
        raise DraftwiseError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.budget < 0:
        raise DraftwiseError(f"--budget must be >= 0, got {args.budget}")
    return dict(
        max_tokens=args.max_tokens, temp=args.temp, top_p=args.top_p, top_k=args.top_k,
        min_p=args.min_p, repetition_penalty=args.repetition_penalty, seed=args.seed,
        budget=args.budget, drafter=args.drafter,
    )
