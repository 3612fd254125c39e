"""``python -m draftwise.mlx_lm.generate``: mlx-lm's ``mlx_lm.generate`` command on draftwise.

Takes mlx-lm's flag names for what draftwise supports (``--model``, ``--prompt``,
``--max-tokens``, ``--temp``, ``--top-p``, ``--min-p``, ``--top-k``, ``--seed``,
``--system-prompt``, ``--ignore-chat-template``, ``--extra-eos-token``, ``--verbose``,
``--draft-model``, ``--num-draft-tokens``) plus draftwise's ``--drafter``, ``--budget``,
``--backend`` and ``--dtype``. Other mlx-lm flags are refused on one line.

Example::

    python -m draftwise.mlx_lm.generate --prompt "How tall is Mt Everest?" --max-tokens 32

The module also re-exports ``generate`` and ``stream_generate`` (as ``mlx_lm.generate``
does) and, once imported, can be called like the ``generate`` function: Python binds
``draftwise.mlx_lm.generate`` to this module when it is imported, and a script written
for mlx-lm expects the function there.
"""

from __future__ import annotations

import argparse
import sys
import types
from typing import Any

from draftwise.apps.cli import OneLineParser, run_app
from draftwise.mlx_lm.generation import (
    GenerationResponse,
    draft_model_drafter,
    generate,
    stream_generate,
)
from draftwise.mlx_lm.sample_utils import make_sampler
from draftwise.mlx_lm.utils import load

__all__ = ["GenerationResponse", "generate", "main", "setup_arg_parser", "stream_generate"]


def str2bool(text: str) -> bool:
    return text.lower() not in ("false", "f")  # mlx-lm's rule for --verbose


def setup_arg_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    from draftwise.apps.common import add_drafter_args, add_model_args

    p = p or OneLineParser(
        prog="python -m draftwise.mlx_lm.generate",
        description="LLM inference with mlx-lm's flags on draftwise's lossless engine.",
    )
    add_model_args(p)
    p.add_argument(
        "--prompt", "-p", default="hello", help="message for the model ('-' reads stdin)"
    )
    p.add_argument("--system-prompt", default=None, help="system prompt for the chat template")
    p.add_argument("--max-tokens", "-m", type=int, default=100, help="maximum tokens to generate")
    p.add_argument("--temp", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="sampling top-p")
    p.add_argument("--min-p", type=float, default=0.0, help="sampling min-p")
    p.add_argument("--top-k", type=int, default=0, help="sampling top-k")
    p.add_argument("--min-tokens-to-keep", type=int, default=1, help="only 1 is supported")
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    p.add_argument(
        "--ignore-chat-template",
        action="store_true",
        help="use the raw prompt without the chat template",
    )
    p.add_argument(
        "--extra-eos-token", nargs="+", default=(), help="more tokens that end the generation"
    )
    p.add_argument(
        "--verbose",
        type=str2bool,
        default=True,
        help="'True' prints the text as it comes and the speeds; 'False' only the text",
    )
    p.add_argument("--draft-model", default=None, help="draft model for speculative decoding")
    p.add_argument(
        "--num-draft-tokens", type=int, default=3, help="tokens the draft model drafts per step"
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="accepted for mlx-lm scripts; draftwise never runs model code",
    )
    add_drafter_args(p, draft_model=False)  # --draft-model is mlx-lm's, above
    return p


def main(args: argparse.Namespace) -> int:
    """Generate as ``mlx_lm.generate`` does: the prompt goes through the chat template
    (unless ``--ignore-chat-template``), then ``generate`` prints the text."""
    draft_model_drafter(args.draft_model, args.num_draft_tokens)  # fail before loading
    sampler = make_sampler(
        args.temp, args.top_p, args.min_p, args.min_tokens_to_keep, top_k=args.top_k
    )
    model, tokenizer = load(
        args.model, backend=args.backend, dtype=args.dtype, invariant=args.invariant
    )[:2]
    for token in args.extra_eos_token:
        tokenizer.add_eos_token(token)
    prompt = args.prompt.replace("\\n", "\n").replace("\\t", "\t")
    prompt = sys.stdin.read() if prompt == "-" else prompt
    use_chat_template = not args.ignore_chat_template and tokenizer.has_chat_template
    if use_chat_template:
        messages = (
            []
            if args.system_prompt is None
            else [{"role": "system", "content": args.system_prompt}]
        )
        messages.append({"role": "user", "content": prompt})
        prompt = str(
            tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        )
    ids = tokenizer.encode(prompt, add_special_tokens=not use_chat_template)
    text = generate(
        model,
        tokenizer,
        ids,
        verbose=args.verbose,
        max_tokens=args.max_tokens,
        sampler=sampler,
        seed=args.seed,
        draft_model=args.draft_model,
        num_draft_tokens=args.num_draft_tokens,
        drafter=args.drafter,
        budget=args.budget,
    )
    if not args.verbose:
        print(text)
    return 0


class _CallableModule(types.ModuleType):
    """This module, callable as ``generate`` (see the module docstring)."""

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        return generate(*args, **kwargs)


if __name__ == "__main__":
    sys.exit(run_app(main, setup_arg_parser().parse_args()))
else:
    sys.modules[__name__].__class__ = _CallableModule
