"""The drafter spec grammar: parsed once, canonical text round-trips, errors name the part."""

from __future__ import annotations

import numpy as np
import pytest

from draftwise.drafting import PartSpec, SpecError, parse_spec
from draftwise.drafting.spec import MAX_SPEC_CHARS


@pytest.mark.parametrize(
    "text, canonical",
    [
        ("auto", "auto"),
        (" cacheback : fl = 2 , budget = 4 ", "cacheback:fl=2,budget=4"),
        ("cacheback:budget=4,fl=2", "cacheback:fl=2,budget=4"),
        ("ngrammys:k=5,w=4+cacheback:ll=3", "ngrammys:k=5,w=4+cacheback:ll=3"),
        ("ssd:budget=0", "ssd:budget=0"),
    ],
)
def test_round_trip(text, canonical):
    spec = parse_spec(text)
    assert str(spec) == canonical
    assert parse_spec(str(spec)) == spec


def test_random_specs_round_trip():
    rng = np.random.default_rng(0)
    names = ["cacheback", "ssd", "ngrammys", "context-ngram", "bigram"]
    keys = ["k", "w", "q", "fl", "ll", "table", "verify"]
    for _ in range(300):
        chosen = rng.choice(names, size=int(rng.integers(1, 4)), replace=False)
        parts = []
        for name in chosen:
            opts = {str(k): str(rng.integers(0, 100)) for k in rng.choice(keys, int(rng.integers(0, 4)), replace=False)}
            budget = int(rng.integers(0, 64)) if rng.random() < 0.5 else None
            parts.append(PartSpec(str(name), opts, budget))
        text = "+".join(str(p) for p in parts)
        spec = parse_spec(text)
        assert list(spec.parts) == parts and str(spec) == text


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "empty drafter spec"),
        ("cacheback:fl", "bad drafter option 'fl'"),
        ("cacheback:=3", "bad drafter option '=3'"),
        ("cacheback:fl=", "bad drafter option 'fl='"),
        ("cacheback:fl=2,fl=3", "'fl' given twice"),
        ("cacheback:budget=x", "budget must be an integer, got 'x'"),
        ("cacheback:budget=-1", "budget must be >= 0, got -1"),
        ("cacheback:budget=1,budget=2", "'budget' given twice"),
        (":fl=2", "missing drafter name"),
        ("ssd+ssd", "bad combined drafter"),
        ("none+ssd", "bad combined drafter"),
        ("auto+ssd", "bad combined drafter"),
        ("ssd+", "missing drafter name"),
        ("x" * (MAX_SPEC_CHARS + 1), "too long"),
    ],
)
def test_errors_name_the_bad_part(text, words):
    with pytest.raises(SpecError, match=words.replace("(", r"\(").replace("+", r"\+")):
        parse_spec(text)


def test_spec_must_be_text():
    with pytest.raises(SpecError, match="must be text, got int"):
        parse_spec(3)  # type: ignore[arg-type]
