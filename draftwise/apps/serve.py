"""``draftwise serve``: an OpenAI-compatible HTTP server (FastAPI + uvicorn).

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions`` (both with
``"stream": true`` for server-sent events), ``GET /v1/models``, ``GET /health``. A
request may carry ``"draftwise": {"drafter": "none" | "cacheback", "budget": 16}``; the
``usage`` object adds ``draftwise: {steps, mean_accepted, tokens_per_s}``.

One model serves one request at a time: requests queue on the ``Session`` lock, and
each generation runs in its own worker thread while the event loop stays free. A client
that disconnects cancels its generation at the next step, freeing the model.

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
import sys
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from draftwise.apps.common import (
    add_drafter_args,
    add_model_args,
    add_sampling_args,
    sampling_kwargs,
)
from draftwise.apps.openai_schema import (
    ApiError,
    GenRequest,
    chunk,
    completion,
    error_body,
    new_id,
    parse_request,
    usage,
    usage_chunk,
)
from draftwise.errors import DraftwiseError

POLL_S = 0.5  # how often a waiting request checks that its client is still there


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
    return p


class Job:
    """One generation on a worker thread, its responses handed to the event loop."""

    def __init__(self, session: Any, ids: list[int], req: "GenRequest") -> None:
        from draftwise.session import CancelToken

        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.cancel = CancelToken()
        self.session, self.ids, self.req = session, ids, req
        threading.Thread(target=self._run, daemon=True, name="draftwise-generate").start()

    def _put(self, kind: str, value: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, value))
        except RuntimeError:  # the loop is gone (server shutting down)
            self.cancel.cancel()

    def _run(self) -> None:
        try:
            for r in self.session.stream(
                self.ids,
                cancel=self.cancel,
                stop=self.req.stop,
                chat_template=False,
                **self.req.options,
            ):
                self._put("step", r)
            self._put("end", None)
        except Exception as exc:  # reported to the client, the server keeps serving
            self._put("error", exc)

    async def events(self, request: Any) -> AsyncIterator[Any]:
        """Yield responses until the end; cancel the generation if the client leaves."""
        try:
            while True:
                try:
                    kind, value = await asyncio.wait_for(self.queue.get(), POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return
                    continue
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                yield value
        finally:
            self.cancel.cancel()  # a no-op when the generation already ended


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def create_app(session: Any, model_id: str, defaults: dict[str, Any]) -> Any:
    """The FastAPI app serving ``session`` under the name ``model_id``."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException

    app = FastAPI(title="draftwise", version="0.1.0")
    started = int(time.time())
    limit = session.model.backend.context_limit

    def error(
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> JSONResponse:
        return JSONResponse(error_body(message, type, param, code), status_code=status)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error(exc.status_code, str(exc.detail), kind)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error(422, f"invalid request: {exc.errors()[:1]}")

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        return error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_id, "busy": session.busy}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {"id": model_id, "object": "model", "created": started, "owned_by": "draftwise"}
            ],
        }

    def encode(req: GenRequest) -> list[int]:
        try:
            ids = session.model.encode_prompt(req.prompt, chat_template=req.kind == "chat")
        except DraftwiseError as exc:
            raise ApiError(400, str(exc), "messages" if req.kind == "chat" else "prompt") from None
        if len(ids) >= limit:
            raise ApiError(
                400,
                f"the prompt has {len(ids)} tokens; the context limit is {limit}",
                "messages" if req.kind == "chat" else "prompt",
                "context_length_exceeded",
            )
        return ids

    async def run(request: Request, kind: str) -> Any:
        ready = session.model.assets.ready
        req = parse_request(await request.body(), kind, defaults, [model_id], ready)
        ids = await asyncio.to_thread(encode, req)
        rid, created = new_id(kind), int(time.time())
        job = Job(session, ids, req)
        if req.stream:
            return StreamingResponse(
                stream_body(job, request, req, rid, created, len(ids)),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        parts: list[str] = []
        last = None
        try:
            async for last in job.events(request):
                parts.append(last.text)
        except DraftwiseError as exc:
            raise ApiError(400, str(exc)) from None
        finish = last.finish_reason if last is not None else None
        return completion(req, rid, "".join(parts), finish, usage(len(ids), last))

    async def stream_body(
        job: Job, request: Request, req: GenRequest, rid: str, created: int, n_prompt: int
    ) -> AsyncIterator[str]:
        last = None
        try:
            if req.kind == "chat":
                yield sse(chunk(req, rid, created, None, None, role=True))
            try:
                async for last in job.events(request):
                    if last.text or last.finish_reason is not None:
                        yield sse(chunk(req, rid, created, last.text, last.finish_reason))
            except Exception as exc:  # headers are gone: report in the stream, then end it
                kind = (
                    "invalid_request_error" if isinstance(exc, DraftwiseError) else "server_error"
                )
                yield sse(error_body(str(exc), kind))
            if req.include_usage:
                yield sse(usage_chunk(req, rid, created, usage(n_prompt, last)))
            yield "data: [DONE]\n\n"
        finally:  # also when the client left while a chunk was being sent
            job.cancel.cancel()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        return await run(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await run(request, "completion")

    return app


def main(args: argparse.Namespace) -> int:
    kwargs = sampling_kwargs(args)  # checks every flag before the model loads
    try:
        import uvicorn
    except ImportError:
        raise DraftwiseError(
            "draftwise serve needs fastapi and uvicorn: pip install 'draftwise[apps]'"
        ) from None
    from draftwise.session import Session

    if not 0 <= args.port < 65536:
        raise DraftwiseError(f"--port must be between 0 and 65535, got {args.port}")
    session = Session(args.model, backend=args.backend, dtype=args.dtype, cache_dir=args.cache_dir)
    for err in session.load_errors:
        print(f"draftwise serve: drafter state not loaded: {err}", file=sys.stderr)
    session.model.drafter(args.drafter)
    model_id = args.model_id or session.model.model_dir.name
    app = create_app(session, model_id, kwargs)
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
