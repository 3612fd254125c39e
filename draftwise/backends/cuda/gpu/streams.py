"""A compute stream for CARD's draft worker thread: a CUDA stream on a GPU, a no-op on CPU.

torch's current CUDA stream is per thread, so a worker that sets its own stream runs its
draft forwards beside the target's instead of queueing behind them on the default
stream. Before its first kernel the worker's stream waits for the stream that was current
where the ``WorkerStream`` was made (the target's): the draft model's KV cache and the
weights it shares were written there. Everything else the two threads exchange is numpy
(tokens, snapshots), and the worker's ``.cpu()`` copies synchronize its own stream.

On CPU the same calls run with a ``NullStream`` (nothing to order: CPU kernels are
synchronous), so the worker's stream logic runs in CPU-only tests too.

Example::

    ws = WorkerStream(torch.device("cpu"))   # made in the target's thread
    # in the worker thread, before any draft forward:
    ws.enter()                                # CUDA: wait for the target's stream, use ours
    ws.describe()                             # 'cpu (no stream)'
"""

from __future__ import annotations

import torch


class NullStream:
    """The CPU stand-in for ``torch.cuda.Stream``: records waits, orders nothing."""

    def __init__(self) -> None:
        self.waited_on: list[NullStream] = []

    def wait_stream(self, other: NullStream) -> None:
        self.waited_on.append(other)


class WorkerStream:
    """The worker thread's stream, and the stream it must first wait for."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream: torch.cuda.Stream | NullStream
        self.parent: torch.cuda.Stream | NullStream
        if self.cuda:
            self.parent = torch.cuda.current_stream(device)
            self.stream = torch.cuda.Stream(device)
        else:
            self.parent, self.stream = NullStream(), NullStream()
        self.entered_by: str | None = None  # the thread that made it current

    def enter(self) -> None:
        """Make this stream current in the calling thread, after the parent's work."""
        import threading

        self.stream.wait_stream(self.parent)  # type: ignore[arg-type]
        if self.cuda:
            assert isinstance(self.stream, torch.cuda.Stream)
            torch.cuda.set_stream(self.stream)
        self.entered_by = threading.current_thread().name

    def describe(self) -> str:
        """The layout in words, for the bench record."""
        if self.cuda:
            return f"own cuda stream on {self.device}"
        return f"{self.device.type} (no stream)"
