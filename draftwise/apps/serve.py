"""``draftwise serve``: an OpenAI-compatible HTTP server (FastAPI + uvicorn).

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions`` (both with
``"stream": true`` for server-sent events), ``GET /v1/models``, ``GET /health``. A
request may carry ``"draftwise": {"drafter": "cacheback", "budget": 16}`` (a spec the
drafting layer accepts from a remote client); the ``usage`` object adds
``draftwise: {steps, mean_accepted, tokens_per_s, prefill_tokens}``.

Requests are checked against Pydantic models (``openai_models``: bounds on every
number, unsupported fields refused with a 400 naming them, a body-size cap), then wait in
a bounded FIFO queue for the one generation worker (``serve_queue``): over
``--max-queue`` a request gets 503 with ``Retry-After``, a queued stream gets SSE comment
keep-alives, a client that leaves is dropped from the queue or its generation cancelled
at the next step, and ``--max-seconds`` caps a generation's wall time. With
``--api-key`` every request needs ``Authorization: Bearer KEY`` and each key gets its own
drafter state. Errors carry a message and an id; details of server errors go to the log.

Example::

    draftwise serve --port 8080 --drafter cacheback
    curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\
      -d '{"messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 32}'
"""

# No ``from __future__ import annotations``: FastAPI reads the endpoint annotations at
# runtime, and ``Request`` is imported inside ``create_app`` to keep the CLI start light.
import argparse
import asyncio
import json
import logging
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from draftwise.apps.common import (
    add_drafter_args,
    add_model_args,
    add_sampling_args,
    sampling_kwargs,
)
from draftwise.apps.openai_models import ChatRequest, CompletionRequest, validation_message
from draftwise.apps.openai_schema import (
    ApiError,
    GenRequest,
    check_length,
    chunk,
    completion,
    error_body,
    new_error_id,
    new_id,
    to_gen_request,
    usage,
    usage_chunk,
)
from draftwise.apps.serve_http import ApiKeys, BodyLimit, ServeSettings, is_loopback
from draftwise.apps.serve_queue import KEEPALIVE, Job, QueueFull, Worker
from draftwise.errors import DraftwiseError

log = logging.getLogger("draftwise.serve")


def setup_arg_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="draftwise serve", description=__doc__)
    add_model_args(p)
    add_drafter_args(p)
    add_sampling_args(p)  # the defaults of requests that leave them out
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port to bind (default: 8080)")
    p.add_argument(
        "--model-id", default=None, help="model name clients use (default: the directory name)"
    )
    p.add_argument("--cache-dir", default=None, help="load drafter state on start, save it on exit")
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--max-queue",
        type=int,
        default=16,
        help="requests that may wait for the model; more get 503 (default: 16)",
    )
    p.add_argument(
        "--max-seconds",
        type=float,
        default=600.0,
        help="wall-time limit of one generation in seconds (default: 600)",
    )
    p.add_argument(
        "--max-body",
        type=int,
        default=4 << 20,
        help="largest request body in bytes (default: 4 MiB)",
    )
    p.add_argument(
        "--max-budget",
        type=int,
        default=64,
        help="largest draftwise.budget a request may ask for (default: 64)",
    )
    p.add_argument(
        "--keepalive",
        type=float,
        default=10.0,
        help="seconds between SSE keep-alive comments of a waiting stream (default: 10)",
    )
    p.add_argument(
        "--api-key",
        action="append",
        default=None,
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' (repeat for several keys); "
        "each key gets its own drafter state",
    )
    p.add_argument(
        "--prefix-cache",
        type=int,
        default=4096,
        help="tokens of finished requests' KV cache kept (per key) so a chat's next turn "
        "prefills only what is new; 0 = off (default: 4096)",
    )
    p.add_argument(
        "--max-keys",
        type=int,
        default=8,
        help="per-key drafter states kept in memory, least recently used evicted (default: 8)",
    )
    return p


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def client_error(exc: Exception) -> tuple[dict[str, Any], int]:
    """The error body and status a client sees for ``exc``: its own mistakes in full,
    anything else as an id that the server log names with the traceback."""
    if isinstance(exc, ApiError):
        return exc.body(), exc.status
    if isinstance(exc, DraftwiseError):
        return error_body(str(exc)), 400
    eid = new_error_id()
    log.error("internal error %s", eid, exc_info=exc)
    return error_body(f"internal server error (id {eid})", "server_error", id=eid), 500


