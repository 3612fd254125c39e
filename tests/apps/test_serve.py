"""`draftwise serve` in a subprocess, driven by the official ``openai`` client and httpx.

One server (the real default model, torch, float32) for the whole module. Answers are
greedy with small ``max_tokens`` so the run stays short on a CPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.torch
pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

PROMPTS = [
    "Name three primes.",
    "What is the capital of France?",
    "Write a haiku about caches.",
    "Count from 1 to 10.",
]
N = 12  # max_tokens of every answer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVER: dict[str, object] = {}  # the module server's process and cache directory


@contextlib.contextmanager
def running_server(model_dir, cache, *extra: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """``draftwise serve`` on the real default model in a subprocess, building profiles and
    tables under ``cache``; yields its URL and process."""
    port = free_port()
    log = tempfile.TemporaryFile("w+")  # a pipe nobody reads could fill and block it
    cmd = [sys.executable, "-m", "draftwise", "serve", "--model", str(model_dir),
           "--backend", "torch", "--dtype", "float32", "--port", str(port),
           "--max-tokens", str(N), *extra]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
             "DRAFTWISE_CACHE_DIR": str(cache)},
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    try:
        while time.time() < deadline:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"server exited: {log.read()}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            pytest.fail("server did not start in 300 s")
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def server(default_model_dir, tmp_path_factory) -> Iterator[str]:
    cache = tmp_path_factory.mktemp("serve-cache")  # profiles and tables this server builds
    with running_server(default_model_dir, cache) as (url, proc):
        SERVER.update(proc=proc, cache=cache)
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0, timeout=600)


@pytest.fixture(scope="module")
def model_id(client) -> str:
    return client.models.list().data[0].id


def ask(client, model_id: str, prompt: str, stream: bool, drafter: str = "cacheback") -> str:
    extra = {"draftwise": {"drafter": drafter}}
    messages = [{"role": "user", "content": prompt}]
    if not stream:
        r = client.chat.completions.create(
            model=model_id, messages=messages, max_tokens=N, temperature=0, extra_body=extra
        )
        assert r.usage.completion_tokens >= 1 and r.choices[0].finish_reason in ("stop", "length")
        return r.choices[0].message.content
    parts, finish = [], None
    for c in client.chat.completions.create(
        model=model_id,
        messages=messages,
        max_tokens=N,
        temperature=0,
        stream=True,
        extra_body=extra,
    ):
        if c.choices:
            parts.append(c.choices[0].delta.content or "")
            finish = c.choices[0].finish_reason or finish
    assert finish in ("stop", "length")
    return "".join(parts)


@pytest.fixture(scope="module")
def reference(client, model_id) -> dict[str, str]:
    """Single-client greedy answers, plain decoding."""
    return {p: ask(client, model_id, p, stream=False, drafter="none") for p in PROMPTS}


def test_models_health_and_usage(server, client, model_id, reference):
    assert httpx.get(f"{server}/health").json()["status"] == "ok"
    r = client.chat.completions.create(
        model=model_id,
        max_tokens=N,
        temperature=0,
        messages=[{"role": "user", "content": PROMPTS[0]}],
    )
    assert r.choices[0].message.content == reference[PROMPTS[0]]
    extra = r.usage.model_extra["draftwise"]
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert extra["steps"] >= 1 and extra["mean_accepted"] >= 1 and extra["tokens_per_s"] > 0
    c = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=4)
    assert c.choices[0].text and c.usage.completion_tokens == 4


def test_stream_equals_non_stream_and_stop(client, model_id, reference):
    for p in PROMPTS[:2]:
        assert ask(client, model_id, p, stream=True) == reference[p]
    full = reference[PROMPTS[3]]
    stop = full.split()[2]
    r = client.chat.completions.create(
        model=model_id,
        max_tokens=N,
        stop=[stop],
        messages=[{"role": "user", "content": PROMPTS[3]}],
    )
    assert r.choices[0].message.content == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"


def kill_mid_stream(server: str, model_id: str | None) -> int:
    """Open a long streamed answer, read a few chunks, drop the connection."""
    body = {
        "model": model_id,
        "stream": True,
        "max_tokens": 2000,
        "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
    }
    got = 0
    with (
        httpx.Client(timeout=600) as c,
        c.stream("POST", f"{server}/v1/chat/completions", json=body) as r,
    ):
        for line in r.iter_lines():
            got += line.startswith("data: ")
            if got >= 3:
                break  # leaving the block closes the connection
    return got


def timed_stream(server: str, prompt: str, drafter: str) -> tuple[str, float, int]:
    """One greedy streamed answer: (text, seconds to the first text, tokens)."""
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": N,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "draftwise": {"drafter": drafter},
    }
    parts, first, tokens, t0 = [], None, 0, time.perf_counter()
    with (
        httpx.Client(timeout=600) as c,
        c.stream("POST", f"{server}/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            obj = json.loads(line[6:])
            assert "error" not in obj, obj
            if obj.get("usage"):
                tokens = obj["usage"]["completion_tokens"]
            for ch in obj["choices"]:
                text = ch["delta"].get("content") or ""
                if text and first is None:
                    first = time.perf_counter() - t0
                parts.append(text)
    return "".join(parts), first if first is not None else float("nan"), tokens


def drop_while_queued(server: str) -> None:
    """Open a stream that has to wait, read its first chunk, leave."""
    body = {"stream": True, "max_tokens": N, "messages": [{"role": "user", "content": "Hi"}]}
    with (
        httpx.Client(timeout=600) as c,
        c.stream("POST", f"{server}/v1/chat/completions", json=body) as r,
    ):
        next(r.iter_lines())


def test_load_8_streaming_clients_x_5(server, reference):
    """8 clients x 5 greedy streamed requests at once, plus one client killed mid-stream
    and one killed while queued: every answer equals the single-client answer."""
    results: list[tuple[str, str, float, int]] = []
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for j in range(5):
                p = PROMPTS[(i + j) % len(PROMPTS)]
                drafter = "none" if (i + j) % 3 == 0 else "cacheback"
                text, ttft, tokens = timed_stream(server, p, drafter)
                results.append((p, text, ttft, tokens))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    threads.append(threading.Thread(target=kill_mid_stream, args=(server, None)))
    threads.append(threading.Thread(target=drop_while_queued, args=(server,)))
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    wall = time.perf_counter() - t0
    assert not errors, errors
    assert len(results) == 40
    for p, text, _, _ in results:
        assert text == reference[p], p
    ttft = sorted(r[2] for r in results)
    p99 = ttft[min(len(ttft) - 1, round(0.99 * (len(ttft) - 1)))]
    tokens = sum(r[3] for r in results)
    print(
        f"\nload: 40 streamed requests from 8 clients in {wall:.1f} s; time to first token "
        f"p50 {statistics.median(ttft):.2f} s, p99 {p99:.2f} s; {tokens} tokens, "
        f"{tokens / wall:.1f} tok/s overall"
    )
    assert httpx.get(f"{server}/health").json()["waiting"] == 0


KEY_A, KEY_B = "alpha-key-0001", "beta-key-00002"


@pytest.fixture(scope="module")
def keyed_server(server, default_model_dir) -> Iterator[str]:
    """A second server: one request may wait, two API keys, SSD drafting."""
    extra = ["--max-queue", "1", "--api-key", KEY_A, "--api-key", KEY_B, "--drafter", "ssd"]
    with running_server(default_model_dir, SERVER["cache"], *extra) as (url, _):
        yield url


SECRET = "The vault code of Zorbulax is 7-4-1-9-3-3-8, written on the blue tile by the door."


def test_keys_do_not_share_what_drafters_learn(keyed_server):
    """SSD replays an exact repeat: key A's second identical request is drafted from A's
    first answer. Key B sending the same text drafts nothing learnt from A: its drafting
    statistics equal A's first request's (both keys' first requests on this server)."""
    def stats(key: str) -> dict:
        body = {"max_tokens": 24, "temperature": 0,
                "messages": [{"role": "user", "content": SECRET}]}  # fmt: skip
        r = httpx.post(f"{keyed_server}/v1/chat/completions", json=body, timeout=600,
                       headers={"Authorization": f"Bearer {key}"})  # fmt: skip
        assert r.status_code == 200, r.text
        return r.json()["usage"]["draftwise"] | {"text": r.json()["choices"][0]["message"]}

    a1, a2, b1 = stats(KEY_A), stats(KEY_A), stats(KEY_B)
    print(f"\nmean accepted: A first {a1['mean_accepted']}, A again {a2['mean_accepted']}, "
          f"B (same text) {b1['mean_accepted']}")  # fmt: skip
    assert a1["text"] == a2["text"] == b1["text"]
    assert a2["steps"] < a1["steps"]  # A's repeat was replayed from A's own store
    assert (b1["steps"], b1["mean_accepted"]) == (a1["steps"], a1["mean_accepted"])


def test_low_queue_limit_sheds_load_and_stays_healthy(keyed_server, reference):
    url, auth = keyed_server, {"Authorization": f"Bearer {KEY_A}"}
    got: list[int] = []

    def one(i: int) -> None:
        body = {"max_tokens": N, "messages": [{"role": "user", "content": PROMPTS[i % 4]}]}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth, timeout=600)
        if r.status_code == 503:
            assert int(r.headers["Retry-After"]) >= 1
        got.append(r.status_code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert got.count(503) >= 4 and got.count(200) >= 2 and set(got) == {200, 503}, got
    assert httpx.get(f"{url}/health").json() | {"busy": False} == {
        "status": "ok", "model": "SmolLM2-135M-Instruct", "busy": False, "waiting": 0
    }  # fmt: skip
    c = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY_A, max_retries=0, timeout=600)
    assert ask(c, "SmolLM2-135M-Instruct", PROMPTS[1], stream=True) == reference[PROMPTS[1]]
    with pytest.raises(openai.AuthenticationError):
        ask(openai.OpenAI(base_url=f"{url}/v1", api_key="wrong-key-0", max_retries=0),
            "SmolLM2-135M-Instruct", PROMPTS[1], stream=False)  # fmt: skip


