"""CARD's worker stream on torch (``backends/cuda/gpu/streams.py``), run without a GPU: on CPU
the same calls go to a no-op stream, and the CUDA branch runs against recording stand-ins
for ``torch.cuda`` (which stream is made where, what waits for what, which thread makes
it current). Decoding with either stays lossless (fake target and draft: fast)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytestmark = [pytest.mark.torch]
torch = pytest.importorskip("torch")

from draftwise.backends.cuda.gpu import streams  # noqa: E402
from draftwise.core.drafters.base import NoDrafter  # noqa: E402
from draftwise.core.drafters.card import CardDrafter  # noqa: E402
from draftwise.drafting.draft_models import torch_worker  # noqa: E402
from tests.core.test_draft_drafters import GREEDY, HOT, run, similar_draft  # noqa: E402


class RecordingStream:
    """Stands in for ``torch.cuda.Stream``: remembers where it was made and its waits."""

    made: list[RecordingStream] = []

    def __init__(self, device: object = None) -> None:
        self.thread = threading.current_thread().name
        self.waited_on: list[RecordingStream] = []
        RecordingStream.made.append(self)

    def wait_stream(self, other: RecordingStream) -> None:
        self.waited_on.append(other)


@pytest.fixture
def fake_cuda(monkeypatch):  # type: ignore[no-untyped-def]
    """``torch.cuda``'s stream calls, recorded (no GPU needed)."""
    RecordingStream.made = []
    current: dict[str, RecordingStream] = {}  # thread name -> its current stream
    default = RecordingStream()

    def current_stream(device: object = None) -> RecordingStream:
        return current.get(threading.current_thread().name, default)

    def set_stream(s: RecordingStream) -> None:
        current[threading.current_thread().name] = s

    monkeypatch.setattr(torch.cuda, "Stream", RecordingStream)
    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    monkeypatch.setattr(torch.cuda, "set_stream", set_stream)
    return current, default


def decode_with(init, params, seed=None):  # type: ignore[no-untyped-def]
    card = CardDrafter(similar_draft(), beam=3, topk=2, depth=4, thread_init=init)
    try:
        out, _, _ = run(card, params, seed=seed, delay=0.002)
        assert card.stats()["forwards"] > 0
        return out
    finally:
        card.close()


def test_cpu_worker_stream_is_a_noop_on_the_same_code_path():
    init, layout = torch_worker(1, torch.device("cpu"))
    ws = init.worker_stream
    assert layout == "draft worker: own thread, torch 1 thread(s), cpu (no stream)"
    assert not ws.cuda and isinstance(ws.stream, streams.NullStream)
    plain, _, _ = run(NoDrafter(), GREEDY)
    assert decode_with(init, GREEDY) == plain
    assert ws.entered_by == "draftwise-card"  # entered in the worker thread, once
    assert ws.stream.waited_on == [ws.parent]


def test_cuda_branch_orders_the_worker_stream_after_the_target(fake_cuda):  # type: ignore[no-untyped-def]
    current, default = fake_cuda
    init, layout = torch_worker(2, torch.device("cuda", 0))
    ws = init.worker_stream
    assert ws.cuda and layout.endswith("own cuda stream on cuda:0")
    assert ws.parent is default  # the target's stream, captured where it was built
    assert ws.stream.thread == threading.current_thread().name
    hot_plain, _, _ = run(NoDrafter(), HOT, seed=4)
    assert decode_with(init, HOT, seed=4) == hot_plain
    assert ws.stream.waited_on == [default]  # waits for the target's writes first
    assert current["draftwise-card"] is ws.stream  # current in the worker only
    assert threading.current_thread().name not in current  # the target's is untouched
    assert np.all([s is default or s is ws.stream for s in RecordingStream.made])
