"""HTTP guards of ``draftwise serve``: its settings, a body-size cap, API-key checks.

Example::

    >>> keys = ApiKeys(["alpha", "beta"])
    >>> keys.state_of("Bearer beta"), keys.state_of("Bearer gamma")
    ('key-1', None)
    >>> is_loopback("127.0.0.1"), is_loopback("0.0.0.0"), is_loopback("localhost")
    (True, False, True)
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import uuid
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from draftwise.errors import DraftwiseError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass
class ServeSettings:
    """Limits of one server (the ``serve`` flags of the same names)."""

    max_queue: int = 16  # requests waiting for the model
    max_seconds: float = 600.0  # wall time of one generation
    max_body: int = 4 << 20  # bytes of one request body
    max_budget: int = 64  # draftwise.budget a request may ask for
    keepalive_s: float = 10.0  # silence before an SSE keep-alive comment
    api_keys: Sequence[str] = field(default_factory=list)
    max_keys: int = 8  # per-key drafter states kept in memory

    def check(self) -> None:
        for name, value, low in [
            ("--max-queue", self.max_queue, 0),
            ("--max-body", self.max_body, 1),
            ("--max-budget", self.max_budget, 0),
            ("--max-keys", self.max_keys, 1),
        ]:
            if value < low:
                raise DraftwiseError(f"{name} must be >= {low}, got {value}")
        seconds_flags = [("--max-seconds", self.max_seconds), ("--keepalive", self.keepalive_s)]
        for name, seconds in seconds_flags:
            if not seconds > 0:
                raise DraftwiseError(f"{name} must be > 0, got {seconds}")
        for key in self.api_keys:
            if len(key) < 8 or not key.isprintable() or " " in key:
                raise DraftwiseError(
                    "each --api-key must be at least 8 printable characters, no spaces"
                )


class ApiKeys:
    """The accepted keys; a request's state id is ``key-<i>`` for the i-th key. Every key
    is compared with ``hmac.compare_digest`` (constant time), all of them every time."""

    def __init__(self, keys: Sequence[str]) -> None:
        self._keys = [k.encode() for k in keys]

    @property
    def required(self) -> bool:
        return bool(self._keys)

    def state_of(self, authorization: str | None) -> str | None:
        """The state id of the key in an ``Authorization: Bearer KEY`` header, or None."""
        scheme, _, given = (authorization or "").partition(" ")
        token = given.strip().encode() if scheme.lower() == "bearer" else b""
        found = None
        for i, key in enumerate(self._keys):
            if hmac.compare_digest(token, key) and found is None:
                found = f"key-{i}"
        return found


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class BodyLimit:
    """ASGI middleware: a request body over ``max_bytes`` gets 413 before it is read
    (by its Content-Length) or as soon as it grows past the cap (a chunked body)."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        try:
            too_big = length is not None and int(length) > self.max_bytes
        except ValueError:
            too_big = True
        if too_big:
            await self._refuse(send)
            return
        chunks, seen = [], 0  # read it all here (at most max_bytes), then hand it on
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.max_bytes:
                await self._refuse(send)
                return
            if not message.get("more_body"):
                break
        body: Message | None = {
            "type": "http.request",
            "body": b"".join(chunks),
            "more_body": False,
        }

        async def replay() -> Message:
            nonlocal body
            if body is not None:
                message, body = body, None
                return message
            return await receive()  # then wait for the disconnect, as the server would

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            {
                "error": {
                    "message": f"the request body is over {self.max_bytes} bytes",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "request_too_large",
                    "id": "err-" + uuid.uuid4().hex[:16],
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"connection", b"close")],
            }
        )
        await send({"type": "http.response.body", "body": body})
