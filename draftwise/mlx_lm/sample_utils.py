"""mlx-lm's ``make_sampler`` and ``make_logits_processors``, as plain data.

In mlx-lm a sampler is any callable on log-probabilities. draftwise cannot verify drafts
against an arbitrary callable and stay lossless (it must know the distribution a token is
drawn from, to invert it at one uniform number on every schedule), so here the two
factories return small frozen records of their settings, which ``stream_generate`` maps
onto draftwise's ``SamplingParams``. Passing any other callable is a ``DraftwiseError``.

Example::

    >>> sampler = make_sampler(temp=0.7, top_p=0.9)
    >>> processors = make_logits_processors(repetition_penalty=1.1)
    >>> sampling_options(sampler, processors)["temp"]
    0.7

Settings that draftwise's sampler does not implement (XTC, presence and frequency
penalties, logit bias, ``min_tokens_to_keep`` other than 1) raise at once, naming the
setting, rather than being dropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from draftwise.core.sampling import SamplingParams
from draftwise.errors import DraftwiseError


@dataclass(frozen=True)
class Sampler:
    """What ``make_sampler`` returns: draftwise's sampling settings (0 = off, as mlx-lm)."""

    temp: float = 0.0
    top_p: float = 1.0
    min_p: float = 0.0
    top_k: int = 0


@dataclass(frozen=True)
class RepetitionPenalty:
    """A logits processor from ``make_logits_processors``: mlx-lm's repetition penalty."""

    penalty: float
    context_size: int = 20


def make_sampler(
    temp: float = 0.0,
    top_p: float = 0.0,
    min_p: float = 0.0,
    min_tokens_to_keep: int = 1,
    top_k: int = 0,
    xtc_probability: float = 0.0,
    xtc_threshold: float = 0.1,
    xtc_special_tokens: Sequence[int] | None = None,
) -> Sampler:
    """mlx-lm's ``make_sampler``: ``temp`` 0 is greedy; ``top_p`` outside (0, 1) is off.

    Example::

        >>> make_sampler(0.8, top_k=40)
        Sampler(temp=0.8, top_p=1.0, min_p=0.0, top_k=40)
        >>> make_sampler(0.8, xtc_probability=0.5)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        draftwise.errors.DraftwiseError: xtc_probability=0.5: XTC sampling is not supported ...
    """
    if xtc_probability != 0.0:
        _unsupported("xtc_probability", xtc_probability, "XTC sampling", "0.0")
    if min_tokens_to_keep != 1 and min_p != 0.0:
        _unsupported(
            "min_tokens_to_keep", min_tokens_to_keep, "keeping more than one token under min_p", "1"
        )
    if not isinstance(top_p, (int, float)) or not math.isfinite(top_p) or top_p < 0:
        raise DraftwiseError(f"top_p must be in [0, 1] (0 or 1 = off), got {top_p!r}")
    sampler = Sampler(
        temp=float(temp),
        top_p=float(top_p) if 0.0 < top_p < 1.0 else 1.0,
        min_p=float(min_p),
        top_k=int(top_k),
    )
    _params(sampler, ())  # checks every value now, with draftwise's messages
    return sampler


def make_logits_processors(
    logit_bias: Mapping[int, float] | None = None,
    repetition_penalty: float | None = None,
    repetition_context_size: int | None = 20,
    presence_penalty: float | None = None,
    presence_context_size: int | None = 20,
    frequency_penalty: float | None = None,
    frequency_context_size: int | None = 20,
) -> list[RepetitionPenalty]:
    """mlx-lm's ``make_logits_processors``: a list with at most a repetition penalty.

    Example::

        >>> make_logits_processors(repetition_penalty=1.2, repetition_context_size=32)
        [RepetitionPenalty(penalty=1.2, context_size=32)]
        >>> make_logits_processors()
        []
    """
    if logit_bias:
        _unsupported("logit_bias", dict(logit_bias), "a logit bias", "None")
    if presence_penalty:
        _unsupported("presence_penalty", presence_penalty, "a presence penalty", "None")
    if frequency_penalty:
        _unsupported("frequency_penalty", frequency_penalty, "a frequency penalty", "None")
    if repetition_penalty is None or repetition_penalty == 0:  # mlx-lm's "off"
        return []
    context = 20 if repetition_context_size is None else repetition_context_size
    processor = RepetitionPenalty(float(repetition_penalty), int(context))
    _params(Sampler(), [processor])
    return [processor]


def sampling_options(
    sampler: Sampler | Callable[..., Any] | None, logits_processors: Sequence[Any] | None
) -> dict[str, Any]:
    """Keyword arguments for ``draftwise.stream_generate`` (``temp``, ``top_p``, ``top_k``,
    ``min_p``, ``repetition_penalty``, ``repetition_context``) from mlx-lm's pair.

    Example::

        >>> sampling_options(None, None)["temp"]
        0.0
    """
    if sampler is None:
        sampler = Sampler()  # mlx-lm's default sampler is greedy
    if not isinstance(sampler, Sampler):
        raise DraftwiseError(
            f"sampler {sampler!r} is not from draftwise.mlx_lm.sample_utils.make_sampler: "
            "draftwise cannot reproduce an arbitrary sampler losslessly"
        )
    if isinstance(logits_processors, (str, bytes)) or not isinstance(
        logits_processors, (Sequence, type(None))
    ):
        raise DraftwiseError(f"logits_processors must be a list, got {logits_processors!r}")
    params = _params(sampler, logits_processors or ())
    return dict(
        temp=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        repetition_penalty=params.repetition_penalty,
        repetition_context=params.repetition_context,
    )


def _params(sampler: Sampler, processors: Sequence[Any]) -> SamplingParams:
    """The ``SamplingParams`` of one sampler and its processors (validated there)."""
    penalties = []
    for p in processors:
        if not isinstance(p, RepetitionPenalty):
            raise DraftwiseError(
                f"logits processor {p!r} is not from draftwise.mlx_lm.sample_utils."
                "make_logits_processors: draftwise cannot reproduce it losslessly"
            )
        penalties.append(p)
    if len(penalties) > 1:
        raise DraftwiseError(f"give one repetition penalty, got {len(penalties)}: {penalties!r}")
    penalty = penalties[0] if penalties else RepetitionPenalty(1.0, 64)
    return SamplingParams(
        temperature=sampler.temp,
        top_p=sampler.top_p,
        top_k=sampler.top_k,
        min_p=sampler.min_p,
        repetition_penalty=penalty.penalty,
        repetition_context=penalty.context_size,
    )


def _unsupported(name: str, value: Any, what: str, off: str) -> None:
    raise DraftwiseError(
        f"{name}={value!r}: {what} is not supported by draftwise's lossless sampler (use {off})"
    )
