"""The llama.cpp bench peer and the float32 reference column (fast: fakes, no model),
plus one real llama-cpp-python generation that skips when it is not installed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from draftwise.apps.bench.llamacpp import LlamaCppPeer, find_gguf
from draftwise.apps.bench.metrics import OVERALL, mark_identical, summarize
from draftwise.apps.bench.peers import make_peers
from draftwise.apps.bench.records import BASELINE, DRAFTER, REFERENCE
from draftwise.apps.bench.report import render_markdown
from tests.apps.test_bench import rec


class FakeLlama:
    """Stands in for ``llama_cpp.Llama``: yields ``stream``, or raises after it."""

    def __init__(self, stream: list[int], fail: bool = False) -> None:
        self.stream, self.fail, self.resets, self.kwargs = stream, fail, 0, {}

    def reset(self) -> None:
        self.resets += 1

    def generate(self, ids: list[int], **kwargs: Any):  # type: ignore[no-untyped-def]
        self.kwargs = kwargs
        yield from self.stream
        if self.fail:
            raise RuntimeError("llama_decode returned -3")


def test_peer_stops_at_eos_and_max_tokens_greedy() -> None:
    llm = FakeLlama([5, 6, 2, 9])
    peer = LlamaCppPeer("llama.cpp", Path("x.gguf"), eos_ids=[2], threads=2, llm=llm)
    out = peer.generate([1, 2, 3], max_tokens=10)
    assert out.token_ids == [5, 6, 2] and out.finish_reason == "stop" and llm.resets == 1
    assert llm.kwargs["temp"] == 0.0 and llm.kwargs["top_k"] == 1  # greedy
    out = peer.generate([1], max_tokens=2)
    assert out.token_ids == [5, 6] and out.finish_reason == "length"


def test_peer_crash_is_recorded_not_hidden(capsys: pytest.CaptureFixture[str]) -> None:
    peer = LlamaCppPeer("llama.cpp-pld", Path("x.gguf"), [2], 2, llm=FakeLlama([4, 4], fail=True))
    out = peer.generate([1], max_tokens=8)
    assert out.token_ids == [4, 4]
    assert out.finish_reason == "error: RuntimeError: llama_decode returned -3"
    assert "llama.cpp-pld failed" in capsys.readouterr().err


def test_skipped_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    peers, skipped = make_peers(["llama.cpp"], Path("/m"), [2], no_gguf="model 'x' is no GGUF")
    assert peers == [] and skipped == {"llama.cpp": "model 'x' is no GGUF"}
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails as when absent
    peers, skipped = make_peers(["llama.cpp", "llama.cpp-pld"], Path("/m"), [2], gguf=Path("a.gguf"))
    assert peers == [] and set(skipped) == {"llama.cpp", "llama.cpp-pld"}
    assert "not installed" in skipped["llama.cpp"] and "setup.sh --llama-cpp" in skipped["llama.cpp"]


def test_find_gguf() -> None:
    assert find_gguf("/a/m.GGUF", Path("/c/m")) == (Path("/a/m.GGUF"), "")
    path, why = find_gguf("/a/hf", Path("/a/hf"))
    assert path is None and "not a GGUF file" in why


def test_reference_ratio_in_summary_and_report() -> None:
    records = [
        rec("none", BASELINE, "q", "qa", 1.0, [1] * 10),
        rec("none@float32", REFERENCE, "q", "qa", 2.0, [1] * 10),
        rec("auto", DRAFTER, "q", "qa", 0.5, [4, 4, 2]),
    ]
    mark_identical(records)
    rows = {r.method: r for r in summarize(records) if r.category == OVERALL}
    assert rows["auto"].speedup == pytest.approx(2.0)
    assert rows["auto"].speedup_vs_reference == pytest.approx(4.0)
    assert rows["none"].speedup_vs_reference == pytest.approx(2.0)
    assert rows["none@float32"].speedup == pytest.approx(0.5)
    cfg = {"reference": "none@float32", "reference_backend": "torch-cpu-float32"}
    md = render_markdown({"config": cfg, "summary": [r.to_json() for r in rows.values()]})
    assert "vs reference" in md and "| 4.00x |" in md and "`none@float32`" in md


@pytest.mark.slow
def test_real_llama_cpp_on_the_default_gguf() -> None:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed (setup.sh --llama-cpp)")
    from draftwise.models.default import default_gguf_path

    for name in ("llama.cpp", "llama.cpp-pld"):
        peer = LlamaCppPeer(name, default_gguf_path(), eos_ids=[2], threads=1)
        out = peer.generate([1, 504, 3458, 282, 4649, 314], max_tokens=6)
        assert out.finish_reason in ("length", "stop"), out.finish_reason
        assert 1 <= len(out.token_ids) <= 6 and out.wall_s > 0
