"""``draftwise build-table``: count a corpus into a frozen Cacheback table (.npz).

Text files are read in blocks and tokenized as plain text. JSONL files hold one object
per line with a ``prompt`` and an optional ``response``; each is rendered through the
model's chat template as the model sees it (user turn + assistant turn), so the table
learns chat-formatted text. ``--self-generate N`` adds N continuations sampled from the
model itself (temperature 0.7) on prompts from the JSONL corpus files.

Example::

    draftwise build-table --corpus prompts.jsonl docs.txt code.txt --out table.npz --fc 32
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from draftwise.apps.common import add_model_args
from draftwise.core.drafters.table_builder import build_frozen_table
from draftwise.errors import DraftwiseError

if TYPE_CHECKING:
    from draftwise.models.tokenizer import Tokenizer

_BLOCK_CHARS = 1 << 16  # text files are tokenized in blocks of about this many characters
_BATCH = 64  # texts per tokenizer call


def setup_arg_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="draftwise build-table", description=__doc__)
    add_model_args(p)
    p.add_argument(
        "--corpus",
        nargs="+",
        type=Path,
        required=True,
        metavar="PATH",
        help="text files and/or JSONL files with prompt/response fields",
    )
    p.add_argument("--out", type=Path, required=True, help="the .npz table file to write")
    p.add_argument("--ll", type=int, default=1, help="leader length (default: 1)")
    p.add_argument("--fl", type=int, default=3, help="follower length (default: 3)")
    p.add_argument("--lc", type=int, default=1 << 16, help="leaders kept (default: 65536)")
    p.add_argument("--fc", type=int, default=32, help="followers kept per leader (default: 32)")
    p.add_argument(
        "--max-keys",
        type=int,
        default=1 << 22,
        help="distinct n-grams counted before pruning rare ones (default: 4194304)",
    )
    p.add_argument(
        "--self-generate",
        type=int,
        default=0,
        metavar="N",
        help="also count N continuations sampled from the model (default: 0)",
    )
    p.add_argument(
        "--gen-tokens",
        type=int,
        default=256,
        help="tokens per self-generated continuation (default: 256)",
    )
    p.add_argument(
        "--temp", type=float, default=0.7, help="self-generation temperature (default: 0.7)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed for prompt choice and sampling")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _check_args(args: argparse.Namespace) -> None:
    for flag in ("ll", "fl", "lc", "fc"):
        if getattr(args, flag) < 1:
            raise DraftwiseError(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    if args.self_generate < 0:
        raise DraftwiseError(f"--self-generate must be >= 0, got {args.self_generate}")
    if args.gen_tokens < 1:
        raise DraftwiseError(f"--gen-tokens must be >= 1, got {args.gen_tokens}")
    for path in args.corpus:
        if not path.is_file():
            raise DraftwiseError(f"corpus file not found: '{path}'")
    if not args.out.parent.is_dir():
        raise DraftwiseError(f"output directory does not exist: '{args.out.parent}'")


def _jsonl_rows(path: Path) -> Iterator[tuple[str, str | None, int]]:
    """(prompt, response or None, bytes read) per line of a JSONL file."""
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                yield "", None, len(raw)
                continue
            try:
                row = json.loads(raw)
                prompt, response = row["prompt"], row.get("response")
            except (ValueError, KeyError, TypeError, AttributeError):
                raise DraftwiseError(
                    f"'{path}' line {lineno} is not a JSON object with a 'prompt'"
                ) from None
            yield str(prompt), (str(response) if response is not None else None), len(raw)


def _chat_text(tok: Tokenizer, prompt: str, response: str | None) -> str:
    """A prompt (and response) as the model sees it: through its chat template if any."""
    if not tok.has_chat_template:
        return prompt if response is None else f"{prompt}\n{response}"
    messages = [{"role": "user", "content": prompt}]
    if response is None:
        return tok.apply_chat_template(messages, add_generation_prompt=True)
    messages.append({"role": "assistant", "content": response})
    return tok.apply_chat_template(messages, add_generation_prompt=False)


def _texts(path: Path, tok: Tokenizer) -> Iterator[tuple[str, int]]:
    """(text, bytes consumed) pieces of one corpus file, streamed."""
    if path.suffix.lower() == ".jsonl":
        for prompt, response, nbytes in _jsonl_rows(path):
            yield (_chat_text(tok, prompt, response) if prompt else ""), nbytes
        return
    with path.open("r", encoding="utf-8", errors="replace") as f:
        block: list[str] = []
        size = 0
        for line in f:
            block.append(line)
            size += len(line)
            if size >= _BLOCK_CHARS:
                text = "".join(block)
                yield text, len(text.encode("utf-8"))
                block, size = [], 0
        if block:
            text = "".join(block)
            yield text, len(text.encode("utf-8"))


def corpus_streams(
    paths: list[Path], tok: Tokenizer, advance: Callable[[int], None]
) -> Iterator[np.ndarray]:
    """Token arrays of every text of every corpus file, tokenized in batches."""
    for path in paths:
        batch: list[str] = []
        done = 0
        for text, nbytes in _texts(path, tok):
            done += nbytes
            if text:
                batch.append(text)
            if len(batch) >= _BATCH:
                yield from _encode(tok, batch)
                batch = []
                advance(done)
                done = 0
        yield from _encode(tok, batch)
        advance(done)


def _encode(tok: Tokenizer, texts: list[str]) -> Iterator[np.ndarray]:
    if texts:  # one batched call: the tokenizers library spreads it over its threads
        for enc in tok.backend.encode_batch(texts, add_special_tokens=False):
            yield np.asarray(enc.ids, np.int32)


def self_generated(args: argparse.Namespace, n: int) -> Iterator[np.ndarray]:
    """``n`` chat-formatted prompts + sampled continuations, from JSONL corpus prompts."""
    import draftwise

    prompts = [
        p
        for path in args.corpus
        if path.suffix.lower() == ".jsonl"
        for p, _, _ in _jsonl_rows(path)
        if p
    ]
    if not prompts:
        raise DraftwiseError("--self-generate needs a JSONL corpus file with prompts")
    rng = random.Random(args.seed)
    model = draftwise.load(
        args.model, backend=args.backend, dtype=args.dtype, invariant=args.invariant
    )
    for i in range(n):
        prompt = rng.choice(prompts)
        ids = model.encode_prompt(prompt)
        room = model.backend.context_limit - len(ids) - 1
        if room < 8:
            continue
        last = None
        for last in draftwise.stream_generate(  # noqa: B007 (only the last response counts)
            model, ids, max_tokens=min(args.gen_tokens, room), temp=args.temp, seed=args.seed + i
        ):
            pass
        if last is not None:
            yield np.asarray(ids + last.token_ids, np.int32)


def main(args: argparse.Namespace) -> int:
    from draftwise.models.resolve import resolve_model
    from draftwise.models.tokenizer import Tokenizer

    _check_args(args)
    tok = Tokenizer.from_dir(resolve_model(args.model))
    total = sum(os.path.getsize(p) for p in args.corpus)
    from tqdm import tqdm

    bar = tqdm(total=total, unit="B", unit_scale=True, desc="counting", disable=args.quiet)
    n_tokens = 0

    def count(n: int) -> None:
        nonlocal n_tokens
        n_tokens += n

    def streams() -> Iterator[np.ndarray]:
        yield from corpus_streams(list(args.corpus), tok, bar.update)
        bar.close()
        if args.self_generate:
            gen_bar = tqdm(total=args.self_generate, desc="self-generating", disable=args.quiet)
            for ids in self_generated(args, args.self_generate):
                gen_bar.update(1)
                yield ids
            gen_bar.close()

    t0 = time.perf_counter()
    table = build_frozen_table(
        streams(), args.ll, args.fl, args.lc, args.fc, progress=count, max_keys=args.max_keys
    )
    table.save(args.out, tok.identity())
    print(
        f"wrote '{args.out}': {len(table)} leaders, {table.followers.shape[0]} followers "
        f"from {n_tokens} tokens in {time.perf_counter() - t0:.1f} s "
        f"({os.path.getsize(args.out) / 2**20:.2f} MiB on disk, "
        f"{table.nbytes / 2**20:.2f} MiB in memory)"
    )
    return 0
