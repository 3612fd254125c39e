"""The compiled row argmax (``csrc/argmax.c``) the greedy CPU verify takes: it answers
what ``torch.argmax`` answers (first index of the maximum, a row's first NaN), over
bfloat16 and float32 logits, ties and infinities included; and the greedy verify uses it."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from draftwise.backends.cuda.cpu import native  # noqa: E402
from draftwise.core.tree import DraftTree  # noqa: E402


@pytest.fixture(scope="module")
def lib():
    found = native.argmax_lib()
    if found is None:
        pytest.skip("no compiled argmax here (no C compiler, or neither AVX-512 nor AVX2): torch's is used")
    return found


def _rows(seed: int, v: int) -> torch.Tensor:
    """(12, v) float32 rows of few distinct values (ties everywhere), with -inf rows, a
    NaN here and there, and a maximum in the tail past the last 16 lanes."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, (12, v)).astype(np.float32)  # (12, V)
    x[1] = -np.inf
    x[2, rng.integers(0, v)] = np.nan
    x[3, -1] = 9.0
    x[4, [0, v - 1]] = np.nan
    x[5, ::2] = -np.inf
    x[6, 0] = 9.0
    x[6, -1] = 9.0
    return torch.from_numpy(x)


@pytest.mark.parametrize("v", [1, 5, 16, 17, 100, 49152])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_argmax_is_torchs(lib, v, dtype):
    for seed in range(3):
        x = _rows(seed, v).to(dtype)
        want = x.float().argmax(dim=-1).numpy()
        assert native.native_argmax(lib, x).tolist() == want.tolist()


def test_native_argmax_refuses_what_it_cannot_read(lib):
    with pytest.raises(ValueError, match="bfloat16 or float32"):
        native.native_argmax(lib, torch.zeros(2, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="contiguous"):
        native.native_argmax(lib, torch.zeros(8, 2).t())


def test_the_verify_takes_it_and_agrees_with_the_logits(lib, default_model_dir, monkeypatch):
    """Greedy and sampling verifies both take the compiled argmax (read in place; a
    sampling verify's on first read), and it is the float32 logits' argmax."""
    from draftwise.backends.cuda import TorchBackend
    from draftwise.backends.cuda import backend as backend_mod

    calls = []
    real = backend_mod.native_argmax

    def counted(lib_, logits):
        calls.append(tuple(logits.shape))
        return real(lib_, logits)

    monkeypatch.setattr(backend_mod, "native_argmax", counted)
    be = TorchBackend.from_pretrained(default_model_dir, dtype="4bit", device="cpu", max_cache_len=256)
    rng = np.random.default_rng(4)
    ctx = rng.integers(0, 49152, 40)
    tree = DraftTree.chain(rng.integers(0, 49152, 3).tolist())
    be.prefill(ctx[:-1])
    greedy = be.verify(int(ctx[-1]), tree, need_logits=False).argmax
    assert calls == [(4, 49152)]
    be.reset()
    be.prefill(ctx[:-1])
    full = be.verify(int(ctx[-1]), tree, need_logits=True)
    assert calls == [(4, 49152)]  # not read yet: not made
    assert greedy.tolist() == full.argmax.tolist() == full.logits.argmax(-1).tolist()
    assert calls == [(4, 49152)] * 2
