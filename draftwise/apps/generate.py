"""``draftwise generate``: one prompt in, text streamed out (or one JSON object).

Example::

    draftwise generate --prompt "Write a haiku about caches." --drafter cacheback --json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from draftwise.apps.common import (
    add_drafter_args,
    add_model_args,
    add_sampling_args,
    sampling_kwargs,
)
from draftwise.errors import DraftwiseError


def setup_arg_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="draftwise generate", description=__doc__)
    add_model_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", "-p", help="the prompt text ('-' reads standard input)")
    src.add_argument("--prompt-file", type=Path, help="read the prompt from this file")
    add_drafter_args(p)
    add_sampling_args(p)
    p.add_argument("--ignore-chat-template", action="store_true", help="feed the prompt as raw text")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    return p


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt_file is not None:
        try:
            return args.prompt_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise DraftwiseError(f"cannot read prompt file '{args.prompt_file}': {exc.strerror}") from None
    return sys.stdin.read() if args.prompt == "-" else args.prompt


def main(args: argparse.Namespace) -> int:
    import draftwise

    prompt = read_prompt(args)
    kwargs = sampling_kwargs(args)  # validates every flag before the model loads
    if not prompt.strip():
        raise DraftwiseError("the prompt is empty: give some text with --prompt or --prompt-file")
    model = draftwise.load(
        args.model, backend=args.backend, dtype=args.dtype, invariant=args.invariant
    )
    parts: list[str] = []
    last = None
    for r in draftwise.stream_generate(model, prompt, chat_template=not args.ignore_chat_template, **kwargs):
        if not args.json:
            print(r.text, end="", flush=True)
        parts.append(r.text)
        last = r
    if last is None:  # stream_generate always yields at least one step
        raise DraftwiseError("generation produced no output")
    text = "".join(parts)
    if args.json:
        out = {
            "text": text,
            "token_ids": last.token_ids,
            "prompt_tokens": last.prompt_tokens,
            "generation_tokens": last.generation_tokens,
            "steps": last.steps,
            "mean_accepted": round(last.mean_accepted, 4),
            "mean_tree_nodes": round(last.mean_drafted, 3),  # the budget used per step
            "plain_steps": last.plain_steps,  # steps where the drafter proposed nothing
            "tokens_per_s": round(last.generation_tps, 3),
            "prompt_tokens_per_s": round(last.prompt_tps, 3),
            "draft_ms": round(last.draft_ms, 3),
            "verify_ms": round(last.verify_ms, 3),
            "drafter": args.drafter,
            "backend": model.backend.name,
            "finish_reason": last.finish_reason,
        }
        print(json.dumps(out, ensure_ascii=False))
    else:
        print()
        print(
            f"[{last.generation_tokens} tokens, {last.generation_tps:.1f} tok/s, "
            f"{last.mean_accepted:.2f} tokens/step, drafter {args.drafter}]",
            file=sys.stderr,
        )
    return 0