def test_dropped_stream_frees_the_model(server, client, model_id, reference):
    assert kill_mid_stream(server, model_id) >= 3
    deadline = time.time() + 20  # 2000 tokens would take minutes on a CPU
    while httpx.get(f"{server}/health").json()["busy"] and time.time() < deadline:
        time.sleep(0.2)
    assert not httpx.get(f"{server}/health").json()["busy"]
    assert ask(client, model_id, PROMPTS[1], stream=False) == reference[PROMPTS[1]]


@pytest.mark.parametrize(
    "path, body, status, param",
    [
        ("/v1/chat/completions", b"{not json", 400, None),
        (
            "/v1/chat/completions",
            b'{"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}',
            404,
            "model",
        ),
        (
            "/v1/chat/completions",
            b'{"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}',
            400,
            "max_tokens",
        ),
        ("/v1/chat/completions", b'{"max_tokens": 4}', 400, "messages"),
        (
            "/v1/chat/completions",
            b'{"temperature": -0.5, "messages": [{"role": "user", "content": "x"}]}',
            400,
            "temperature",
        ),
        (
            "/v1/chat/completions",
            b'{"draftwise": {"drafter": "nope"}, "messages": [{"role": "user", "content": "x"}]}',
            400,
            "draftwise.drafter",
        ),
        ("/v1/completions", b'{"prompt": ""}', 400, "prompt"),
        ("/v1/nowhere", b"{}", 404, None),
    ],
)
def test_bad_requests_get_openai_errors(server, path, body, status, param):
    r = httpx.post(f"{server}{path}", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code", "id"} and err["message"]
    assert err["param"] == param
    assert httpx.get(f"{server}/health").json()["status"] == "ok"  # still serving


def test_bad_request_through_openai_client(client, model_id, reference):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=model_id, max_tokens=-1, messages=[{"role": "user", "content": "x"}]
        )
    assert info.value.param == "max_tokens"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert ask(client, model_id, PROMPTS[0], stream=True) == reference[PROMPTS[0]]


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def files_under(root) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in root.rglob("*")}


