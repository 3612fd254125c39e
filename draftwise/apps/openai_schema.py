"""OpenAI wire format for ``draftwise serve``: request checks and response bodies.

The request models (``openai_models``) check types and bounds; ``to_gen_request`` adds
the rules that need the server's settings (its model name, drafter, budget cap) and
``check_length`` those that need the prompt's length. No web framework here, so the
rules are easy to test. A bad request raises ``ApiError``, which carries the HTTP status
and the OpenAI error body.

Example::

    >>> req = parse_request(b'{"messages": [{"role": "user", "content": "Hi"}]}', "chat",
    ...                     {"max_tokens": 16, "temp": 0.0}, ["m"])
    >>> req.max_tokens, req.stream
    (16, False)
    >>> try:
    ...     parse_request(b'{"prompt": "x", "max_tokens": 0}', "completion", {}, ["m"])
    ... except ApiError as exc:
    ...     print(exc.status, exc)
    400 max_tokens must be >= 1, got 0
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from draftwise.apps.openai_models import (
    MAX_BUDGET,
    ChatRequest,
    CompletionRequest,
    DraftwiseOptions,
    validation_message,
)
from draftwise.drafting import check_spec
from draftwise.errors import DraftwiseError


class ApiError(Exception):
    """A client mistake: HTTP ``status`` plus the OpenAI ``{"error": {...}}`` body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.headers = headers
        self.status, self.message, self.param, self.code, self.type = (
            status,
            message,
            param,
            code,
            type,
        )

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    id: str | None = None,
) -> dict[str, Any]:
    """The OpenAI error object plus an ``id`` the server log names too."""
    return {
        "error": {
            "message": message,
            "type": type,
            "param": param,
            "code": code,
            "id": id or new_error_id(),
        }
    }


def new_error_id() -> str:
    return "err-" + uuid.uuid4().hex[:16]


@dataclass
class GenRequest:
    """A checked generation request (chat or completion)."""

    kind: str  # "chat" or "completion"
    prompt: Any  # messages (chat), or text / token ids (completion)
    model: str
    stream: bool = False
    include_usage: bool = False
    max_tokens: int = 256
    options: dict[str, Any] = field(default_factory=dict)  # for Session.stream
    stop: list[str] = field(default_factory=list)
    explicit_max: bool = False  # max_tokens came from the request, not the server default


def check_remote_drafter(
    spec: str, server_drafter: str, max_budget: int, ready: Callable[[str], bool] | None
) -> None:
    """A request's drafter spec, checked as a network client's by the drafting layer:
    registry names and remote-safe options only, ``budget=N`` at most ``max_budget``, and
    no drafter whose asset (a bigram table, a cost profile) is not built yet: it would be
    built inside the request. The server's own drafter, chosen by its operator, is fine."""
    if spec == server_drafter:
        return
    try:
        check_spec(spec, remote=True, max_budget=max_budget, ready=ready)
    except DraftwiseError as exc:
        raise ApiError(400, str(exc), "draftwise.drafter", "invalid_value") from None


def to_gen_request(
    body: ChatRequest | CompletionRequest,
    defaults: dict[str, Any],
    model_ids: list[str],
    max_budget: int = MAX_BUDGET,
    ready: Callable[[str], bool] | None = None,
) -> GenRequest:
    """The checked request (``GenRequest``) for a validated body. ``defaults`` are the
    server's flags (``max_tokens``, ``temp``, ``top_p``, ``seed``, ``drafter``,
    ``budget``, ...); the request overrides them. ``ready(asset)`` says whether a drafter
    asset is built (``Model.assets.ready``). Raises ``ApiError``."""
    kind = "chat" if isinstance(body, ChatRequest) else "completion"
    model = body.model or model_ids[0]
    if model not in model_ids:
        raise ApiError(
            404,
            f"the model {model!r} does not exist (serving: {', '.join(model_ids)})",
            "model",
            "model_not_found",
        )
    prompt: Any
    if isinstance(body, ChatRequest):
        prompt = [{"role": m.role, "content": m.text()} for m in body.messages]
        asked = body.max_completion_tokens or body.max_tokens
    else:
        prompt = body.prompt[0] if isinstance(body.prompt[0], str) else body.prompt
        asked = body.max_tokens
    ext = body.draftwise or DraftwiseOptions()
    server_drafter = str(defaults.get("drafter", "auto"))
    drafter = ext.drafter or server_drafter
    check_remote_drafter(drafter, server_drafter, max_budget, ready)
    budget = ext.budget if ext.budget is not None else int(defaults.get("budget", 16))
    if budget > max_budget:
        raise ApiError(
            400,
            f"draftwise.budget must be <= {max_budget} on this server, got {budget}",
            "draftwise.budget",
            "invalid_value",
        )
    seed = body.seed if body.seed is not None else defaults.get("seed")
    options = {
        "temp": body.temperature if body.temperature is not None else defaults.get("temp", 0.0),
        "top_p": body.top_p if body.top_p is not None else defaults.get("top_p", 1.0),
        "top_k": defaults.get("top_k", 0),
        "min_p": defaults.get("min_p", 0.0),
        "repetition_penalty": defaults.get("repetition_penalty", 1.0),
        "seed": None if seed is None else seed % 2**63,
        "drafter": drafter,
        "budget": budget,
    }
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return GenRequest(
        kind,
        prompt,
        model,
        body.stream,
        include_usage,
        int(asked or defaults.get("max_tokens", 256)),
        options,
        stop,
        explicit_max=asked is not None,
    )


