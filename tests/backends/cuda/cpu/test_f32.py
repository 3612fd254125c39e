"""The compiled float32 matmul (``f32.py``, ``csrc/f32.c``): it agrees with torch's matmul
to float32 rounding, gives a row the same bits whatever other rows and thread counts it
runs with, pads odd output sizes, takes leading dimensions, refuses bad input, and the
float32 model takes it where ``native.f32_lib()`` says so (plain decoding then equals each
verified row bit for bit)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from draftwise.backends.cuda.cpu import f32, native  # noqa: E402
from draftwise.backends.cuda.cpu.f32 import F32Weight  # noqa: E402
from draftwise.errors import DraftwiseError  # noqa: E402


@pytest.fixture(scope="module")
def kernel():
    if native.f32_kernel() is None:
        pytest.skip("no C compiler or no AVX2/FMA here: the float32 mode keeps torch's matmul")
    return native.f32_kernel()


@pytest.mark.parametrize("n,k", [(960, 576), (576, 1536), (40, 33), (16, 1)])
def test_matches_torch_to_rounding(kernel, n, k):
    g = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=g)
    x = torch.randn(7, k, generator=g)
    y = F32Weight.from_dense(w)(x)
    assert y.shape == (7, n) and y.dtype == torch.float32
    ref = (x.double() @ w.double().T).float()
    # a chain of k float32 FMAs: error within a few k-scaled ulps of the terms' sizes
    bound = 1e-6 * k * (x.abs().double() @ w.abs().double().T).float() + 1e-6
    assert torch.all((y - ref).abs() <= bound)


def test_rows_are_invariant_to_the_batch_and_the_threads(kernel):
    g = torch.Generator().manual_seed(1)
    w = F32Weight.from_dense(torch.randn(3072, 576, generator=g))
    x = torch.randn(20, 576, generator=g)
    full = w(x)
    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for t in range(1, 21):  # chunks of 6 rows, remainders, the 1-row path
                assert torch.equal(w(x[:t]), full[:t]), (threads, t)
            for i in (0, 5, 6, 13, 19):
                assert torch.equal(w(x[i : i + 1]), full[i : i + 1]), (threads, i)
    finally:
        torch.set_num_threads(before)


def test_padding_and_leading_dims(kernel):
    g = torch.Generator().manual_seed(2)
    w_dense = torch.randn(37, 64, generator=g)  # 37 outputs: 3 tiles, 11 rows of padding
    w = F32Weight.from_dense(w_dense)
    assert w.packed.shape == (3, 64, 16) and w.shape == (37, 64)
    x = torch.randn(2, 3, 64, generator=g)
    y = w(x)
    assert y.shape == (2, 3, 37)
    assert torch.equal(y.reshape(6, 37), w(x.reshape(6, 64)))
    assert torch.allclose(y, x @ w_dense.T, atol=1e-4)
    assert w(torch.zeros(0, 64)).shape == (0, 37)


def test_rows_cut_the_head_without_a_copy(kernel):
    g = torch.Generator().manual_seed(3)
    w_dense = torch.randn(70, 32, generator=g)
    w = F32Weight.from_dense(w_dense)
    x = torch.randn(3, 32, generator=g)
    for n in (1, 16, 20, 70):
        cut = w.rows(n)
        assert cut.shape == (n, 32) and cut.data_ptr() == w.data_ptr()
        assert torch.equal(cut(x), w(x)[:, :n])
    for n in (0, 71):
        with pytest.raises(DraftwiseError, match=f"got {n}"):
            w.rows(n)


def test_a_cut_draft_head_keeps_the_kernel(kernel, default_model_dir, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_F32_KERNEL", "1")
    from draftwise.backends.cuda.backend import TorchBackend
    from draftwise.backends.cuda.draft import early_exit

    be = TorchBackend.from_pretrained(
        str(default_model_dir), dtype="float32", device="cpu", max_cache_len=32
    )
    draft = early_exit(be.model, 4, 32, head=1000)
    assert isinstance(draft.head_q, F32Weight) and draft.head_q.shape == (1000, 576)
    x = torch.randn(2, 576)
    assert torch.equal(draft.logits(x), be.model.logits(x)[:, :1000])


def test_bad_input_is_refused(kernel):
    w = F32Weight.from_dense(torch.randn(16, 8))
    with pytest.raises(ValueError, match="float32"):
        w(torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(RuntimeError):
        w(torch.randn(2, 9))  # 18 values are not rows of 8
    with pytest.raises(DraftwiseError, match="2-D"):
        F32Weight.from_dense(torch.randn(4, 4, 4))


def test_the_choice_follows_the_cpu_and_the_override(kernel, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_F32_KERNEL", "0")
    assert native.f32_lib() is None
    assert not f32.available(torch.float32, torch.device("cpu"))
    monkeypatch.setenv("DRAFTWISE_F32_KERNEL", "1")
    assert native.f32_lib() is kernel
    assert f32.available(torch.float32, torch.device("cpu"))
    assert not f32.available(torch.bfloat16, torch.device("cpu"))
    monkeypatch.setenv("DRAFTWISE_F32_KERNEL", "auto")
    assert native.f32_lib() is kernel  # the default wherever the kernel exists
    monkeypatch.delenv("DRAFTWISE_F32_KERNEL")
    assert native.f32_lib() is kernel
    monkeypatch.setenv("DRAFTWISE_F32_KERNEL", "fast")
    with pytest.raises(DraftwiseError, match="DRAFTWISE_F32_KERNEL.*'fast'"):
        native.f32_lib()


def test_the_default_model_in_float32_verifies_rows_as_plain_steps(
    kernel, default_model_dir, monkeypatch
):
    """With the kernel forced on: every weight and the head are packed, and in the
    batch-invariant float32 mode (no padding rows now) a verified chain's rows give the
    same logits, bit for bit, as one-row steps along it."""
    monkeypatch.setenv("DRAFTWISE_F32_KERNEL", "1")
    from draftwise.backends.cuda.backend import TorchBackend
    from draftwise.core.tree import DraftTree

    be = TorchBackend.from_pretrained(
        str(default_model_dir), dtype="float32", device="cpu", max_cache_len=64, invariant=True
    )
    model = be.model
    assert model.native_f32 and "f32" in be.device_info().kernels
    assert isinstance(model.layers[0].w13, F32Weight) and isinstance(model.head_q, F32Weight)
    prompt = np.array([1, 504, 3458, 314, 253, 1345, 28], dtype=np.int64)
    chain = [282, 260, 3874, 29]
    be.prefill(prompt[:-1])
    tree = be.verify(int(prompt[-1]), DraftTree.chain(chain), True)
    be.reset()
    be.prefill(prompt[:-1])
    for i, tok in enumerate([int(prompt[-1]), *chain]):
        step = be.verify(tok, DraftTree.empty(), True)
        assert np.array_equal(step.logits[0], tree.logits[i]), i
        be.commit(np.array([0]))
