"""The main API's keywords: ``temperature=`` beside ``temp=``, and unknown keywords name the
right one (no model needed: the check runs before the model is touched)."""

from __future__ import annotations

import pytest

import draftwise
from draftwise.api import OTHER_NAMES, check_keywords
from draftwise.errors import DraftwiseError


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_new_tokens": 8}, "unknown keyword 'max_new_tokens': use max_tokens="),
        ({"random_seed": 1}, "unknown keyword 'random_seed': use seed="),
        ({"topp": 0.9}, "unknown keyword 'topp': did you mean top_p=?"),
        ({"draft_model": "x"}, "unknown keyword 'draft_model': use drafter="),
        ({"sampler": None}, "unknown keyword 'sampler': use temp, top_p, top_k, min_p"),
    ],
)
def test_unknown_keyword_names_the_right_one(kwargs, message):
    with pytest.raises(DraftwiseError) as exc:
        next(draftwise.stream_generate(None, "Hi", **kwargs))  # type: ignore[arg-type]
    assert str(exc.value).startswith(message)
    with pytest.raises(DraftwiseError):
        draftwise.generate(None, "Hi", **kwargs)  # type: ignore[arg-type]


def test_no_keyword_we_take_is_called_unknown():
    check_keywords({})
    assert "temperature" in OTHER_NAMES and OTHER_NAMES["temperature"] == "temp"
    with pytest.raises(DraftwiseError, match="stream_generate takes drafter, max_tokens, temp"):
        check_keywords({"zzzz": 1})


def test_temperature_given_twice_is_an_error():
    with pytest.raises(
        DraftwiseError, match="give the temperature once: temp=0.5 and temperature=0.7"
    ):
        next(draftwise.stream_generate(None, "Hi", temp=0.5, temperature=0.7))  # type: ignore[arg-type]
