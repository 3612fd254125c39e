"""The Python API, shaped like mlx-lm's: ``load``, ``stream_generate``, ``generate``.

Example::

    import draftwise
    model = draftwise.load()                       # the embedded SmolLM2-135M-Instruct
    print(draftwise.generate(model, "Name three primes.", max_tokens=32))
    for r in draftwise.stream_generate(model, "Hi!", drafter="cacheback"):
        print(r.text, end="", flush=True)

``stream_generate`` yields one ``GenerationResponse`` per verification step: the new text,
the tokens emitted in that step (``from_draft`` of them were drafted tokens the model
accepted), and running statistics.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftwise.backends.select import BACKENDS, make_backend, resolve_backend_name
from draftwise.core.backend import Backend
from draftwise.core.decode import Decoder, check_prompt, check_request
from draftwise.core.drafters import Drafter
from draftwise.core.drafters.base import close_drafter
from draftwise.core.sampling import SamplingParams
from draftwise.drafting import Assets, DraftingContext, build_drafter, check_spec, tqdm_progress
from draftwise.drafting.progress import ProgressFactory
from draftwise.errors import DraftwiseError
from draftwise.models.resolve import resolve_model
from draftwise.models.tokenizer import StreamingDetokenizer, Tokenizer

Prompt = str | Sequence[int] | Sequence[dict[str, str]]
__all__ = ["BACKENDS", "GenerationResponse", "Model", "generate", "load", "stream_generate"]
MAX_NAMED_DRAFTERS = 16  # drafters with learnt state a Model keeps (LRU beyond that)


@dataclass
class GenerationResponse:
    """One verification step of a generation, with running totals."""

    text: str  # text completed by this step
    tokens: list[int]  # token ids emitted by this step
    from_draft: int  # how many of ``tokens`` were drafted and accepted
    prompt_tokens: int
    prompt_tps: float
    generation_tokens: int  # emitted so far
    generation_tps: float
    steps: int  # verification passes so far
    mean_accepted: float  # tokens per step so far (accepted drafts + the bonus token)
    draft_ms: float  # total drafting time so far
    verify_ms: float  # total verification time so far
    finish_reason: str | None = None  # "stop", "length" or None
    token_ids: list[int] = field(default_factory=list)  # all emitted ids, on the last response
    drafted: int = 0  # draft-tree nodes verified by this step (the budget the drafter used)
    mean_drafted: float = 0.0  # tree nodes per step so far
    plain_steps: int = 0  # steps so far that verified no draft (plain one-token steps)
    beam: tuple[int, int] | None = None  # (width, length) of this step's beams (redrafter)

    @property
    def token(self) -> int:
        return self.tokens[-1]


class Model:
    """A loaded model: backend (weights + KV cache), tokenizer and decoder.

    One generation at a time: a second ``stream_generate`` started while another is alive
    on the same model raises ``DraftwiseError`` (both would share one KV cache);
    ``draftwise.Session`` queues generations from several threads instead.
    ``assets`` finds, builds and caches what drafters need (cost profile, bigram table);
    ``drafting`` is the context every drafter of this model is built from.
    """

    def __init__(
        self, backend: Backend, tokenizer: Tokenizer, model_dir: Path,
        progress: ProgressFactory | None = tqdm_progress,
    ) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.model_dir = model_dir
        self.decoder = Decoder(backend)
        tok = tokenizer.identity()
        self.assets = Assets(backend, model_dir, tok, progress, on_backend_reset=self.decoder.reset)
        self.drafting = DraftingContext.for_backend(backend, self.assets, tok, progress)
        # named drafters keep their state; the least recently used beyond the cap go
        self.drafters: OrderedDict[str, Drafter] = OrderedDict()
        self._live = threading.Lock()  # held by the one live generation

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the model for one generation; raise if another one is alive."""
        if not self._live.acquire(blocking=False):
            raise DraftwiseError(
                "this model is already generating: finish or close() the other "
                "stream_generate first (two would corrupt its KV cache), or use "
                "draftwise.Session, which queues generations"
            )
        try:
            yield
        finally:
            self._live.release()

    def drafter(self, spec: str | Drafter, **options: Any) -> Drafter:
        """The drafter for ``spec``: a Drafter is used as is; a spec (``"cacheback:fl=2"``,
        ``"auto"``, ``"ngrammys+ssd"``) gives this model's long-lived drafter of that spec,
        built on first use (with ``options`` given as Python values, it is built anew)."""
        if not isinstance(spec, str):
            return spec
        if not options and spec in self.drafters:
            self.drafters.move_to_end(spec)
            return self.drafters[spec]
        key = str(check_spec(spec, objects=options))  # canonical text: one drafter per spec
        if options or key not in self.drafters:
            self.drafters[key] = build_drafter(key, self.drafting, **options)
        self.drafters.move_to_end(key)
        while len(self.drafters) > MAX_NAMED_DRAFTERS:
            close_drafter(self.drafters.popitem(last=False)[1])  # e.g. stop a worker thread
        return self.drafters[key]

    def set_threads(self, n: int) -> int:
        """CPU threads the model computes with in the calling thread (torch on CPU; the
        bench uses it for thread splits); returns the previous count.
        Example: ``old = model.set_threads(1)``."""
        if not self.backend.name.startswith("torch-cpu"):
            raise DraftwiseError(f"thread counts are set for torch on CPU only, not {self.backend.name!r}")
        if n < 1:
            raise DraftwiseError(f"threads must be >= 1, got {n}")
        import torch

        old = torch.get_num_threads()
        torch.set_num_threads(n)
        return old

    def close_drafters(self) -> None:
        """Release what the named drafters hold (CARD's worker threads); they restart on
        their next use."""
        for d in self.drafters.values():
            close_drafter(d)

    def encode_prompt(self, prompt: Prompt, chat_template: bool = True) -> list[int]:
        """Token ids for a string (chat template applied when the model has one and
        ``chat_template``), a message list, or ids given directly."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise DraftwiseError("the prompt is empty: give some text")
            if chat_template and self.tokenizer.has_chat_template:
                return self.tokenizer.encode_chat([{"role": "user", "content": prompt}])
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        items = list(prompt)
        if not items:
            raise DraftwiseError("the prompt is empty: give some text")
        if all(isinstance(m, dict) for m in items):
            for m in items:
                if "role" not in m or "content" not in m:
                    raise DraftwiseError(f"chat message needs 'role' and 'content': {m!r}")
            return self.tokenizer.encode_chat(list(items))  # type: ignore[arg-type]
        ids = [int(t) for t in items]  # type: ignore[arg-type]
        bad = [t for t in ids if not 0 <= t < self.backend.vocab_size]
        if bad:
            raise DraftwiseError(f"token id {bad[0]} is outside the vocabulary (0..{self.backend.vocab_size - 1})")
        return ids


def load(
    model: str | os.PathLike[str] | None = None,
    backend: str = "auto",
    dtype: str | None = None,
    invariant: bool | str = "auto",
    download: bool = True,
) -> Model:
    """Load a model: ``None`` for the embedded default, a local HF-format directory, a
    GGUF file (converted once into the cache), or a Hugging Face Hub name ``ORG/NAME``
    (the hub cache first; downloaded unless ``download=False`` or ``HF_HUB_OFFLINE=1``).
    ``backend``: auto, torch, cuda or mlx."""
    model_dir = resolve_model(model, download=download)
    if dtype is None and resolve_backend_name(backend) == "torch":
        dtype, invariant = _recorded_torch_mode(invariant, model_dir)
    be = make_backend(backend, model_dir, dtype, invariant)
    return Model(be, Tokenizer.from_dir(model_dir), model_dir)


def _recorded_torch_mode(
    invariant: bool | str, model_dir: Path
) -> tuple[str | None, bool | str]:
    """The mode ``draftwise tune --modes`` recorded for this device, if any: (dtype,
    invariant); else (None, ``invariant``) and the backend's built-in rule applies. A
    record applies only where it names a lossless mode for this model (``4bit`` only for
    a Q4 GGUF's model, which it computes exactly; not float32 without the batch-invariant
    mode on a CPU, which records before 2026-11-29 could name)."""
    from draftwise.backends.cuda.backend import _pick_device
    from draftwise.backends.cuda.modes import lossless_modes, mode_key
    from draftwise.drafting.assets import recorded_mode

    entry = recorded_mode(mode_key())
    if entry is None:
        return None, invariant
    recorded = (str(entry.get("dtype")), entry.get("invariant"))
    if recorded not in lossless_modes(model_dir, _pick_device("auto")):
        return None, invariant
    inv = invariant if invariant != "auto" else bool(entry.get("invariant", "auto"))
    return str(entry["dtype"]), inv


def measure_modes(
    model: str | os.PathLike[str] | None = None, reps: int = 3
) -> tuple[dict[str, dict[int, float]], str, Path]:
    """Measure every lossless torch mode's verify-cost curve on this device (each stored
    as ``draftwise tune`` stores one), record the cheapest as this device's default, and
    return ``(ms per mode per row count at the first context, the pick, the record)``.

    Example::

        ms, pick, path = measure_modes(reps=5)   # e.g. pick == "bfloat16-invariant"
    """
    from draftwise.backends.cuda.backend import _pick_device
    from draftwise.backends.cuda.modes import lossless_modes, mode_key, mode_name, pick_mode
    from draftwise.drafting.assets import record_mode

    table: dict[str, dict[int, float]] = {}
    modes: dict[str, tuple[str, bool]] = {}
    for dtype, inv in lossless_modes(resolve_model(model), _pick_device("auto")):
        m = load(model, backend="torch", dtype=dtype, invariant=inv)
        cost = m.assets.measure_cost_profile(reps=reps)
        name = mode_name(dtype, inv)
        table[name] = {int(r): float(t) for r, t in zip(cost.rows, cost.ms[0])}
        modes[name] = (dtype, inv)
        del m  # one model in memory at a time
    pick = pick_mode(table)
    dtype, inv = modes[pick]
    path = record_mode(mode_key(), {"dtype": dtype, "invariant": inv, "ms": table})
    return table, pick, path


# Names other libraries use for our keywords (transformers, OpenAI, mlx-lm).
OTHER_NAMES = {
    "max_new_tokens": "max_tokens",
    "temperature": "temp",
    "do_sample": "temp (0 = greedy, > 0 samples)",
    "random_seed": "seed",
    "repetition_context_size": "repetition_context",
    "stop_token_ids": "stop",
    "sampler": "temp, top_p, top_k, min_p (or draftwise.mlx_lm for mlx-lm's sampler)",
    "logits_processors": "repetition_penalty (or draftwise.mlx_lm for mlx-lm's processors)",
    "draft_model": "drafter",
    "num_draft_tokens": "budget",
}


def check_keywords(unknown: dict[str, Any]) -> None:
    """Raise a one-line ``DraftwiseError`` for the first keyword ``stream_generate`` does
    not take, naming the keyword to use instead.

    Example::

        >>> check_keywords({"max_new_tokens": 32})
        Traceback (most recent call last):
        draftwise.errors.DraftwiseError: unknown keyword 'max_new_tokens': use max_tokens=
    """
    import difflib
    import inspect

    if not unknown:
        return
    name = next(iter(unknown))
    known = [p for p in inspect.signature(stream_generate).parameters][2:-1]  # options only
    if name in OTHER_NAMES:
        other = OTHER_NAMES[name]
        hint = f"use {other}" if " " in other else f"use {other}="
    elif close := difflib.get_close_matches(name, known, n=1):
        hint = f"did you mean {close[0]}=?"
    else:
        hint = f"stream_generate takes {', '.join(known)}"
    raise DraftwiseError(f"unknown keyword {name!r}: {hint}")


def stream_generate(
    model: Model,
    prompt: Prompt,
    *,
    drafter: str | Drafter = "auto",
    max_tokens: int = 256,
    temp: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    repetition_penalty: float = 1.0,
    seed: int | None = None,
    budget: int = 16,
    chat_template: bool = True,
    stop: Sequence[int] = (),
    repetition_context: int = 64,
    temperature: float | None = None,
    **unknown: Any,
) -> Iterator[GenerationResponse]:
    """Generate from ``prompt``, yielding a ``GenerationResponse`` per step.

    ``temperature=`` is accepted as another name for ``temp=``; any other unknown
    keyword is a ``DraftwiseError`` that names the keyword to use instead. Raises
    ``DraftwiseError`` when another generation is alive on ``model`` (one KV cache).
    """
    check_keywords(unknown)
    if temperature is not None:
        if temp not in (0.0, temperature):
            raise DraftwiseError(
                f"give the temperature once: temp={temp!r} and temperature={temperature!r}"
            )
        temp = temperature
    with model.exclusive():
        yield from _generate(
            model, prompt, drafter=drafter, max_tokens=max_tokens, temp=temp, top_p=top_p,
            top_k=top_k, min_p=min_p, repetition_penalty=repetition_penalty, seed=seed,
            budget=budget, chat_template=chat_template, stop=stop,
            repetition_context=repetition_context,
        )


def _generate(
    model: Model,
    prompt: Prompt,
    *,
    drafter: str | Drafter,
    max_tokens: int,
    temp: float,
    top_p: float,
    top_k: int,
    min_p: float,
    repetition_penalty: float,
    seed: int | None,
    budget: int,
    chat_template: bool,
    stop: Sequence[int],
    repetition_context: int,
) -> Iterator[GenerationResponse]:
    params = SamplingParams(
        temperature=temp, top_p=top_p, top_k=top_k, min_p=min_p,
        repetition_penalty=repetition_penalty, repetition_context=repetition_context,
    )
    # sizes first, before the prompt is encoded or a drafter built (both can take seconds)
    check_request(max_tokens, budget)
    ids = model.encode_prompt(prompt, chat_template)
    # and its length, before a drafter is built (``auto`` may measure the device first)
    check_prompt(len(ids), model.backend.context_limit)
    d = model.drafter(drafter)
    detok = StreamingDetokenizer(model.tokenizer)
    stop_ids = frozenset(model.tokenizer.eos_token_ids) | frozenset(stop)
    t_start = time.perf_counter()
    t_first: float | None = None
    n_tokens = steps = from_draft_total = drafted_total = plain_steps = 0
    draft_s = verify_s = 0.0
    emitted: list[int] = []
    for step in model.decoder.steps(
        np.asarray(ids), d, params, max_tokens, seed=seed, stop_ids=stop_ids, budget=budget
    ):
        now = time.perf_counter()
        if t_first is None:
            t_first = now - step.verify_s - step.draft_s  # prefill ended before step one
        steps += 1
        n_tokens += len(step.tokens)
        from_draft = min(step.accepted, len(step.tokens))
        from_draft_total += from_draft
        drafted_total += step.drafted
        plain_steps += step.drafted == 0
        draft_s += step.draft_s
        verify_s += step.verify_s
        emitted += step.tokens
        visible = [t for t in step.tokens if t not in stop_ids]
        text = detok.add(visible)
        if step.finish_reason is not None:
            text += detok.finalize()
            model.assets.replace_drifted()  # live timings disagreed with the stored curve
        gen_time = max(now - t_first, 1e-9)
        prompt_time = max(t_first - t_start, 1e-9)
        yield GenerationResponse(
            text=text,
            tokens=step.tokens,
            from_draft=from_draft,
            prompt_tokens=len(ids),
            prompt_tps=len(ids) / prompt_time,
            generation_tokens=n_tokens,
            generation_tps=n_tokens / gen_time,
            steps=steps,
            mean_accepted=n_tokens / steps,
            draft_ms=draft_s * 1e3,
            verify_ms=verify_s * 1e3,
            finish_reason=step.finish_reason,
            token_ids=list(emitted) if step.finish_reason is not None else [],
            drafted=step.drafted,
            mean_drafted=drafted_total / steps,
            plain_steps=plain_steps,
            beam=step.beam,
        )


def generate(model: Model, prompt: Prompt, **kwargs: Any) -> str:
    """Generate and return the whole text (see ``stream_generate`` for the options)."""
    return "".join(r.text for r in stream_generate(model, prompt, **kwargs))
