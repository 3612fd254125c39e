"""Run every method over the prompts, interleaved prompt by prompt, and time each turn.

Each item is one conversation: its user turns are asked in order with the chat template,
and each method's own previous answer goes into the history (as Spec-Bench does). All
methods run in this process on the same prompt before the next prompt starts, after
one unrecorded warm-up generation each; the order of methods rotates from prompt to prompt
(and repeat to repeat) so that none always runs first.

What a turn's time includes: ``wall_s`` is measured around the whole generation, from
the prompt ids (already tokenized) to the last token, prefill included. The KV cache is
cleared before every turn, so every turn prefills its whole prompt, as the peers do
(draftwise would otherwise reuse the cached prefix of the previous turn or method).
``prefill_s`` is the time until the first token; ``decode_s = wall_s - prefill_s``.

Example::

    >>> model = draftwise.load()  # doctest: +SKIP
    >>> methods = [DraftwiseMethod(model, n, {}) for n in ("none", "cacheback")]  # doctest: +SKIP
    >>> records = run_bench(methods, items, Chat(model.tokenizer), BenchConfig(max_tokens=64))
    ... # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from draftwise.apps.bench.prompts import BenchItem
from draftwise.apps.bench.records import BASELINE, DRAFTER, TurnRecord, TurnResult
from draftwise.errors import DraftwiseError
from draftwise.models.tokenizer import Tokenizer

BASELINE_NAME = "none"


class Method(Protocol):
    """Something that turns prompt ids into a timed generation."""

    name: str
    kind: str

    def reset_state(self) -> None:
        """Forget what was learnt from earlier prompts (a fresh drafter)."""

    def generate(self, ids: list[int], max_tokens: int) -> TurnResult:
        """Generate after ``ids``; at most ``max_tokens`` tokens, timed."""


def _cuda_sync(backend_name: str) -> Callable[[], None]:
    if "cuda" not in backend_name:
        return lambda: None
    import torch

    return torch.cuda.synchronize


def split_threads(name: str) -> tuple[str, int | None]:
    """A bench method name: a drafter spec, optionally ``@N`` (the model computes with
    N CPU threads for this method).

    >>> split_threads("card:layers=8,threads=1@1")
    ('card:layers=8,threads=1', 1)
    >>> split_threads("none")
    ('none', None)
    """
    spec, at, n = name.rpartition("@")
    if not at:
        return name, None
    if not n.isdigit() or int(n) < 1:
        raise DraftwiseError(f"bench method {name!r}: '@' must be followed by a thread count >= 1")
    return spec, int(n)


class DraftwiseMethod:
    """``draftwise.stream_generate`` with a named drafter of one loaded model.

    ``name`` may end in ``@N``: the model then computes with N threads for this method
    (torch on CPU), and with ``default_threads`` for the others, so a thread split (the
    model on 1 thread beside CARD's 1-thread worker, against 2 threads sequential) is
    measured in one run."""

    def __init__(
        self,
        model: Any,
        name: str,
        gen_kwargs: Mapping[str, Any],
        default_threads: int | None = None,
        label: str | None = None,
        kind: str | None = None,
    ) -> None:
        """``label``/``kind``: how the results name and count it (default: the drafter
        name; ``none`` is the baseline). The float32 reference is ``none`` on a second
        model, labelled ``none@float32`` of kind ``reference``."""
        self.model = model
        self.name = label or name
        self.spec, threads = split_threads(name)
        self.drafter = self.spec
        self.threads = threads or default_threads
        self.kind = kind or (BASELINE if name == BASELINE_NAME else DRAFTER)
        self.gen_kwargs = dict(gen_kwargs)
        self._sync = _cuda_sync(model.backend.name)

    def layout(self) -> dict[str, Any]:
        """Where this method computes: the model's threads and CARD's worker, if any."""
        worker = getattr(self.model.drafter(self.spec), "layout", None)
        return {"model_threads": self.threads, "draft_worker": worker}

    def stats(self) -> dict[str, int]:
        """The drafter's own counters over the run, if it keeps any (CARD's worker)."""
        stats = getattr(self.model.drafter(self.spec), "stats", None)
        return dict(stats()) if callable(stats) else {}

    def reset_state(self) -> None:
        self.model.drafter(self.spec).reset()

    def generate(self, ids: list[int], max_tokens: int) -> TurnResult:
        import draftwise

        self.model.decoder.reset()  # a full prefill every turn, like the peers
        if self.threads is not None:
            self.model.set_threads(self.threads)
        lengths: list[int] = []
        trees: list[int] = []
        beams: list[list[int]] = []  # [width, length] per step; [0, 0]: no beams that step
        last = None
        self._sync()
        t0 = time.perf_counter()
        for r in draftwise.stream_generate(
            self.model, ids, drafter=self.spec, max_tokens=max_tokens, **self.gen_kwargs
        ):
            lengths.append(len(r.tokens))
            trees.append(r.drafted)
            beams.append(list(r.beam) if r.beam is not None else [0, 0])
            last = r
        self._sync()
        wall = time.perf_counter() - t0
        if last is None:  # stream_generate always yields at least one step
            raise RuntimeError("generation produced no steps")
        return TurnResult(
            token_ids=list(last.token_ids),
            wall_s=wall,
            prefill_s=min(last.prompt_tokens / last.prompt_tps, wall),
            accept_lengths=lengths,
            tree_sizes=trees,
            beams=beams if any(b[0] for b in beams) else [],
            draft_ms=last.draft_ms,
            verify_ms=last.verify_ms,
            finish_reason=last.finish_reason,
        )


class Chat:
    """Builds each turn's prompt ids and the text of an answer for the history."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        if self.tokenizer.has_chat_template:
            return self.tokenizer.encode_chat(messages)
        text = "\n\n".join(m["content"] for m in messages) + "\n\n"  # no template: plain text
        return self.tokenizer.encode(text, add_special_tokens=True)

    def answer(self, token_ids: Sequence[int]) -> str:
        """The answer as it goes into the history: special tokens dropped, stripped."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True).strip()


def run_conversation(
    method: Method, item: BenchItem, chat: Chat, max_tokens: int
) -> list[tuple[int, TurnResult]]:
    """Ask ``item``'s turns in order; returns (prompt tokens, result) per turn."""
    messages: list[dict[str, str]] = []
    out: list[tuple[int, TurnResult]] = []
    for text in item.turns:
        messages.append({"role": "user", "content": text})
        ids = chat.encode(messages)
        res = method.generate(ids, max_tokens)
        out.append((len(ids), res))
        messages.append({"role": "assistant", "content": chat.answer(res.token_ids)})
    return out