def create_app(
    session: Any,
    model_id: str,
    defaults: dict[str, Any],
    settings: ServeSettings | None = None,
) -> Any:
    """The FastAPI app serving ``session`` under the name ``model_id``. Its worker
    thread starts now; the app's shutdown stops it."""
    from contextlib import asynccontextmanager

    from fastapi import Depends, FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException

    cfg = settings or ServeSettings()
    cfg.check()
    worker = Worker(session, cfg.max_queue, cfg.max_seconds)
    keys = ApiKeys(cfg.api_keys)

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(worker.stop)

    app = FastAPI(title="draftwise", version="0.1.0", lifespan=lifespan)
    app.state.worker = worker
    app.add_middleware(BodyLimit, max_bytes=cfg.max_body)
    started = int(time.time())
    limit = session.model.backend.context_limit

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), kind), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param, code = validation_message(exc.errors())
        return JSONResponse(error_body(message, param=param, code=code), status_code=400)

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        body, status = client_error(exc)
        return JSONResponse(body, status_code=status)

    def state_of(request: Request) -> str | None:
        """The drafter-state id of the request's key (None: no keys, one shared state).
        A dependency of every endpoint, so it runs before the body is validated: a client
        without a key learns nothing about what the server accepts."""
        if not keys.required:
            return None
        state = keys.state_of(request.headers.get("authorization"))
        if state is None:
            raise ApiError(
                401,
                "a valid API key is required (Authorization: Bearer KEY)",
                None,
                "invalid_api_key",
                "authentication_error",
            )
        return state

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_id, "busy": worker.busy, "waiting": worker.waiting}

    @app.get("/v1/models", dependencies=[Depends(state_of)])
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": model_id, "object": "model", "created": started, "owned_by": "draftwise"}
            ],
        }

    def encode(req: GenRequest) -> list[int]:
        try:
            chat = req.kind == "chat"
            ids: list[int] = session.model.encode_prompt(req.prompt, chat_template=chat)
        except DraftwiseError as exc:
            raise ApiError(400, str(exc), "messages" if req.kind == "chat" else "prompt") from None
        req.max_tokens = check_length(req, len(ids), limit)
        return ids

    async def run(
        request: Request, body: ChatRequest | CompletionRequest, state: str | None
    ) -> Any:
        ready = session.model.assets.ready
        req = to_gen_request(body, defaults, [model_id], cfg.max_budget, ready)
        ids = await asyncio.to_thread(encode, req)
        options = {**req.options, "max_tokens": req.max_tokens}
        if state is not None:
            options["state"] = state
        job = Job(ids, options, req.stop)
        try:
            worker.submit(job)
        except QueueFull as exc:
            raise ApiError(
                503,
                str(exc),
                None,
                "server_busy",
                "server_error",
                headers={"Retry-After": str(exc.retry_after)},
            ) from None
        except DraftwiseError as exc:  # shutting down
            raise ApiError(503, str(exc), None, "server_busy", "server_error") from None
        rid, created = new_id(req.kind), int(time.time())
        if req.stream:
            return StreamingResponse(
                stream_body(job, req, rid, created, len(ids)),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        parts: list[str] = []
        last = None
        try:
            async for r in job.events(cfg.keepalive_s, request.is_disconnected):
                if r is not KEEPALIVE:
                    last = r
                    parts.append(r.text)
        finally:
            worker.discard(job)
        finish = last.finish_reason if last is not None else None
        if finish is None:
            finish = "length"  # cut by the wall-time limit
        return completion(req, rid, "".join(parts), finish, usage(len(ids), last, job.prefilled))

    async def stream_body(
        job: Job, req: GenRequest, rid: str, created: int, n_prompt: int
    ) -> AsyncIterator[str]:
        last = None
        try:
            if req.kind == "chat":
                yield sse(chunk(req, rid, created, None, None, role=True))
            try:
                async for r in job.events(cfg.keepalive_s):
                    if r is KEEPALIVE:
                        yield ": keep-alive\n\n"
                        continue
                    last = r
                    if r.text or r.finish_reason is not None:
                        yield sse(chunk(req, rid, created, r.text, r.finish_reason))
                if last is None or last.finish_reason is None:  # the wall-time limit
                    yield sse(chunk(req, rid, created, None, "length"))
            except Exception as exc:  # headers are gone: report in the stream, then end it
                yield sse(client_error(exc)[0])
            if req.include_usage:
                yield sse(usage_chunk(req, rid, created, usage(n_prompt, last, job.prefilled)))
            yield "data: [DONE]\n\n"
        finally:  # also when the client left while a chunk was being sent
            worker.discard(job)

    @app.post("/v1/chat/completions")
    async def chat_completions(
        body: ChatRequest, request: Request, state: str | None = Depends(state_of)
    ) -> Any:
        return await run(request, body, state)

    @app.post("/v1/completions")
    async def completions(
        body: CompletionRequest, request: Request, state: str | None = Depends(state_of)
    ) -> Any:
        return await run(request, body, state)

    return app


def settings_of(args: argparse.Namespace) -> ServeSettings:
    cfg = ServeSettings(
        max_queue=args.max_queue,
        max_seconds=args.max_seconds,
        max_body=args.max_body,
        max_budget=args.max_budget,
        keepalive_s=args.keepalive,
        api_keys=list(args.api_key or []),
        max_keys=args.max_keys,
    )
    cfg.check()
    return cfg


def main(args: argparse.Namespace) -> int:
    kwargs = sampling_kwargs(args)  # checks every flag before the model loads
    cfg = settings_of(args)
    try:
        import uvicorn
    except ImportError:
        raise DraftwiseError(
            "draftwise serve needs fastapi and uvicorn: pip install 'draftwise[apps]'"
        ) from None
    from draftwise.session import Session

    if args.prefix_cache < 0:
        raise DraftwiseError(f"--prefix-cache must be >= 0, got {args.prefix_cache}")
    if not 0 <= args.port < 65536:
        raise DraftwiseError(f"--port must be between 0 and 65535, got {args.port}")
    if not cfg.api_keys and not is_loopback(args.host):
        print(
            f"draftwise serve: WARNING: listening on {args.host} without --api-key: anyone "
            "who can reach this address can use the model, and all clients share what the "
            "drafters learn (one client may infer what another sent)",
            file=sys.stderr,
        )
    session = Session(
        args.model,
        backend=args.backend,
        dtype=args.dtype,
        cache_dir=args.cache_dir,
        invariant=args.invariant,
        max_states=cfg.max_keys,
        keep_prefixes=args.prefix_cache,
    )
    session.check_loaded()  # a corrupt state file: refuse to start, leave it untouched
    session.model.drafter(args.drafter)
    model_id = args.model_id or session.model.model_dir.name
    app = create_app(session, model_id, kwargs, cfg)
    print(
        f"draftwise serve: {model_id} on http://{args.host}:{args.port}/v1 "
        f"(drafter {args.drafter})",
        file=sys.stderr,
        flush=True,
    )
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        session.close()
    return 0
