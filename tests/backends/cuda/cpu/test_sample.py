"""The compiled sampler (``csrc/sample.c``) the CPU verify hands the decoder at
temperature > 0: each row's token equals ``core.sampling.next_token``'s for the same
uniform (penalty windows with repeated ids, several temperatures, bfloat16 and float32
logits, vocabularies off the 16-lane blocks); bad input is refused; the decoder samples
through it and gives the numpy path's text."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from draftwise.backends.cuda.cpu import native  # noqa: E402
from draftwise.core.sampling import SamplingParams, next_token  # noqa: E402


@pytest.fixture(scope="module")
def lib():
    found = native.sample_lib()
    if found is None:
        pytest.skip("no compiled sampler here (no C compiler, or neither AVX-512 nor AVX2 and FMA): numpy samples")
    return found


@pytest.mark.parametrize("v", [1, 7, 16, 33, 1000, 49152])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_row_takes_the_token_next_token_gives(lib, v, dtype):
    rng = np.random.default_rng(v)
    for trial in range(40):
        temp = float(rng.choice([0.2, 0.8, 1.0, 1.9]))
        pen = float(rng.choice([1.0, 1.3, 0.7]))
        scale = float(rng.choice([0.5, 3.0, 12.0]))
        logits = (torch.randn(3, v, generator=torch.Generator().manual_seed(trial)) * scale).to(dtype)
        w = int(rng.choice([0, 1, 8, 64]))
        recent = rng.integers(0, v, (3, w))
        if w > 3:
            recent[:, 3] = recent[:, 1]  # a token twice in the window: penalised once
        u = rng.random(3)
        u[0] = 0.0 if trial % 7 == 0 else u[0]  # the first token with a probability
        params = SamplingParams(temperature=temp, repetition_penalty=pen)
        got = native.native_sample(lib, logits, recent, u, params)
        lf = logits.float().numpy()
        want = [next_token(lf[r], recent[r], params, float(u[r])) for r in range(3)]
        assert got.tolist() == want, (trial, temp, pen, w)


def test_a_peaked_row_and_u_near_one(lib):
    """All mass on one token (the others 1e-300 and less: exp underflows to 0), and a
    uniform a hair below 1: the last token with a probability, never past the vocabulary."""
    logits = torch.full((2, 100), -1000.0)
    logits[0, 42] = 0.0
    logits[1, :] = 0.0
    u = np.array([0.999999999, 1.0 - 1e-16])
    got = native.native_sample(lib, logits, np.zeros((2, 0), np.int64), u, SamplingParams(temperature=1.0))
    assert got.tolist() == [42, 99]


def test_bad_input_is_refused(lib):
    logits = torch.zeros((2, 10))
    params = SamplingParams(temperature=0.8, repetition_penalty=1.2)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        native.native_sample(lib, logits, np.array([[3], [10]]), np.array([0.1, 0.2]), params)
    with pytest.raises(ValueError, match="windows"):
        native.native_sample(lib, logits, np.zeros((1, 2), np.int64), np.array([0.1, 0.2]), params)
    for other in (SamplingParams(temperature=0.8, top_p=0.9), SamplingParams(temperature=0.8, top_k=5),
                  SamplingParams(temperature=0.8, min_p=0.1), SamplingParams(temperature=0.0)):
        assert not native.native_sampling_takes(other)
        with pytest.raises(ValueError, match="temperature and a penalty only"):
            native.native_sample(lib, logits, np.zeros((2, 0), np.int64), np.array([0.1, 0.2]), other)
    with pytest.raises(ValueError, match="bfloat16 or float32"):
        native.native_sample(lib, logits.double(), np.zeros((2, 0), np.int64), np.array([0.1, 0.2]), params)


def test_the_decoder_samples_through_the_backend_and_gives_numpys_text(lib, tmp_path, monkeypatch):
    """A tiny llama at T = 0.8 with a penalty: the compiled sampler's text equals the
    numpy path's, plain and speculative, and the verify offered it (``Verified.sample``)."""
    from draftwise.backends.cuda import TorchBackend
    from draftwise.core.decode import Decoder
    from draftwise.core.drafters.base import NoDrafter
    from draftwise.core.drafters.cacheback import Cacheback
    from tests.backends.cuda.test_torch_backend import V, _save_tiny

    model_dir = _save_tiny(tmp_path / "m", "llama3")[0]
    prompt = np.random.default_rng(5).integers(0, V, 10)
    prompt = np.concatenate([prompt, prompt])
    params = SamplingParams(temperature=0.8, repetition_penalty=1.1)
    texts = {}
    for native_on in ("1", "0"):
        monkeypatch.setenv("DRAFTWISE_NATIVE_SAMPLING", native_on)
        be = TorchBackend.from_pretrained(model_dir, dtype="bfloat16", device="cpu", invariant=True)
        assert (be._sample_lib is not None) == (native_on == "1")
        offered = []
        real = be._finish

        def finish(logits, need_logits, real=real, offered=offered):
            out = real(logits, need_logits)
            offered.append(out.sample is not None)
            return out

        be._finish = finish  # type: ignore[method-assign]
        for drafter in (NoDrafter(), Cacheback()):
            be.reset()
            steps = Decoder(be).steps(prompt, drafter, params, 24, seed=11)
            texts[(native_on, type(drafter).__name__)] = [t for s in steps for t in s.tokens]
        assert offered and all(offered) == (native_on == "1")
    assert len(set(map(tuple, texts.values()))) == 1, texts


def test_a_sampling_verify_copies_its_logits_only_when_read(lib, tmp_path):
    """With the compiled sampler a sampling verify leaves the float32 copy of its rows
    and their argmax to the first read (the decoder never reads them); read, they are
    the rows' float32 logits and the greedy verify's argmax."""
    from draftwise.backends.cuda import TorchBackend
    from draftwise.core.tree import DraftTree
    from tests.backends.cuda.test_torch_backend import V, _save_tiny

    model_dir = _save_tiny(tmp_path / "m", "llama3")[0]
    be = TorchBackend.from_pretrained(model_dir, dtype="bfloat16", device="cpu", invariant=True)
    assert be._sample_lib is not None
    prompt = np.random.default_rng(2).integers(0, V, 12)
    tree = DraftTree.chain([int(prompt[3]), int(prompt[4])])
    outs = {}
    for need in (False, True):
        be.reset()
        be.prefill(prompt[:-1])
        outs[need] = be.verify(int(prompt[-1]), tree, need_logits=need)
    lazy = outs[True]
    assert lazy.sample is not None and lazy._logits is None and lazy._argmax is None
    logits = lazy.logits
    assert logits is not None and logits.dtype == np.float32 and logits.shape == (3, V)
    assert np.array_equal(lazy.argmax, outs[False].argmax)
    assert np.array_equal(logits.argmax(-1), outs[False].argmax)
