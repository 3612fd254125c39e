"""One generation worker and a bounded FIFO queue for ``draftwise serve``.

A model runs one generation at a time, so the server keeps one worker thread that takes
jobs in arrival order. At most ``max_queue`` jobs wait; one more is refused at once
(``QueueFull``, an HTTP 503 with ``Retry-After``) instead of waiting without limit. A job
whose client leaves is dropped from the queue, or cancelled at its next step when it
runs; a job that runs past ``max_seconds`` is stopped (its answer ends as if cut by
``max_tokens``). Responses go from the worker to the event loop through an
``asyncio.Queue``; a consumer waiting longer than ``keepalive_s`` gets ``KEEPALIVE`` so
a stream can send an SSE comment and proxies do not cut it.

Example (inside a coroutine)::

    worker = Worker(session, max_queue=8, max_seconds=300)
    job = Job(ids, options, stop=[])
    worker.submit(job)                    # raises QueueFull when 8 already wait
    async for r in job.events(keepalive_s=10):
        ...                               # GenerationResponse or KEEPALIVE
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from draftwise.errors import DraftwiseError
from draftwise.session import CancelToken

log = logging.getLogger("draftwise.serve")
KEEPALIVE = object()  # yielded by Job.events when nothing happened for a while


class QueueFull(Exception):
    """Too many jobs wait; ``retry_after`` is a guess in seconds."""

    def __init__(self, waiting: int, retry_after: int) -> None:
        super().__init__(f"the server is busy ({waiting} requests waiting); retry later")
        self.retry_after = retry_after


class Deadline(CancelToken):
    """A cancel token that also fires ``seconds`` after ``start()``."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self._end: float | None = None

    def start(self) -> None:
        self._end = time.monotonic() + self.seconds

    @property
    def expired(self) -> bool:
        return self._end is not None and time.monotonic() > self._end

    @property
    def cancelled(self) -> bool:
        return super().cancelled or self.expired


class Job:
    """One request's generation: what to run, and the responses it produced so far."""

    def __init__(self, ids: list[int], options: dict[str, Any], stop: list[str]) -> None:
        self.loop = asyncio.get_running_loop()
        self.events_q: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.ids, self.options, self.stop = ids, options, stop
        self.cancel: Deadline = Deadline(float("inf"))
        self.state = "new"  # new -> queued -> running -> done
        self.prefilled: int | None = None  # prompt tokens the model had to compute

    def put(self, kind: str, value: Any = None) -> None:
        """From the worker thread: hand an event to the event loop."""
        try:
            self.loop.call_soon_threadsafe(self.events_q.put_nowait, (kind, value))
        except RuntimeError:  # the loop is gone (server shutting down)
            self.cancel.cancel()

    @property
    def timed_out(self) -> bool:
        return self.cancel.expired

    async def events(
        self,
        keepalive_s: float = 10.0,
        disconnected: Callable[[], Awaitable[bool]] | None = None,
        poll_s: float = 0.5,
    ) -> AsyncIterator[Any]:
        """Yield responses until the end (``KEEPALIVE`` after ``keepalive_s`` of silence);
        stop, cancelling the job, when ``disconnected()`` says the client left. Raises
        the generation's error."""
        quiet = 0.0
        checked = time.monotonic()
        try:
            while True:
                if disconnected is not None and time.monotonic() - checked >= poll_s:
                    checked = time.monotonic()  # also while responses keep coming
                    if await disconnected():
                        return
                try:
                    kind, value = await asyncio.wait_for(self.events_q.get(), poll_s)
                except asyncio.TimeoutError:
                    quiet += poll_s
                    if quiet >= keepalive_s:
                        quiet = 0.0
                        yield KEEPALIVE
                    continue
                quiet = 0.0
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                yield value
        finally:
            self.cancel.cancel()  # a no-op when the generation already ended


class Worker:
    """The one thread that runs generations, FIFO, with at most ``max_queue`` waiting."""

    def __init__(self, session: Any, max_queue: int = 16, max_seconds: float = 600.0) -> None:
        if max_queue < 0:
            raise DraftwiseError(f"--max-queue must be >= 0, got {max_queue}")
        if max_seconds <= 0:
            raise DraftwiseError(f"--max-seconds must be > 0, got {max_seconds}")
        self.session = session
        self.max_queue, self.max_seconds = max_queue, max_seconds
        self._waiting: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._running: Job | None = None
        self._stopped = False
        self._mean_s = 5.0  # running mean of job durations, for Retry-After
        self._thread = threading.Thread(target=self._loop, daemon=True, name="draftwise-worker")
        self._thread.start()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def busy(self) -> bool:
        return self._running is not None

    def submit(self, job: Job) -> None:
        """Queue ``job``; raise ``QueueFull`` when ``max_queue`` jobs already wait."""
        with self._cond:
            if self._stopped:
                raise DraftwiseError("the server is shutting down")
            # a free worker takes the job at once, so it does not count as waiting
            limit = self.max_queue + (self._running is None and not self._waiting)
            if len(self._waiting) >= limit:
                guess = self._mean_s * (len(self._waiting) + 1)
                raise QueueFull(len(self._waiting), max(1, min(600, round(guess))))
            job.cancel = Deadline(self.max_seconds)
            job.state = "queued"
            self._waiting.append(job)
            self._cond.notify()

    def discard(self, job: Job) -> None:
        """Cancel ``job``; if it still waits, free its place in the queue now."""
        job.cancel.cancel()
        with self._cond:
            if job in self._waiting:
                self._waiting.remove(job)
                job.state = "done"

    def stop(self) -> None:
        """Cancel the running job and every waiting one; the thread ends."""
        with self._cond:
            self._stopped = True
            pending, self._waiting = list(self._waiting), collections.deque()
            if self._running is not None:
                self._running.cancel.cancel()
            self._cond.notify()
        for job in pending:
            job.cancel.cancel()
            job.put("end")
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                job = self._running = self._waiting.popleft()
                job.state = "running"
            t0 = time.monotonic()
            try:
                self._run(job)
            finally:
                with self._cond:
                    self._running = None
                    job.state = "done"
                self._mean_s = 0.8 * self._mean_s + 0.2 * (time.monotonic() - t0)

    def _run(self, job: Job) -> None:
        if job.cancel.cancelled:  # the client left while it waited
            job.put("end")
            return
        job.cancel.start()
        try:
            for r in self.session.stream(
                job.ids, cancel=job.cancel, stop=job.stop, chat_template=False, **job.options
            ):
                if job.prefilled is None:
                    job.prefilled = getattr(self.session.model.decoder, "prefilled", None)
                job.put("step", r)
            job.put("end")
        except Exception as exc:  # reported to the client; the worker keeps serving
            job.put("error", exc)
