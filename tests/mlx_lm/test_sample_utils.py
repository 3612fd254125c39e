"""mlx-lm's sampler factories as plain data for the lossless engine (no model needed)."""

from __future__ import annotations

import pytest

from draftwise.errors import DraftwiseError
from draftwise.mlx_lm.sample_utils import (
    RepetitionPenalty,
    Sampler,
    make_logits_processors,
    make_sampler,
    sampling_options,
)


def test_make_sampler_maps_mlx_lm_conventions():
    assert make_sampler() == Sampler(temp=0.0, top_p=1.0, min_p=0.0, top_k=0)  # greedy
    # mlx-lm applies top_p only inside (0, 1): 0 and 1 both mean off
    assert make_sampler(0.7, top_p=0.0).top_p == 1.0
    assert make_sampler(0.7, top_p=1.0).top_p == 1.0
    assert make_sampler(0.7, 0.9, 0.05, 1, top_k=40) == Sampler(0.7, 0.9, 0.05, 40)
    # the XTC settings' "off" values are accepted, as mlx-lm's CLI passes them
    make_sampler(0.7, xtc_threshold=0.1, xtc_special_tokens=[2])


def test_options_are_draftwise_keywords():
    opts = sampling_options(
        make_sampler(0.8, top_k=5), make_logits_processors(repetition_penalty=1.3)
    )
    assert opts == dict(
        temp=0.8, top_p=1.0, top_k=5, min_p=0.0, repetition_penalty=1.3, repetition_context=20
    )
    # nothing given: draftwise's own defaults, so the output equals draftwise.generate's
    assert sampling_options(None, None) == dict(
        temp=0.0, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0, repetition_context=64
    )
    assert sampling_options(None, []) == sampling_options(None, None)


def test_logits_processors():
    assert make_logits_processors() == []
    assert make_logits_processors(repetition_penalty=0) == []  # mlx-lm's "off"
    assert make_logits_processors(None, 1.2, 32) == [RepetitionPenalty(1.2, 32)]
    assert make_logits_processors(logit_bias={}, presence_penalty=0.0) == []


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda: make_sampler(0.8, xtc_probability=0.5), "xtc_probability=0.5"),
        (lambda: make_sampler(0.8, min_p=0.1, min_tokens_to_keep=3), "min_tokens_to_keep=3"),
        (lambda: make_sampler(-1.0), "temperature must be >= 0, got -1.0"),
        (lambda: make_sampler(0.5, top_p=-0.2), "top_p must be in [0, 1]"),
        (lambda: make_sampler(0.5, min_p=1.5), "min_p must be in [0, 1), got 1.5"),
        (lambda: make_sampler(0.5, top_k=-2), "top_k must be >= 0, got -2"),
        (lambda: make_logits_processors(logit_bias={5: 2.0}), "logit_bias={5: 2.0}"),
        (lambda: make_logits_processors(presence_penalty=0.5), "presence_penalty=0.5"),
        (lambda: make_logits_processors(frequency_penalty=0.5), "frequency_penalty=0.5"),
        (lambda: make_logits_processors(repetition_penalty=-1.0), "repetition_penalty must be > 0"),
        (lambda: sampling_options(lambda logprobs: logprobs.argmax(), None), "cannot reproduce"),
        (lambda: sampling_options(None, [lambda tokens, logits: logits]), "cannot reproduce"),
        (
            lambda: sampling_options(None, make_logits_processors(repetition_penalty=1.1) * 2),
            "one repetition penalty",
        ),
    ],
)
def test_what_cannot_be_lossless_is_a_clear_error(make, needle):
    with pytest.raises(DraftwiseError) as exc:
        make()
    assert needle in str(exc.value) and "\n" not in str(exc.value)
