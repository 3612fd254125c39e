"""The CUDA per-step path under CPU tensors: rows sampled where the logits are give the
host path's tokens, one upload per verify, and the same seed gives the same text as plain
decoding whether acceptance runs on the host or on the device."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors.torch")

from draftwise.backends.cuda import TorchBackend  # noqa: E402
from draftwise.backends.cuda.gpu import sampling as ds  # noqa: E402
from draftwise.core.backend import SamplingVerifier  # noqa: E402
from draftwise.core.decode import Decoder  # noqa: E402
from draftwise.core.drafters.base import NoDrafter  # noqa: E402
from draftwise.core.drafters.cacheback import Cacheback  # noqa: E402
from draftwise.core.sampling import SamplingParams, next_token, recent_windows  # noqa: E402
from draftwise.core.tree import DraftTree  # noqa: E402
from tests.backends.cuda.test_torch_backend import _save_tiny  # noqa: E402

PARAMS = [
    SamplingParams(temperature=0.8),
    SamplingParams(temperature=1.3, top_k=5),
    SamplingParams(temperature=0.7, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=1.0, top_p=0.5, repetition_penalty=1.3, repetition_context=4),
    SamplingParams(temperature=0.0, repetition_penalty=1.5, repetition_context=3),
]


@pytest.mark.parametrize("params", PARAMS)
def test_sample_rows_equals_next_token(params: SamplingParams) -> None:
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal((64, 50)) * 3).astype(np.float32)  # (R, V)
    recent = rng.integers(0, 50, (64, params.repetition_context))  # (R, W)
    u = rng.random(64)
    got = ds.sample_rows(torch.from_numpy(logits), torch.from_numpy(recent), torch.from_numpy(u), params)
    want = [next_token(logits[r], recent[r], params, float(u[r])) for r in range(64)]
    assert got.tolist() == want


def test_recent_windows_are_each_rows_context_and_path() -> None:
    t = DraftTree.from_paths([[5, 6, 7], [5, 8], [9]])
    ctx = np.array([1, 2, 3])
    for w in (0, 2, 4, 6):
        got = recent_windows(ctx, t.tokens, t.parents, t.depth, w)
        assert got.shape == (len(t) + 1, w)
        for r in range(len(t) + 1):
            path = t.tokens[t.path_to(r - 1)] if r else np.zeros(0, np.int64)
            want = np.concatenate([ctx[-w:] if w else ctx[:0], path])[-w:] if w else path[:0]
            assert set(got[r].tolist()) == set(want.tolist())  # left padding repeats a token
            if want.size == w:
                assert got[r].tolist() == want.tolist()


class HostOnly:
    """The same backend without ``verify_sampled``: acceptance on the host."""

    def __init__(self, inner: TorchBackend) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> object:
        if name == "verify_sampled":
            raise AttributeError(name)
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def tiny_backend(tmp_path_factory: pytest.TempPathFactory) -> TorchBackend:
    model_dir, _ = _save_tiny(Path(tmp_path_factory.mktemp("ds")) / "m", "llama")
    be = TorchBackend.from_pretrained(model_dir, dtype="float32", device="cpu", invariant=False)
    assert not be.device_sampling  # on by default on CUDA only
    be.device_sampling = True  # the CUDA path, run under CPU tensors
    return be


@pytest.mark.parametrize("params", PARAMS[:4:3] + PARAMS[4:])
def test_same_seed_same_text_device_or_host(tiny_backend: TorchBackend, params, monkeypatch) -> None:
    assert isinstance(tiny_backend, SamplingVerifier)
    assert not isinstance(HostOnly(tiny_backend), SamplingVerifier)
    uploads = []
    real = ds.HostStaging.upload
    monkeypatch.setattr(ds.HostStaging, "upload", lambda self, h: uploads.append(h.shape) or real(self, h))
    sampled = []
    real_vs = TorchBackend.verify_sampled
    monkeypatch.setattr(TorchBackend, "verify_sampled", lambda self, *a: sampled.append(1) or real_vs(self, *a))
    prompt = [3, 17, 42, 5, 3, 17, 42, 5, 3, 17]
    outs = {}
    for name, be, drafter in [
        ("plain-host", HostOnly(tiny_backend), NoDrafter()),
        ("plain-device", tiny_backend, NoDrafter()),
        ("spec-device", tiny_backend, Cacheback()),
        ("spec-host", HostOnly(tiny_backend), Cacheback()),
    ]:
        steps = list(Decoder(be).steps(prompt, drafter, params, 24, seed=11, budget=8))
        outs[name] = [t for s in steps for t in s.tokens]
        if name.startswith("spec"):
            assert sum(s.drafted for s in steps) > 0  # trees were verified
    assert len(outs["plain-host"]) == 24
    assert all(o == outs["plain-host"] for o in outs.values()), outs
    assert uploads and all(len(s) == 2 for s in uploads)  # one packed upload per verify
    assert sampled  # the device path ran (the host-only wrapper never calls it)


def test_staging_shares_host_memory_on_cpu_and_pins_on_cuda() -> None:
    host = np.arange(12, dtype=np.int64).reshape(3, 4)
    dev = ds.HostStaging(torch.device("cpu")).upload(host)
    assert dev.data_ptr() == host.ctypes.data  # no copy at all on CPU
    if torch.cuda.is_available():
        st = ds.HostStaging(torch.device("cuda"))
        out = st.upload(host)
        assert st._buf is not None and st._buf.is_pinned() and out.cpu().numpy().tolist() == host.tolist()
