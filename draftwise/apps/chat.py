"""``draftwise chat``: a multi-turn chat in the terminal, answers streamed as they decode.

Commands: ``/reset`` (forget the conversation), ``/stats`` (speed so far), ``/quit``.
Ctrl-C stops the current answer and keeps the session; Ctrl-D or /quit leaves. The
drafter's learnt state carries across turns, and with ``--cache-dir`` across runs.

Example::

    draftwise chat --drafter cacheback --cache-dir ~/.cache/draftwise/chat
"""

from __future__ import annotations

import argparse
import signal
from dataclasses import dataclass
from types import FrameType
from typing import Any

from draftwise.apps.common import (
    add_drafter_args,
    add_model_args,
    add_sampling_args,
    sampling_kwargs,
)
from draftwise.errors import DraftwiseError

HELP = "commands: /reset  /stats  /quit   (Ctrl-C stops an answer, Ctrl-D quits)"


@dataclass
class ChatStats:
    """Running totals over the answers of this chat."""

    tokens: int = 0
    steps: int = 0
    seconds: float = 0.0  # decode time, prefill excluded
    answers: int = 0
    last_tps: float = 0.0

    def add(self, tokens: int, steps: int, tps: float) -> None:
        self.tokens += tokens
        self.steps += steps
        self.seconds += tokens / tps if tps > 0 else 0.0
        self.answers += 1
        self.last_tps = tps


def setup_arg_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="draftwise chat", description=__doc__)
    add_model_args(p)
    add_drafter_args(p)
    add_sampling_args(p)
    p.add_argument("--system", default=None, help="system prompt for the conversation")
    p.add_argument(
        "--cache-dir",
        default=None,
        help="load drafter state from this directory on start, save it on exit",
    )
    return p


def fit_history(model: Any, messages: list[dict[str, str]], reserve: int) -> tuple[list[int], int]:
    """Drop the oldest turns (keeping a system message) until the chat plus ``reserve``
    new tokens fits the context; returns the prompt ids and how many messages were dropped."""
    limit = model.backend.context_limit
    dropped = 0
    while True:
        ids = model.encode_prompt(messages)
        if len(ids) + reserve <= limit:
            return ids, dropped
        first = 1 if messages[0]["role"] == "system" else 0
        if len(messages) - first <= 1:
            raise DraftwiseError(
                f"this message has {len(ids)} tokens; the context limit is {limit}"
            )
        del messages[first : first + 2]  # one user turn and its answer
        dropped += 2


def measure_plain(session: Any, messages: list[dict[str, str]], kwargs: dict[str, Any]) -> float:
    """Milliseconds per token of plain decoding (no drafter) right now, on this chat."""
    opts = {**kwargs, "drafter": "none", "max_tokens": 16}
    last = None
    for r in session.stream(messages, **opts):
        last = r
    if last is None or last.generation_tps <= 0:
        return 0.0
    return 1e3 / last.generation_tps


def print_stats(
    session: Any, stats: ChatStats, messages: list[dict[str, str]], kwargs: dict[str, Any]
) -> None:
    if stats.answers == 0:
        print("[no answers yet]")
        return
    tps = stats.tokens / stats.seconds if stats.seconds else 0.0
    mean = stats.tokens / max(stats.steps, 1)
    print(
        f"[{stats.answers} answers, {stats.tokens} tokens, {tps:.1f} tok/s overall, "
        f"{stats.last_tps:.1f} tok/s last answer, {mean:.2f} tokens/step, "
        f"drafter {kwargs['drafter']}]"
    )
    if kwargs["drafter"] == "none" or len(messages) < 2:
        return
    plain_ms = measure_plain(session, messages[:-1], kwargs)
    spec_ms = 1e3 / stats.last_tps if stats.last_tps else 0.0
    if plain_ms and spec_ms:
        print(
            f"[one-off check now: plain decoding {plain_ms:.1f} ms/token over 16 tokens, "
            f"last answer {spec_ms:.1f} ms/token: about {plain_ms / spec_ms:.2f}x "
            f"(rough; use `draftwise bench` for a real comparison)]"
        )


def answer(
    session: Any, messages: list[dict[str, str]], kwargs: dict[str, Any], stats: ChatStats
) -> str:
    """Stream one answer; Ctrl-C cancels it at the next step (a second Ctrl-C raises)."""
    parts: list[str] = []
    last = None
    interrupted = False

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        nonlocal interrupted
        if interrupted:
            raise KeyboardInterrupt
        interrupted = True
        session.cancel()

    previous = signal.signal(signal.SIGINT, on_sigint)
    stream = session.stream(messages, **kwargs)
    try:
        for last in stream:
            print(last.text, end="", flush=True)
            parts.append(last.text)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        stream.close()  # the decoder rewinds its cache, the session lock is released
        signal.signal(signal.SIGINT, previous)
    print()
    if interrupted:
        print("[stopped]")
    if last is not None:
        stats.add(last.generation_tokens, last.steps, last.generation_tps)
    return "".join(parts)


def main(args: argparse.Namespace) -> int:
    from draftwise.session import Session

    kwargs = sampling_kwargs(args)
    session = Session(
        args.model, backend=args.backend, dtype=args.dtype, cache_dir=args.cache_dir,
        invariant=args.invariant,
    )
    session.check_loaded()  # a corrupt state file: refuse to start, leave it untouched
    session.model.drafter(args.drafter)  # the long-lived drafter of this chat
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages: list[dict[str, str]] = list(system)
    stats = ChatStats()
    reserve = min(args.max_tokens, session.model.backend.context_limit // 4)
    print(f"draftwise chat: {session.model.model_dir.name}, drafter {args.drafter}. {HELP}")
    try:
        while True:
            try:
                line = input(">> ")
            except EOFError:
                print()
                break
            except KeyboardInterrupt:
                print()
                continue
            text = line.strip()
            if not text:
                continue
            if text in ("/quit", "/exit", "/q"):
                break
            if text == "/reset":
                messages = list(system)
                print("[conversation reset]")
                continue
            if text == "/stats":
                print_stats(session, stats, messages, kwargs)
                continue
            if text.startswith("/"):
                print(f"[unknown command {text.split()[0]!r}; {HELP}]")
                continue
            messages.append({"role": "user", "content": line})
            try:
                _, dropped = fit_history(session.model, messages, reserve)
            except DraftwiseError as exc:
                messages.pop()
                print(f"[{exc}]")
                continue
            if dropped:
                print(f"[context full: dropped the {dropped} oldest messages]")
            reply = answer(session, messages, kwargs, stats)
            messages.append({"role": "assistant", "content": reply})
    finally:
        session.close()  # saves drafter state with --cache-dir
    return 0