def parse_request(
    raw: bytes,
    kind: str,
    defaults: dict[str, Any],
    model_ids: list[str],
    ready: Callable[[str], bool] | None = None,
) -> GenRequest:
    """Check a ``/v1/chat/completions`` (``kind="chat"``) or ``/v1/completions`` body
    given as bytes (what the server does, without the web framework)."""
    cls = ChatRequest if kind == "chat" else CompletionRequest
    try:
        body = cls.model_validate_json(raw or b"null")
    except ValidationError as exc:
        message, param, code = validation_message(exc.errors())
        raise ApiError(400, message, param, code) from None
    return to_gen_request(body, defaults, model_ids, ready=ready)


def check_length(req: GenRequest, n_prompt: int, limit: int) -> int:
    """``max_tokens`` for a prompt of ``n_prompt`` tokens in a context of ``limit``: an
    explicit request over the room left is refused, the server's default is cut to fit."""
    param = "messages" if req.kind == "chat" else "prompt"
    if n_prompt >= limit:
        raise ApiError(
            400,
            f"the prompt has {n_prompt} tokens; the context limit is {limit}",
            param,
            "context_length_exceeded",
        )
    room = limit - n_prompt
    if req.max_tokens > room:
        if req.explicit_max:
            raise ApiError(
                400,
                f"max_tokens must be <= {room} (context {limit} - prompt {n_prompt}), "
                f"got {req.max_tokens}",
                "max_tokens",
                "context_length_exceeded",
            )
        return room
    return req.max_tokens


# -- responses --------------------------------------------------------------------------


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, last: Any, prefilled: int | None = None) -> dict[str, Any]:
    """OpenAI usage plus a ``draftwise`` object with the speculation statistics and
    ``prefill_tokens``: how many prompt tokens the model computed (the rest were reused
    from its KV cache)."""
    done = last.generation_tokens if last is not None else 0
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": done,
        "total_tokens": prompt_tokens + done,
        "draftwise": {
            "steps": last.steps if last is not None else 0,
            "mean_accepted": round(last.mean_accepted, 4) if last is not None else 0.0,
            "tokens_per_s": round(last.generation_tps, 3) if last is not None else 0.0,
            "prefill_tokens": prefilled,
        },
    }


def chunk(
    req: GenRequest,
    rid: str,
    created: int,
    text: str | None,
    finish: str | None,
    role: bool = False,
) -> dict[str, Any]:
    """One streamed chunk (``chat.completion.chunk`` or ``text_completion``)."""
    if req.kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
        if text:
            delta["content"] = text
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish,
        }
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return _envelope(req, rid, created, obj, choices=[choice])


def usage_chunk(req: GenRequest, rid: str, created: int, use: dict[str, Any]) -> dict[str, Any]:
    obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
    return _envelope(req, rid, created, obj, choices=[], usage=use)


def _envelope(req: GenRequest, rid: str, created: int, obj: str, **fields: Any) -> dict[str, Any]:
    """The fields every streamed chunk shares, then ``fields``."""
    return {"id": rid, "object": obj, "created": created, "model": req.model,
            "system_fingerprint": None, **fields}


def completion(
    req: GenRequest, rid: str, text: str, finish: str | None, use: dict[str, Any]
) -> dict[str, Any]:
    """The whole answer of a non-streaming request."""
    if req.kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return {
        "id": rid,
        "object": obj,
        "created": int(time.time()),
        "model": req.model,
        "system_fingerprint": None,
        "choices": [choice],
        "usage": use,
    }
