"""mlx-lm's ``stream_generate`` and ``generate`` on draftwise's lossless engine.

``stream_generate(model, tokenizer, prompt, max_tokens=256, draft_model=None, **kwargs)``
yields one ``GenerationResponse`` per token, as mlx-lm does, although draftwise emits
several tokens per verification step: the tokens of a step come out one by one, and
``from_draft`` tells which of them were drafted (and accepted) rather than sampled from
the model's own pass. The prompt is read as mlx-lm reads it (a string is encoded without
the chat template; see ``TokenizerWrapper.encode_prompt``), and the text is exactly
``draftwise.generate(model, ids, ...)``'s for the same settings.

Example::

    >>> from draftwise.mlx_lm import load, stream_generate  # doctest: +SKIP
    >>> model, tokenizer = load()  # doctest: +SKIP
    >>> for r in stream_generate(model, tokenizer, "Once upon", max_tokens=8):  # doctest: +SKIP
    ...     print(r.text, end="", flush=True)

Keywords beyond mlx-lm's: ``drafter`` (a draftwise drafter spec, default ``"auto"``),
``budget`` (draft tree size) and ``seed`` (mlx-lm seeds sampling with
``mx.random.seed``; draftwise draws its uniforms from ``seed``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from draftwise.errors import DraftwiseError
from draftwise.mlx_lm.sample_utils import sampling_options
from draftwise.mlx_lm.tokenizer_utils import TokenizerWrapper

# mlx-lm ``generate_step`` options that do not change the output here.
IGNORED = frozenset({"prefill_step_size", "kv_group_size", "quantized_kv_start", "stream"})
# mlx-lm options that would change it, with what they ask for; only their "off" is taken.
UNSUPPORTED = {
    "max_kv_size": "a rotating KV cache",
    "prompt_cache": "a prompt cache",
    "kv_bits": "a quantized KV cache",
    "input_embeddings": "input embeddings",
    "prompt_progress_callback": "a prompt progress callback",
}
DRAFTWISE_OPTIONS = ("drafter", "budget", "seed")


@dataclass
class GenerationResponse:
    """One generated token, with mlx-lm's fields.

    ``logprobs`` is always None: draftwise's engine does not compute the log-probability
    vector of each emitted token, and made-up numbers would be worse than none.
    ``peak_memory`` (GB) is MLX's peak memory on the MLX backend, CUDA's peak allocation on
    a GPU, and the process's peak resident memory on a CPU.
    """

    text: str
    token: int
    logprobs: None
    from_draft: bool
    prompt_tokens: int
    prompt_tps: float
    generation_tokens: int
    generation_tps: float
    peak_memory: float
    finish_reason: str | None = None
    mean_accepted: float = 0.0  # draftwise: tokens per verification step so far


def draft_model_drafter(draft_model: Any, num_draft_tokens: int | None = None) -> str | None:
    """The draftwise drafter spec for mlx-lm's ``draft_model=`` / ``num_draft_tokens=``:
    None when no draft model is given (``num_draft_tokens`` then means nothing, as in
    mlx-lm). The one place where draft models get wired to draftwise's draft-model drafter.

    A draft model (a path, or a model from ``load``) drafts a greedy chain of
    ``num_draft_tokens`` (mlx-lm's default 2) with draftwise's ``draft`` drafter; its
    tokenizer must be the target's (checked when the drafter is built).

    Example::

        >>> draft_model_drafter(None, 3) is None
        True
        >>> draft_model_drafter("/models/draft", 3)
        'draft:model=/models/draft,beam=1,topk=1,depth=3'
    """
    if draft_model is None:
        return None
    model_dir = getattr(draft_model, "model_dir", None)  # a model from draftwise's load()
    path = os.fspath(model_dir if model_dir is not None else draft_model) \
        if isinstance(model_dir or draft_model, (str, os.PathLike)) else None
    if path is None:
        raise DraftwiseError(
            f"draft_model must be a path or a model from load(), got {_short(draft_model)}"
        )
    if any(c in path for c in ",+:=") or not path.strip():
        raise DraftwiseError(f"draft_model path {path!r} may not contain ',', '+', ':' or '='")
    n = 2 if num_draft_tokens is None else num_draft_tokens
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 64:
        raise DraftwiseError(f"num_draft_tokens must be an integer in 1..64, got {n!r}")
    return f"draft:model={path},beam=1,topk=1,depth={n}"


def stream_generate(
    model: Any,
    tokenizer: TokenizerWrapper,
    prompt: Any,
    max_tokens: int = 256,
    draft_model: Any = None,
    **kwargs: Any,
) -> Iterator[GenerationResponse]:
    """Generate from ``prompt`` (text or token ids), yielding a response per token."""
    import draftwise
    from draftwise.models.tokenizer import StreamingDetokenizer

    _check_pair(model, tokenizer)
    options = _options(kwargs, draft_model)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise DraftwiseError(
            f"max_tokens must be >= 1, got {max_tokens!r} (draftwise has no unlimited -1)"
        )
    ids = tokenizer.encode_prompt(prompt)
    eos = tokenizer.eos_token_ids
    extra_stop = sorted(eos - model.tokenizer.eos_token_ids)  # from add_eos_token
    detok = StreamingDetokenizer(model.tokenizer)
    steps = draftwise.stream_generate(
        model, ids, max_tokens=max_tokens, stop=extra_stop, chat_template=False, **options
    )
    n = 0
    try:
        for r in steps:
            gen_s = r.generation_tokens / r.generation_tps  # seconds since the prefill
            memory = peak_memory_gb(model)
            for i, token in enumerate(r.tokens):
                n += 1
                last = r.finish_reason is not None and i == len(r.tokens) - 1
                text = "" if token in eos else detok.add([token])
                if last:
                    text += detok.finalize()
                yield GenerationResponse(
                    text=text,
                    token=token,
                    logprobs=None,
                    from_draft=i < r.from_draft,
                    prompt_tokens=r.prompt_tokens,
                    prompt_tps=r.prompt_tps,
                    generation_tokens=n,
                    generation_tps=n / gen_s,
                    peak_memory=memory,
                    finish_reason=r.finish_reason if last else None,
                    mean_accepted=r.mean_accepted,
                )
    finally:
        steps.close()  # a caller that stops early leaves the model's cache consistent


def generate(
    model: Any, tokenizer: TokenizerWrapper, prompt: Any, verbose: bool = False, **kwargs: Any
) -> str:
    """The whole text of ``stream_generate``; ``verbose`` prints it as it comes, then the
    speeds, as mlx-lm does."""
    if verbose:
        print("=" * 10)
    text = ""
    response = None
    for response in stream_generate(model, tokenizer, prompt, **kwargs):
        if verbose:
            print(response.text, end="", flush=True)
        text += response.text
    if verbose and response is not None:
        print()
        print("=" * 10)
        if not text:
            print("No text generated for this prompt")
        print(f"Prompt: {response.prompt_tokens} tokens, {response.prompt_tps:.3f} tokens-per-sec")
        print(
            f"Generation: {response.generation_tokens} tokens, "
            f"{response.generation_tps:.3f} tokens-per-sec "
            f"({response.mean_accepted:.2f} tokens per step)"
        )
        print(f"Peak memory: {response.peak_memory:.3f} GB")
    return text


def peak_memory_gb(model: Any) -> float:
    """Peak memory so far in GB (see ``GenerationResponse``)."""
    name = model.backend.name
    if name.startswith("mlx"):
        import mlx.core as mx

        return float(mx.get_peak_memory()) / 1e9
    if name.startswith("torch-cuda"):
        import torch

        return float(torch.cuda.max_memory_allocated()) / 1e9
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss * (1 if sys.platform == "darwin" else 1024) / 1e9


def _check_pair(model: Any, tokenizer: Any) -> None:
    from draftwise.api import Model

    if not isinstance(model, Model):
        raise DraftwiseError(
            f"model must come from draftwise.mlx_lm.load, got {type(model).__name__}"
        )
    if not isinstance(tokenizer, TokenizerWrapper):
        raise DraftwiseError(
            f"tokenizer must come from draftwise.mlx_lm.load, got {type(tokenizer).__name__}"
        )
    if tokenizer.tokenizer.identity() != model.tokenizer.identity():
        raise DraftwiseError("the tokenizer belongs to another model than the one given")


def _options(kwargs: dict[str, Any], draft_model: Any) -> dict[str, Any]:
    """``draftwise.stream_generate`` keywords from mlx-lm's (checked: no silent drops)."""
    kwargs = dict(kwargs)
    sampler = kwargs.pop("sampler", None)
    processors = kwargs.pop("logits_processors", None)
    num_draft_tokens = kwargs.pop("num_draft_tokens", None)
    options = sampling_options(sampler, processors)
    options.update({k: kwargs.pop(k) for k in DRAFTWISE_OPTIONS if k in kwargs})
    spec = draft_model_drafter(draft_model, num_draft_tokens)
    if spec is not None:
        options["drafter"] = spec
    for name in list(kwargs):
        if name in IGNORED:
            del kwargs[name]
        elif name in UNSUPPORTED and kwargs[name] is None:
            del kwargs[name]
    if kwargs:
        name = next(iter(kwargs))
        if name in UNSUPPORTED:
            raise DraftwiseError(
                f"{name}={_short(kwargs[name])}: {UNSUPPORTED[name]} is not supported by draftwise"
            )
        hint = ""
        if name in ("temp", "temperature", "top_p", "top_k", "min_p"):
            hint = f": use sampler=make_sampler({'temp' if name == 'temperature' else name}=...)"
        elif name == "repetition_penalty":
            hint = ": use logits_processors=make_logits_processors(repetition_penalty=...)"
        raise DraftwiseError(f"unknown keyword {name!r}{hint}")
    return options


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"<{type(value).__name__}>"