@dataclass
class BenchConfig:
    max_tokens: int
    repeats: int = 1  # runs per (prompt, method); the median-time run is kept
    lifetime: bool = False  # two passes, drafters never reset between prompts
    warmup_tokens: int = 32


def median_records(
    method: Method,
    item: BenchItem,
    runs: Sequence[Sequence[tuple[int, TurnResult]]],
    pass_no: int,
) -> list[TurnRecord]:
    """One record per turn: the repeat with the median wall time (lower median if even)."""
    records = []
    for t in range(len(runs[0])):
        cands = sorted((run[t] for run in runs), key=lambda c: c[1].wall_s)
        n_prompt, res = cands[(len(cands) - 1) // 2]
        rec = TurnRecord.from_result(
            res,
            method=method.name,
            kind=method.kind,
            prompt_id=item.id,
            category=item.category,
            turn=t + 1,
            prompt_tokens=n_prompt,
            pass_no=pass_no,
        )
        rec.wall_s_repeats = [run[t][1].wall_s for run in runs]
        records.append(rec)
    return records


def warm_up(methods: Sequence[Method], item: BenchItem, chat: Chat, tokens: int) -> None:
    """One unrecorded generation per method, then fresh drafter state."""
    ids = chat.encode([{"role": "user", "content": item.turns[0]}])
    for m in methods:
        m.generate(ids, tokens)
        m.reset_state()


def rotated(methods: Sequence[Method], k: int) -> list[Method]:
    """``methods`` starting at index ``k`` (mod n): no method always runs first or last.

    Example::

        >>> rotated(["a", "b", "c"], 4)
        ['b', 'c', 'a']
    """
    k %= len(methods)
    return [*methods[k:], *methods[:k]]


def run_bench(
    methods: Sequence[Method],
    items: Sequence[BenchItem],
    chat: Chat,
    cfg: BenchConfig,
    on_run: Callable[[str], None] | None = None,
    on_item: Callable[[list[TurnRecord]], None] | None = None,
) -> list[TurnRecord]:
    """Measure every method on every item; ``on_run(method)`` after each conversation,
    ``on_item(records so far)`` after each item (for progress and checkpoints)."""
    records: list[TurnRecord] = []
    if not items or not methods:
        return records
    warm_up(methods, items[0], chat, min(cfg.warmup_tokens, cfg.max_tokens))
    for pass_no in range(1, 3 if cfg.lifetime else 2):
        for i, item in enumerate(items):
            runs: dict[str, list[list[tuple[int, TurnResult]]]] = {m.name: [] for m in methods}
            for rep in range(cfg.repeats):
                for m in rotated(methods, i + rep):
                    if not cfg.lifetime:
                        m.reset_state()  # each prompt starts from a fresh drafter
                    runs[m.name].append(run_conversation(m, item, chat, cfg.max_tokens))
                    if on_run is not None:
                        on_run(m.name)
            for m in methods:
                records += median_records(m, item, runs[m.name], pass_no)
            if on_item is not None:
                on_item(records)
    return records
