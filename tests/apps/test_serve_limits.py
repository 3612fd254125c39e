"""``draftwise serve`` under load and abuse, on a fake session (no weights, seconds):
request validation, the bounded FIFO queue, keep-alives, disconnects, wall-time limits,
API keys, and errors that never leak internals."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from draftwise.apps.serve import create_app  # noqa: E402
from draftwise.apps.serve_http import ServeSettings  # noqa: E402
from tests.apps.serve_fakes import FakeSession, ThreadServer  # noqa: E402

DEFAULTS = {"max_tokens": 4, "temp": 0.0, "drafter": "cacheback", "budget": 16}
MSG = [{"role": "user", "content": "Hi"}]


def serve(session: FakeSession, **settings: Any) -> ThreadServer:
    return ThreadServer(create_app(session, "fake", DEFAULTS, ServeSettings(**settings)))


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve(FakeSession(), max_body=4096) as u:
        yield u


def post(url: str, body: Any, path: str = "/v1/chat/completions", **kw: Any) -> Any:
    return httpx.post(f"{url}{path}", json=body, timeout=30, **kw)


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"messages": MSG, "tools": [{"type": "function"}]}, "tools", ["tools"]),
        (
            {"messages": MSG, "response_format": {"type": "json_object"}, "logit_bias": {}},
            "logit_bias",
            ["logit_bias", "response_format"],
        ),
        ({"messages": MSG, "logprobs": True}, "logprobs", ["logprobs"]),
        ({"messages": MSG, "n": 2}, "n", ["n"]),
        ({"messages": MSG, "max_tokens": 100_000_000}, "max_tokens", ["max_tokens"]),
        ({"messages": MSG, "max_tokens": 255}, "max_tokens", ["<= 254", "max_tokens"]),
        ({"messages": MSG, "draftwise": {"budget": 100_000}}, "draftwise.budget", ["budget"]),
        (
            {"messages": MSG, "draftwise": {"drafter": "ngrammys"}},
            "draftwise.drafter",
            ["ngrammys"],
        ),
        ({"messages": MSG, "draftwise": {"drafter": "cacheback:fl=99"}}, "draftwise.drafter", []),
        ({"messages": MSG, "temperature": "1"}, "temperature", []),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", []),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, None, []),
        ({"messages": MSG, "stream": 1}, "stream", []),
        ({}, "messages", ["required"]),
    ],
)
def test_bad_requests_are_400_naming_the_field(url, body, param, words):
    r = post(url, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["message"] and err["id"] and err["type"] == "invalid_request_error"
    if param is not None:
        assert err["param"] == param
    for w in words:
        assert w in err["message"]


def test_completion_prompt_forms_and_errors(url):
    for prompt in ["abc", [1, 2, 3], ["abc"]]:
        r = post(url, {"prompt": prompt, "max_tokens": 2}, "/v1/completions")
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "w0 w1 ", r.text
    for prompt in ["", [], ["a", "b"], [-1], "   "]:
        r = post(url, {"prompt": prompt}, "/v1/completions")
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text


def test_body_size_cap_and_bad_json(url):
    big = {"messages": [{"role": "user", "content": "x" * 5000}]}
    r = post(url, big)
    assert r.status_code == 413 and "4096" in r.json()["error"]["message"]

    def chunked() -> Iterator[bytes]:  # no Content-Length: the cap applies while reading
        yield b'{"messages": [{"role": "user", "content": "'
        yield from [b"x" * 1000] * 10
        yield b'"}]}'

    r = httpx.post(f"{url}/v1/chat/completions", content=chunked(), timeout=10)
    assert r.status_code == 413 and r.json()["error"]["id"]
    r = httpx.post(
        f"{url}/v1/chat/completions",
        content=b"{not json",
        timeout=10,
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    assert httpx.get(f"{url}/health").json()["status"] == "ok"


def test_openapi_schema_names_the_bounds(url):
    schema = httpx.get(f"{url}/openapi.json").json()
    chat = schema["components"]["schemas"]["ChatRequest"]
    assert chat["additionalProperties"] is False
    assert "messages" in chat["required"]


def test_a_server_error_reports_an_id_not_internals(caplog):
    session = FakeSession(fail_with=RuntimeError("secret internal detail"))
    with serve(session) as u, caplog.at_level("ERROR", logger="draftwise.serve"):
        r = post(u, {"messages": MSG})
        assert r.status_code == 500
        err = r.json()["error"]
        assert "secret" not in r.text and err["id"] in err["message"]
        with httpx.stream(
            "POST", f"{u}/v1/chat/completions", timeout=10, json={"messages": MSG, "stream": True}
        ) as s:
            text = "".join(s.iter_text())
        assert "secret" not in text and "internal server error" in text and "[DONE]" in text
    assert err["id"] in caplog.text and "secret internal detail" in caplog.text


def test_bounded_fifo_queue_503_with_retry_after():
    session = FakeSession(step_s=0.05)
    with serve(session, max_queue=2) as u:
        results: dict[int, Any] = {}

        def ask(i: int) -> None:
            body = {"messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 40}
            results[i] = post(u, body)

        threads = []
        for i in range(6):  # one runs, two wait, three are refused
            threads.append(threading.Thread(target=ask, args=(i,)))
            threads[-1].start()
            time.sleep(0.1)
        for t in threads:
            t.join(timeout=30)
        codes = sorted(r.status_code for r in results.values())
        assert codes == [200, 200, 200, 503, 503, 503], codes
        busy = [r for r in results.values() if r.status_code == 503]
        assert all(int(r.headers["Retry-After"]) >= 1 for r in busy)
        assert busy[0].json()["error"]["code"] == "server_busy"
        order = [s["ids"] for s in session.started]
        served = sorted(i for i, r in results.items() if r.status_code == 200)
        assert order == [[ord("q"), ord(str(i))] for i in served]  # first come, first served
        assert session.max_live == 1  # one generation at a time
        assert post(u, {"messages": MSG}).status_code == 200  # still healthy


def test_queued_stream_gets_keepalives_then_its_answer():
    session = FakeSession(step_s=0.1)
    with serve(session, keepalive_s=0.2) as u:
        first = threading.Thread(target=post, args=(u, {"messages": MSG, "max_tokens": 12}))
        first.start()
        time.sleep(0.2)
        lines = []
        with httpx.stream(
            "POST",
            f"{u}/v1/chat/completions",
            timeout=30,
            json={"messages": MSG, "stream": True, "max_tokens": 2},
        ) as s:
            lines = list(s.iter_lines())
        first.join()
    keepalives = [x for x in lines if x.startswith(": keep-alive")]
    data = [x for x in lines if x.startswith("data: ")]
    assert keepalives and lines.index(keepalives[0]) < len(lines) - len(data) + 1
    assert data[-1] == "data: [DONE]"


def test_disconnected_clients_free_the_model():
    session = FakeSession(step_s=0.05)
    with serve(session) as u:
        # a non-streaming client that gives up: its generation is cancelled
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                f"{u}/v1/chat/completions", timeout=0.5, json={"messages": MSG, "max_tokens": 200}
            )
        deadline = time.time() + 5
        while session.cancelled < 1 and time.time() < deadline:
            time.sleep(0.05)
        assert session.cancelled == 1 and not session.busy
        # a stream killed while queued leaves the queue; one killed mid-stream is cancelled
        runner = threading.Thread(target=post, args=(u, {"messages": MSG, "max_tokens": 30}))
        runner.start()
        time.sleep(0.2)
        with httpx.stream(
            "POST",
            f"{u}/v1/chat/completions",
            timeout=30,
            json={"messages": MSG, "stream": True, "max_tokens": 200},
        ) as s:
            lines = s.iter_lines()  # (dropping this iterator would close the stream)
            assert next(lines).startswith("data: ")  # the role chunk, sent while it waits
            assert httpx.get(f"{u}/health").json()["waiting"] == 1
        runner.join()
        assert httpx.get(f"{u}/health").json()["waiting"] == 0
        assert len(session.started) == 2  # the dropped one never ran
        with httpx.stream(
            "POST",
            f"{u}/v1/chat/completions",
            timeout=30,
            json={"messages": MSG, "stream": True, "max_tokens": 200},
        ) as s:
            got = 0
            for line in s.iter_lines():
                got += "w" in line
                if got >= 3:
                    break
        deadline = time.time() + 5
        while session.cancelled < 2 and time.time() < deadline:
            time.sleep(0.05)
        assert session.cancelled == 2
        r = post(u, {"messages": MSG, "max_tokens": 3})
        assert r.json()["choices"][0]["message"]["content"] == "w0 w1 w2 "


def test_wall_time_limit_ends_the_answer():
    session = FakeSession(step_s=0.05)
    with serve(session, max_seconds=0.5) as u:
        t0 = time.time()
        r = post(u, {"messages": MSG, "max_tokens": 200})
        assert time.time() - t0 < 5
        choice = r.json()["choices"][0]
        assert (
            choice["finish_reason"] == "length"
            and 3 <= len(choice["message"]["content"].split()) < 50
        )


def test_api_keys_required_and_state_per_key():
    session = FakeSession()
    with serve(session, api_keys=["alpha-key-1", "beta-key-22"]) as u:
        assert post(u, {"messages": MSG}).status_code == 401
        wrong = post(u, {"messages": MSG}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
        assert httpx.get(f"{u}/v1/models").status_code == 401
        assert post(u, {"tools": 1}).status_code == 401  # the key is checked before the body
        for key in ["beta-key-22", "alpha-key-1"]:
            r = post(u, {"messages": MSG}, headers={"Authorization": f"Bearer {key}"})
            assert r.status_code == 200
    assert [s["state"] for s in session.started] == ["key-1", "key-0"]
    with serve(FakeSession()) as u:  # no keys: no state id, one shared state
        assert post(u, {"messages": MSG}).status_code == 200


def test_key_checks_and_loopback():
    from draftwise.apps.serve_http import ApiKeys, is_loopback

    keys = ApiKeys(["alpha-key-1", "beta-key-22"])
    assert keys.state_of("Bearer beta-key-22") == "key-1"
    assert keys.state_of("bearer alpha-key-1") == "key-0"
    for bad in [None, "", "Bearer", "Bearer alpha-key", "Basic alpha-key-1", "alpha-key-1"]:
        assert keys.state_of(bad) is None
    assert not ApiKeys([]).required and ApiKeys([]).state_of("Bearer x") is None
    assert [is_loopback(h) for h in ["127.0.0.1", "::1", "localhost", "0.0.0.0", "10.1.2.3"]] == [
        True, True, True, False, False
    ]  # fmt: skip


def test_non_loopback_bind_without_a_key_warns(monkeypatch, capsys):
    import draftwise.session
    from draftwise.apps import serve

    def stop(*args: Any, **kwargs: Any) -> None:
        raise SystemExit("stop before loading a model")

    monkeypatch.setattr(draftwise.session, "Session", stop)
    for argv, warned in [(["--host", "0.0.0.0"], True), (["--host", "0.0.0.0", "--api-key",
                         "alpha-key-1"], False), ([], False)]:  # fmt: skip
        with pytest.raises(SystemExit):
            serve.main(serve.setup_arg_parser().parse_args(argv))
        assert ("WARNING" in capsys.readouterr().err) == warned
    with pytest.raises(Exception, match="--api-key must be at least 8"):
        serve.main(serve.setup_arg_parser().parse_args(["--api-key", "short"]))
