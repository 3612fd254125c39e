"""OpenAI wire format for ``draftwise serve``: request checks and response bodies.

Plain dicts in, plain dicts out, no web framework here, so the rules are easy to test.
A bad request raises ``ApiError``, which carries the HTTP status and the OpenAI error body.

Example::

    >>> req = parse_request(b'{"messages": [{"role": "user", "content": "Hi"}]}', "chat",
    ...                     {"max_tokens": 16, "temp": 0.0}, ["m"])
    >>> req.max_tokens, req.stream
    (16, False)
    >>> try:
    ...     parse_request(b'{"prompt": "x", "max_tokens": 0}', "completion", {}, ["m"])
    ... except ApiError as exc:
    ...     print(exc.status, exc)
    400 max_tokens must be an integer >= 1, got 0
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from draftwise.drafting import check_spec
from draftwise.errors import DraftwiseError
from draftwise.session import MAX_REQUEST_BUDGET


class ApiError(Exception):
    """A client mistake: HTTP ``status`` plus the OpenAI ``{"error": {...}}`` body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
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
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


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


def _number(
    body: dict[str, Any], key: str, default: float, lo: float, hi: float | None = None
) -> float:
    value = body.get(key)
    if value is None:
        return default
    bad = isinstance(value, bool) or not isinstance(value, (int, float))
    if bad or value < lo or (hi is not None and value > hi):
        limit = f">= {lo}" if hi is None else f"between {lo} and {hi}"
        raise ApiError(400, f"{key} must be a number {limit}, got {value!r}", key, "invalid_value")
    return float(value)


def _integer(
    body: dict[str, Any], key: str, default: int | None, lo: int, name: str | None = None
) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ApiError(
            400,
            f"{name or key} must be an integer >= {lo}, got {value!r}",
            name or key,
            "invalid_value",
        )
    return value


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(
            400,
            "messages must be a non-empty list of {role, content} objects",
            "messages",
            "missing_required_parameter" if messages is None else "invalid_type",
        )
    out = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(content, str)
        ):
            raise ApiError(
                400,
                f"messages[{i}] needs a string 'role' and text 'content', got {m!r}",
                f"messages[{i}]",
                "invalid_type",
            )
        out.append({"role": m["role"], "content": content})
    return out


def _prompt(body: dict[str, Any]) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return prompt
    raise ApiError(
        400,
        "prompt must be a non-empty string or list of token ids (one prompt per request)",
        "prompt",
        "missing_required_parameter" if prompt is None else "invalid_type",
    )