@pytest.mark.parametrize(
    "ext, words",
    [
        ({"drafter": "ssd:capacity=536870912"}, "cannot be set by a request"),
        ({"drafter": "cacheback:frozen_path=/etc/shadow"}, "cannot be set by a request"),
        ({"drafter": "cacheback:frozen_path=/nonexistent"}, "cannot be set by a request"),
        ({"drafter": "cacheback:lc=4194304"}, "cannot be set by a request"),
        ({"drafter": "cacheback:zz=3"}, "unknown option 'zz'"),
        ({"drafter": "ssd:q_max=1000"}, "must be <= 64"),
        ({"drafter": "cacheback:budget=100000"}, "budget must be <="),
        ({"drafter": "ngrammys"}, "bigram table is not built"),
        ({"drafter": 3}, "must be a string"),
        ({"budget": 100000}, "budget must be <="),
    ],
)
def test_drafter_options_from_a_client_are_bounded(server, ext, words):
    """Paths, capacities, unknown options, long builds and oversized budgets are refused
    with a 400 before anything is built: the server's memory and files stay as they were."""
    proc, cache = SERVER["proc"], SERVER["cache"]
    before_rss, before_files = rss_kb(proc.pid), files_under(cache)
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "draftwise": ext}
    r = httpx.post(f"{server}/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert words in err["message"] and err["param"].startswith("draftwise.")
    assert "/etc/shadow" not in err["message"].replace(str(ext.get("drafter")), "")
    assert files_under(cache) == before_files
    assert rss_kb(proc.pid) - before_rss < 64 * 1024  # kB: no 3.5 GB suffix array
    assert httpx.get(f"{server}/health").json()["status"] == "ok"


def test_multi_turn_chat_prefills_only_the_new_turn(client, model_id):
    """The next turn of a conversation reuses the KV cache of the previous turn (its
    prompt and its answer), saved although another request ran in between: only the new
    user message is prefilled."""
    msgs = [{"role": "user", "content": PROMPTS[2]}]
    r1 = client.chat.completions.create(model=model_id, messages=msgs, max_tokens=N, temperature=0)
    ask(client, model_id, PROMPTS[3], stream=False)  # another client's request in between
    msgs += [
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": "Now write one about trees, please."},
    ]
    r2 = client.chat.completions.create(model=model_id, messages=msgs, max_tokens=N, temperature=0)
    p1, p2 = r1.usage.prompt_tokens, r2.usage.prompt_tokens
    done1 = r1.usage.completion_tokens
    pre1 = r1.usage.model_extra["draftwise"]["prefill_tokens"]
    pre2 = r2.usage.model_extra["draftwise"]["prefill_tokens"]
    new = p2 - p1 - done1  # the new turn's tokens (template included)
    print(f"\nprefill: turn 1 {pre1} of {p1} prompt tokens; turn 2 {pre2} of {p2} ({new} new)")
    # + the answer's last token (emitted, never computed) and a few where the template's
    # end-of-turn re-tokenizes the answer's end differently
    assert pre2 <= new + 4 and pre2 < p2 // 2
