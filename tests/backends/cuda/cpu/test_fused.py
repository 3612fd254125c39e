"""The 4bit mode's fused forward (``fused.py``, ``csrc/forward.c``): it is what a native
4bit model verifies with, it computes the same model as the torch forward (to bfloat16
rounding), and a row's bits do not depend on the thread count. Row invariance against the
batch is checked by ``test_invariant.py``'s 4bit cases, which run this path; a prompt goes
through it too, so its K/V has the bits of plain steps."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from draftwise.backends.cuda import TorchBackend  # noqa: E402
from draftwise.backends.cuda.cpu import native  # noqa: E402
from draftwise.backends.cuda.cpu.fused import FusedForward  # noqa: E402
from draftwise.core.tree import DraftTree  # noqa: E402
from tests.backends.cuda.test_torch_backend import _save_tiny  # noqa: E402

pytestmark = pytest.mark.skipif(
    native.int4_lib() is None, reason="no compiled int4 kernel (C compiler, AVX-512 VNNI or AVX2 and FMA)"
)


def _backend(model_dir, fused: bool) -> TorchBackend:
    be = TorchBackend.from_pretrained(model_dir, dtype="4bit", device="cpu", max_cache_len=512)
    assert be.model.fused is not None
    assert be.model.cache.dtype == torch.bfloat16  # the 4bit mode's cache (half the bytes)
    if not fused:
        be.model.fused = None  # the torch ops, same weights and kernels
    return be


def _verify(be: TorchBackend, ctx: np.ndarray, tree: DraftTree) -> np.ndarray:
    be.prefill(ctx[:-1])
    out = be.verify(int(ctx[-1]), tree, need_logits=True)
    assert out.logits is not None
    return out.logits


def test_fused_equals_the_torch_forward_on_the_default_model(default_model_dir):
    from draftwise.models.tokenizer import Tokenizer

    text = ("The quick brown fox jumps over the lazy dog. Speculative decoding drafts a few "
            "tokens and the model checks them all in one forward pass, so the output is "
            "exactly what the model alone would have written, only sooner.")
    ids = np.asarray(Tokenizer.from_dir(default_model_dir).encode(text), np.int64)
    ctx, chain = ids[:-24], ids[-24:-1]
    tree = DraftTree.chain(chain.tolist())
    got = _verify(_backend(default_model_dir, True), ctx, tree)  # (24, V)
    want = _verify(_backend(default_model_dir, False), ctx, tree)
    # float32 residual and fewer bf16 roundings than the torch ops (each rounding can move
    # an activation across an int8 step of the next matmul): close, not equal
    scale = np.abs(want).max()
    assert np.abs(got - want).max() < 0.05 * scale
    # the typical logit moves far less than the largest (measured 0.006 of the scale)
    assert np.abs(got - want).mean() < 0.015 * scale
    # and the next token agrees on most rows of real text (measured 22 / 24; on random
    # tokens, whose logits are near ties, 8 / 12)
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.8


def test_fused_rows_do_not_depend_on_the_thread_count(tmp_path):
    model_dir, _ = _save_tiny(tmp_path / "m", "llama")
    rng = np.random.default_rng(3)
    ctx = rng.integers(0, 97, 40)
    tree = DraftTree.chain(rng.integers(0, 97, 9).tolist())
    old = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(_verify(_backend(model_dir, True), ctx, tree))
    finally:
        torch.set_num_threads(old)
    assert np.array_equal(outs[0], outs[1])


def test_not_built_without_the_native_kernel(tmp_path, monkeypatch):
    model_dir, _ = _save_tiny(tmp_path / "m", "llama")
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_tried", True)  # as where no compiler is found
    be = TorchBackend.from_pretrained(model_dir, dtype="4bit", device="cpu", max_cache_len=64)
    assert be.model.fused is None and FusedForward.build(be.model) is None


def test_the_cost_profile_key_names_the_kernels(tmp_path, monkeypatch):
    """A cost profile measured with other kernels (an older build, or without the fused
    forward) must not size the trees of this one: the device key names the build."""
    model_dir, _ = _save_tiny(tmp_path / "m", "llama")
    be = TorchBackend.from_pretrained(model_dir, dtype="4bit", device="cpu", max_cache_len=64)
    key = be.device_info().key()
    assert "native-" in key and key.endswith("+fused")
    be.model.fused = None
    assert be.device_info().key() != key
    monkeypatch.setattr(native, "_lib", None)
    monkeypatch.setattr(native, "_tried", True)
    plain = TorchBackend.from_pretrained(model_dir, dtype="4bit", device="cpu", max_cache_len=64)
    assert plain.device_info().key() == "cpu|" + key.split("|", 1)[1].rsplit("|", 1)[0]


def _eager(be: TorchBackend) -> TorchBackend:
    """``be`` verifying through ``fused_eager.eager_forward`` instead of the C forward."""
    from draftwise.backends.cuda.cpu.fused_eager import eager_forward

    fused = be.model.fused

    class Eager:
        def __call__(self, *args):
            return eager_forward(fused, *args)

    be.model.fused = Eager()
    return be


def _model_dir(tmp_path, default_model_dir, tiny: bool):
    """(model directory, vocabulary size): a tiny random llama, or the default model."""
    if tiny:
        return _save_tiny(tmp_path / "m", "llama")[0], 97
    return default_model_dir, 49152


@pytest.mark.parametrize("tiny", [True, False], ids=["tiny", "default-model"])
def test_compiled_and_eager_forwards_agree_bit_for_bit(tmp_path, default_model_dir, tiny):
    """The fused C forward and its op-by-op torch replay give the same logits, hidden
    states and K/V cache bits: over a tree verify, its commit, and the next plain step."""
    model_dir, vocab = _model_dir(tmp_path, default_model_dir, tiny)
    rng = np.random.default_rng(5)
    ctx = rng.integers(0, vocab, 70)
    tree = DraftTree(rng.integers(0, vocab, 9), np.array([-1, 0, 0, 1, 1, 2, -1, 6, 7]))
    if tiny:  # 40 rows: two verify chunks, the second attending to the first's slots
        parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, 39)]
        tree = DraftTree(rng.integers(0, vocab, 39), np.array(parents))
    runs = []
    for be in (_backend(model_dir, True), _eager(_backend(model_dir, True))):
        be.prefill(ctx[:-1])
        first = be.verify(int(ctx[-1]), tree, need_logits=True)
        x = be.model.last_x.clone()
        path = [0, 1]  # the root row and the first draft, then its first child if any
        kids = np.flatnonzero(tree.parents == 0)
        if kids.size:
            path.append(int(kids[0]) + 1)
        be.commit(np.array(path))
        second = be.verify(int(tree.tokens[path[-1] - 1]), DraftTree.empty(), need_logits=True)
        runs.append((first.logits, x, second.logits, be.model.cache[:, :, :, :80].clone()))
    for a, b in zip(*runs):
        a, b = (torch.as_tensor(v) for v in (a, b))
        assert torch.equal(a, b)


@pytest.mark.parametrize("tiny", [True, False], ids=["tiny", "default-model"])
def test_the_numpy_step_gives_the_bits_of_the_plan_path(tmp_path, default_model_dir, tiny):
    """A verify of up to MAX_ROWS rows goes through ``FusedForward.step`` (numpy tables,
    no torch glue); with it taken away the same verifies take ``make_plan`` and
    ``__call__``: the same logits, hidden rows and cache bits over a tree verify, its
    commit (the kept slots gathered down) and the next plain step."""
    from draftwise.backends.cuda.invariant import MAX_ROWS

    model_dir, vocab = _model_dir(tmp_path, default_model_dir, tiny)
    rng = np.random.default_rng(11)
    ctx = rng.integers(0, vocab, 60)
    parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, MAX_ROWS - 1)]  # 32 rows
    tree = DraftTree(rng.integers(0, vocab, MAX_ROWS - 1), np.array(parents))
    runs, calls = [], []
    for numpy_step in (True, False):
        be = _backend(model_dir, True)
        fused = be.model.fused
        if not numpy_step:
            fused.step = None  # the plan path: make_plan, then FusedForward.__call__
        seen = []
        real_call = fused.__call__
        fused.__class__ = type("Counted", (FusedForward,), {
            "__call__": lambda self, *a, seen=seen, call=real_call: seen.append(1) or call(*a)})
        be.prefill(ctx[:-1])
        seen.clear()  # (the prompt goes through __call__ either way)
        first = be.verify(int(ctx[-1]), tree, need_logits=True)
        x = be.model.last_x.clone()
        deep = int(np.argmax(tree.depth))
        path = [0] + [p + 1 for p in tree.path_to(deep)]  # the deepest node's path
        be.commit(np.array(path))
        second = be.verify(int(tree.tokens[deep]), DraftTree.empty(), need_logits=True)
        calls.append(len(seen))
        runs.append((first.logits, x, second.logits, be.model.last_x.clone(),
                     be.model.cache[:, :, :, :100].clone()))
    assert calls == [0, 2]  # the numpy step took both verifies, the plan path both
    for a, b in zip(*runs, strict=True):
        a, b = (torch.as_tensor(v) for v in (a, b))
        assert torch.equal(a, b)


@pytest.mark.parametrize("tiny", [True, False], ids=["tiny", "default-model"])
def test_a_prefilled_prompt_has_the_bits_of_plain_steps(tmp_path, default_model_dir, tiny, monkeypatch):
    """The prompt goes through the verify's own forward: its K/V, and the logits after it,
    equal those of the same tokens fed one plain step at a time (chunks of 16 rows here,
    so a chunk attends to the slots of the chunks before it)."""
    from draftwise.backends.cuda import backend as backend_mod

    monkeypatch.setattr(backend_mod, "PREFILL_CHUNK", 16)
    if tiny:
        model_dir, vocab = _save_tiny(tmp_path / "m", "llama")[0], 97
    else:
        model_dir, vocab = default_model_dir, 49152
    ctx = np.random.default_rng(11).integers(0, vocab, 60)
    be = _backend(model_dir, True)
    assert be._fused_prefill()
    be.prefill(ctx[:-1])
    cache = be.model.cache[:, :, :, :59].clone()
    whole = be.verify(int(ctx[-1]), DraftTree.empty(), need_logits=True).logits
    be.reset()
    be.prefill(ctx[:37])  # two full chunks and a part
    for tok in ctx[37:-1]:
        be.verify(int(tok), DraftTree.empty(), need_logits=False)
        be.commit(np.array([0]))
    assert torch.equal(be.model.cache[:, :, :, :59], cache)
    steps = be.verify(int(ctx[-1]), DraftTree.empty(), need_logits=True).logits
    assert np.array_equal(whole, steps)


@pytest.mark.parametrize("chunk", [16, 48])
def test_a_prompt_chunk_split_between_threads_has_the_same_bits(default_model_dir, chunk, monkeypatch):
    """A prompt chunk's per-row work (norms, RoPE and cache writes, SiLU, residual adds,
    the activations' quantisation: from 16 rows) and its attention (runs of rows a task:
    from 32) are split between two threads; with the splits off, the same K/V and logits
    bit for bit."""
    from draftwise.backends.cuda import backend as backend_mod

    lib = native.int4_lib()
    monkeypatch.setattr(backend_mod, "PREFILL_CHUNK", chunk)
    ctx = np.random.default_rng(7).integers(0, 49152, 100)  # (head size 64: the AVX-512 path)
    old = torch.get_num_threads()
    runs = []
    try:
        torch.set_num_threads(2)
        for split in (True, False):
            lib.dw_forward_split_rows(16 if split else 0)
            lib.dw_int4_split_rows(16 if split else 0)
            lib.dw_attention_runs(int(split))
            be = _backend(default_model_dir, True)
            be.prefill(ctx[:-1])
            logits = be.verify(int(ctx[-1]), DraftTree.empty(), need_logits=True).logits
            runs.append((be.model.cache[:, :, :, :99].clone(), torch.as_tensor(logits)))
    finally:
        torch.set_num_threads(old)
        lib.dw_forward_split_rows(16)
        lib.dw_int4_split_rows(16)
        lib.dw_attention_runs(1)
    assert torch.equal(runs[0][0], runs[1][0])
    assert torch.equal(runs[0][1], runs[1][1])


def test_torch_prefill_without_the_fused_forward(tmp_path):
    """Where the fused forward does not apply, the prompt takes torch's ops (and the
    backend says so)."""
    model_dir, _ = _save_tiny(tmp_path / "m", "llama")
    be = _backend(model_dir, False)
    assert not be._fused_prefill()
    be.prefill(np.arange(30) % 97)
    assert be.cache_len == 30


def test_kept_rows_of_chain_prefixes_survive_later_steps(tmp_path):
    """A commit that keeps a chain prefix of a small step records a slice of the step's
    own rows, not a copy (``TorchBackend.commit``): later verifies must not change it,
    and the rows equal those of a backend that copies every kept row."""
    model_dir, _ = _save_tiny(tmp_path / "m", "llama")
    rng = np.random.default_rng(5)
    ctx = rng.integers(0, 97, 12)
    steps = [([3, 4], [0, 1]), ([5], [0]), ([6, 7, 8], [0, 1, 2, 3]), ([9, 10], [0, 2])]
    got = []
    for slices in (True, False):
        be = _backend(model_dir, True)
        be.keep_hidden_rows()
        be.prefill(ctx[:-1])
        root = int(ctx[-1])
        for chain, keep in steps:
            tree = DraftTree.chain(chain) if keep != [0, 2] else DraftTree(
                np.array(chain), np.array([-1, -1]))  # two children of the root: a gather
            be.verify(root, tree, need_logits=False)
            if not slices:
                be._rows_fresh = False  # the copying path
            be.commit(np.array(keep))
            root = 11
        first, rows = be.residual_rows(0)
        assert first == 0
        got.append(torch.cat(rows).float().numpy())  # (T, C)
    assert got[0].shape[0] == ctx.size - 1 + 2 + 1 + 4 + 2
    np.testing.assert_array_equal(got[0], got[1])
