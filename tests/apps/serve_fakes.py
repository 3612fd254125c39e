"""A fake ``Session`` and an in-thread uvicorn server, to test ``draftwise serve``'s queue,
limits and errors in seconds, without model weights.

The fake model's "tokens" are the prompt's characters; an answer is ``"w0 w1 ..."``, one
word per step, ``step_s`` seconds per step, ``max_tokens`` steps at most.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from draftwise.errors import DraftwiseError


@dataclass
class FakeResponse:
    text: str
    finish_reason: str | None
    generation_tokens: int
    steps: int
    mean_accepted: float = 1.0
    generation_tps: float = 100.0


class FakeBackend:
    context_limit = 256


class FakeDecoder:
    prefilled = 0


class FakeAssets:
    def ready(self, asset: str) -> bool:
        return False  # nothing built: drafters needing an asset are refused to requests


class FakeModel:
    def __init__(self) -> None:
        self.assets = FakeAssets()
        self.backend = FakeBackend()
        self.decoder = FakeDecoder()
        self.drafters: dict[str, Any] = {}

    def encode_prompt(self, prompt: Any, chat_template: bool = True) -> list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            text = "".join(m["content"] for m in prompt)
        elif isinstance(prompt, str):
            text = prompt
        else:
            return [int(t) for t in prompt]
        if not text.strip():
            raise DraftwiseError("the prompt is empty: give some text")
        return [ord(c) % 50000 for c in text]


@dataclass
class FakeSession:
    step_s: float = 0.0
    fail_with: Exception | None = None  # raised by every generation
    model: FakeModel = field(default_factory=FakeModel)
    started: list[dict[str, Any]] = field(default_factory=list)  # options, in run order
    cancelled: int = 0
    finished: int = 0
    live: int = 0
    max_live: int = 0

    @property
    def busy(self) -> bool:
        return self.live > 0

    def stream(self, ids: list[int], *, cancel: Any, stop: Any = (), **opts: Any) -> Iterator[Any]:
        self.started.append({"ids": ids, **opts})
        return self._run(cancel, opts)

    def _run(self, cancel: Any, opts: dict[str, Any]) -> Iterator[Any]:
        self.live += 1
        self.max_live = max(self.max_live, self.live)
        try:
            if self.fail_with is not None:
                raise self.fail_with
            n = opts["max_tokens"]
            for i in range(n):
                if cancel.cancelled:
                    self.cancelled += 1
                    return
                time.sleep(self.step_s)
                yield FakeResponse(f"w{i} ", "length" if i == n - 1 else None, i + 1, i + 1)
            self.finished += 1
        finally:
            self.live -= 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ThreadServer:
    """``app`` served by uvicorn on 127.0.0.1 in a thread (``with ThreadServer(app) as url``)."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            if time.time() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)
