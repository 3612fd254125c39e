"""Property-based tests of ``draftwise serve``'s request handling: for any JSON body,
the request models either accept it or refuse it with a 4xx naming the problem; the
app never answers 500. Runs on a fake session (no weights)."""

from __future__ import annotations

import json
from typing import Any

import pytest

hypothesis = pytest.importorskip("hypothesis")
pytest.importorskip("fastapi")
pytest.importorskip("httpx")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from draftwise.apps.openai_schema import ApiError, GenRequest, parse_request  # noqa: E402

FIELDS = [
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "n",
    "user",
    "frequency_penalty",
    "presence_penalty",
    "draftwise",
    "logprobs",
    "tools",
    "response_format",
    "echo",
    "best_of",
    "messages",
    "prompt",
]
DEFAULTS = {"max_tokens": 4, "temp": 0.0, "drafter": "cacheback", "budget": 16}

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.sampled_from(
        [
            "user",
            "assistant",
            "system",
            "tool",
            "text",
            "cacheback",
            "none",
            "auto",
            "ngrammys",
            "fake",
            "cacheback:fl=9",
        ]
    )
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                ["role", "content", "type", "text", "drafter", "budget", "include_usage", "name"]
            )
            | st.text(max_size=6),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)
messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "system", "tool", ""]),
            "content": st.text(max_size=20) | values,
        }
    ),
    max_size=3,
)
bodies = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), values, max_size=6)
chat_bodies = st.builds(lambda b, m: {**b, "messages": m}, bodies, messages)


def _check(raw: bytes, kind: str) -> None:
    try:
        req = parse_request(raw, kind, DEFAULTS, ["fake"])
    except ApiError as exc:
        assert exc.status in (400, 404) and exc.message
        assert exc.param is None or isinstance(exc.param, str)
        return
    assert isinstance(req, GenRequest) and req.max_tokens >= 1
    assert 0 <= req.options["budget"] <= 64


@settings(max_examples=300, deadline=None)
@given(st.one_of(bodies, chat_bodies), st.sampled_from(["chat", "completion"]))
def test_request_models_accept_or_refuse_cleanly(body: dict[str, Any], kind: str):
    _check(json.dumps(body).encode(), kind)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_any_bytes_accept_or_refuse_cleanly(raw: bytes):
    _check(raw, "chat")
    _check(raw, "completion")


@pytest.fixture(scope="module")
def client():
    from fastapi.testclient import TestClient

    from draftwise.apps.serve import create_app
    from tests.apps.serve_fakes import FakeSession

    with TestClient(create_app(FakeSession(), "fake", DEFAULTS)) as c:
        yield c


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.one_of(bodies, chat_bodies), st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
def test_the_app_never_answers_500(client, body: dict[str, Any], path: str):
    body.pop("stream", None)  # streamed answers are covered by the same code after the 200
    raw = json.dumps(body)  # infinities become the non-JSON "Infinity": a bad body too
    r = client.post(path, content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code in (200, 400, 404), r.text
    if r.status_code != 200:
        err = r.json()["error"]
        assert err["message"] and err["id"]