def _stop(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or len(stops) > 4
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise ApiError(
            400,
            f"stop must be a string or a list of up to 4 non-empty strings, got {stop!r}",
            "stop",
            "invalid_value",
        )
    return stops


def _extension(
    body: dict[str, Any], defaults: dict[str, Any], ready: Callable[[str], bool] | None
) -> dict[str, Any]:
    """The ``draftwise`` object: a drafter spec checked as a remote client's (registry
    names and remote-safe options only, no asset built inside a request) and a bounded
    budget."""
    ext = body.get("draftwise") or {}
    if not isinstance(ext, dict):
        raise ApiError(
            400,
            f'draftwise must be an object like {{"drafter": "cacheback"}}, got {ext!r}',
            "draftwise",
            "invalid_type",
        )
    unknown = sorted(set(ext) - {"drafter", "budget"})
    if unknown:
        raise ApiError(
            400,
            f"unknown draftwise option {unknown[0]!r} (known: drafter, budget)",
            f"draftwise.{unknown[0]}",
            "invalid_value",
        )
    default = defaults.get("drafter", "auto")
    drafter = ext.get("drafter", default)
    if not isinstance(drafter, str):
        raise ApiError(400, f"draftwise.drafter must be a string, got {drafter!r}",
                       "draftwise.drafter", "invalid_type")
    if drafter != default:  # the server's own drafter was chosen by its operator
        try:
            check_spec(drafter, remote=True, max_budget=MAX_REQUEST_BUDGET, ready=ready)
        except DraftwiseError as exc:
            raise ApiError(400, str(exc), "draftwise.drafter", "invalid_value") from None
    budget = _integer(ext, "budget", defaults.get("budget", 16), 0, "draftwise.budget")
    if budget is not None and budget > MAX_REQUEST_BUDGET:
        raise ApiError(400, f"draftwise.budget must be <= {MAX_REQUEST_BUDGET}, got {budget}",
                       "draftwise.budget", "invalid_value")
    return {"drafter": drafter, "budget": budget}


def parse_request(
    raw: bytes, kind: str, defaults: dict[str, Any], model_ids: list[str],
    ready: Callable[[str], bool] | None = None,
) -> GenRequest:
    """Check a ``/v1/chat/completions`` (``kind="chat"``) or ``/v1/completions`` body.

    ``defaults`` are the server's flags (``max_tokens``, ``temp``, ``top_p``, ``seed``,
    ``drafter``, ``budget``, ...); the request overrides them. ``ready(asset)`` says
    whether a drafter asset is built (``Model.assets.ready``): a drafter needing one that
    is not is refused, never built inside a request.
    """
    try:
        body = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(
            400, f"the request body is not valid JSON: {exc}", None, "invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise ApiError(
            400,
            f"the request body must be a JSON object, got {type(body).__name__}",
            None,
            "invalid_json",
        )
    model = body.get("model") or model_ids[0]
    if model not in model_ids:
        raise ApiError(
            404,
            f"the model {model!r} does not exist (serving: {', '.join(model_ids)})",
            "model",
            "model_not_found",
        )
    prompt: Any = _messages(body) if kind == "chat" else _prompt(body)
    if body.get("n") not in (None, 1):
        raise ApiError(
            400,
            f"n must be 1 (one answer per request), got {body.get('n')!r}",
            "n",
            "invalid_value",
        )
    key = (
        "max_completion_tokens"
        if kind == "chat" and body.get("max_completion_tokens") is not None
        else "max_tokens"
    )
    max_tokens = _integer(body, key, defaults.get("max_tokens", 256), 1)
    seed = _integer(body, "seed", defaults.get("seed"), -(2**63))
    options = {
        "temp": _number(body, "temperature", defaults.get("temp", 0.0), 0.0),
        "top_p": _number(body, "top_p", defaults.get("top_p", 1.0), 0.0, 1.0),
        "top_k": defaults.get("top_k", 0),
        "min_p": defaults.get("min_p", 0.0),
        "repetition_penalty": defaults.get("repetition_penalty", 1.0),
        "seed": None if seed is None else seed % 2**63,
        "max_tokens": max_tokens,
        **_extension(body, defaults, ready),
    }
    if options["top_p"] == 0.0:
        raise ApiError(400, "top_p must be > 0, got 0", "top_p", "invalid_value")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(
            400, f"stream must be true or false, got {stream!r}", "stream", "invalid_type"
        )
    usage_opt = body.get("stream_options") or {}
    include_usage = bool(usage_opt.get("include_usage")) if isinstance(usage_opt, dict) else False
    return GenRequest(
        kind, prompt, model, stream, include_usage, int(max_tokens or 1), options, _stop(body)
    )


# -- responses --------------------------------------------------------------------------


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, last: Any) -> dict[str, Any]:
    """OpenAI usage plus a ``draftwise`` object with the speculation statistics."""
    done = last.generation_tokens if last is not None else 0
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": done,
        "total_tokens": prompt_tokens + done,
        "draftwise": {
            "steps": last.steps if last is not None else 0,
            "mean_accepted": round(last.mean_accepted, 4) if last is not None else 0.0,
            "tokens_per_s": round(last.generation_tps, 3) if last is not None else 0.0,
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
