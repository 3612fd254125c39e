"""MLX batch-invariant mode: a row's logits are bit-identical whatever else is verified.

A plain decoding step and the same row inside a draft tree (random siblings before and
after it = masked keys between its visible ones; 4..32 rows) must give ``np.array_equal``
logits on a tiny random llama (float16, 4-bit) at contexts with no shared attention
block, a tail crossing one, and several; and on the real default model. End to end,
``cacheback`` greedy output must equal plain greedy output in float16 and 4-bit.

On the Linux CPU (mlx 0.32.4) the normal mode measured invariant too, so these checks
pass without the mode there; ``test_check_catches_a_non_invariant_attention`` shows they
fail for an attention whose reduction order follows the physical key layout (as fused
kernels' do) and that the mode, which does not use SDPA, is immune to it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

import mlx.nn as nn  # noqa: E402

from draftwise.backends.mlx import MLXBackend  # noqa: E402
from draftwise.backends.mlx.invariant import resolve_invariant  # noqa: E402
from draftwise.backends.mlx.load import _quantizable  # noqa: E402
from draftwise.core.tree import DraftTree  # noqa: E402
from draftwise.errors import DraftwiseError  # noqa: E402
from tests.backends.mlx.test_mlx_backend import TINY, V, ref_last, tiny_backend  # noqa: E402
from tests.invariance import plain_logits, tree_with_path  # noqa: E402

pytestmark = pytest.mark.mlx

CACHE = 1024


def tiny(dtype: str, invariant: bool, pad_rows: int | None = None) -> MLXBackend:
    """The tiny random llama of test_mlx_backend in ``dtype`` (4bit: group-64 quantized,
    float32 activations as ``load.py`` makes them on a CPU)."""
    module = tiny_backend("llama").model.module
    if dtype == "4bit":
        nn.quantize(module, group_size=64, bits=4, class_predicate=_quantizable)
    else:
        module.set_dtype(getattr(mx, dtype))
    mx.eval(module.parameters())
    cfg = {**TINY, "model_type": "llama", "max_position_embeddings": CACHE}
    be = MLXBackend(module, cfg, dtype, CACHE, invariant=invariant)
    if pad_rows is not None:
        be._pad_rows = pad_rows  # the GPU schedule (fixed-size padded chunks), on the CPU
    return be


def mismatches(be: MLXBackend, ctx_len: int, others: tuple[int, ...], vocab: int) -> list[str]:
    """Every way a path row differs from its plain step, inside trees of ``3 + 1 + n``
    rows for n in ``others``, and in the plain step after committing the path."""
    rng = np.random.default_rng(ctx_len)
    ctx = rng.integers(0, vocab, ctx_len)
    path = [int(t) for t in rng.integers(0, vocab, 3)]
    be.reset()
    be.prefill(ctx[:-1])
    want = plain_logits(be, ctx, path)
    bad = []
    for n_other in others:
        tree, rows = tree_with_path(rng, path, n_other, vocab)
        out = be.verify(int(ctx[-1]), tree, need_logits=True)
        assert out.logits is not None
        bad += [
            f"row {j} in {len(tree) + 1} rows"
            for j, r in enumerate(rows)
            if not np.array_equal(out.logits[r], want[j])
        ]
        # Commit the path: the next plain step must still match (K/V written identically).
        be.commit(np.array(rows))
        nxt = be.verify(7, DraftTree.empty(), need_logits=True)
        be.trim(len(ctx) - 1)
        assert nxt.logits is not None
        if not np.array_equal(nxt.logits[0], plain_logits(be, ctx, [*path, 7])[-1]):
            bad.append(f"plain step after committing from {len(tree) + 1} rows")
    return bad


@pytest.mark.parametrize("dtype", ["float16", "4bit"])
# no shared block / the tail crosses one / several shared blocks (> 64, > 256 keys)
@pytest.mark.parametrize("ctx_len", [20, 62, 130, 300])
@pytest.mark.parametrize("pad_rows", [None, 8], ids=["cpu", "padded"])
def test_row_logits_do_not_depend_on_the_batch(dtype, ctx_len, pad_rows):
    be = tiny(dtype, invariant=True, pad_rows=pad_rows)
    assert mismatches(be, ctx_len, (0, 1, 5, 12, 28), V) == []  # 4, 5, 9, 16, 32 rows


@pytest.mark.parametrize("variant", ["llama", "qwen2", "llama3", "tied"])
def test_invariant_rows_equal_the_module_forward(variant):
    """Block attention is still attention: float32 rows match mlx-lm's own forward."""
    base = tiny_backend(variant)
    be = MLXBackend(base.model.module, {**TINY, "model_type": "llama"}, "float32", 256, True)
    tree = DraftTree.from_paths([[5, 6, 7], [5, 8], [9, 10], [11]])
    ctx = [int(t) for t in np.random.default_rng(1).integers(0, V, 70)]  # > one block
    be.prefill(np.array(ctx[:-1]))
    out = be.verify(ctx[-1], tree, need_logits=True)
    assert out.logits is not None
    np.testing.assert_allclose(out.logits[0], ref_last(be, ctx), atol=1e-4)
    for node in range(len(tree)):
        path = ctx + tree.tokens[tree.path_to(node)].tolist()
        np.testing.assert_allclose(out.logits[node + 1], ref_last(be, path), atol=1e-4)
    np.testing.assert_array_equal(out.argmax, out.logits.argmax(axis=1))


def _pairwise_sdpa(q, k, v, scale, mask=None):  # type: ignore[no-untyped-def]
    """Attention whose exp-sum is a pairwise tree over the physical key positions, in the
    input dtype (as a GPU or fused kernel reduces): moving a key by one slot, as masked
    siblings do, changes the rounding."""
    rep = q.shape[1] // k.shape[1]
    k, v = mx.repeat(k, rep, axis=1), mx.repeat(v, rep, axis=1)  # (1, H, S, D)
    s = (q * scale) @ k.swapaxes(-1, -2)  # (1, H, T, S)
    t, n = s.shape[-2], s.shape[-1]
    if isinstance(mask, str):  # "causal", bottom-right aligned
        mask = mx.arange(n)[None] <= (n - t + mx.arange(t))[:, None]
    if mask is not None:
        s = mx.where(mask, s, -mx.inf)
    p = mx.exp(s - s.max(-1, keepdims=True))  # (1, H, T, S)
    den = p
    while den.shape[-1] > 1:
        if den.shape[-1] % 2:
            den = mx.concatenate([den, mx.zeros_like(den[..., :1])], axis=-1)
        den = den.reshape(*den.shape[:-1], -1, 2).sum(-1)
    return (p @ v) / den  # (1, H, T, D)


@pytest.mark.parametrize("invariant", [False, True])
def test_check_catches_a_non_invariant_attention(monkeypatch, invariant):
    """The check can fail: with a position-dependent attention reduction the normal mode
    differs from plain decoding; the invariant mode never calls SDPA and stays exact."""
    monkeypatch.setattr(mx.fast, "scaled_dot_product_attention", _pairwise_sdpa)
    bad = mismatches(tiny("float16", invariant), 70, (5, 12), V)
    assert (bad == []) == invariant, bad


def test_resolve_invariant_and_name():
    assert resolve_invariant(True, False, "float16") is True
    assert resolve_invariant(False, True, "4bit") is False
    assert resolve_invariant("auto", False, "float16") is True  # measured free on a CPU
    assert resolve_invariant("auto", False, "4bit") is False  # measured +10%
    assert resolve_invariant("auto", True, "float16") is False  # GPU: not measured
    with pytest.raises(DraftwiseError, match="invariant"):
        resolve_invariant("yes", False, "float16")
    assert tiny("float16", True).name.endswith("-float16-invariant")
    assert tiny("4bit", False).name.endswith("-4bit")


# ----- the real default model ------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float16", "4bit"])
def test_default_model_row_invariance(default_model_dir: Path, dtype: str) -> None:
    be = MLXBackend.from_pretrained(
        default_model_dir, dtype=dtype, max_cache_len=512, invariant=True
    )
    assert mismatches(be, 90, (20,), be.vocab_size) == []  # 24 rows, tail crosses a block


PROMPTS = [
    "Repeat this sentence three times: the quick brown fox jumps over the lazy dog.",
    "List the planets of the solar system in order, with one fact about each planet.",
]


@pytest.mark.parametrize("dtype", ["float16", "4bit"])
def test_cacheback_equals_plain(default_model_dir: Path, dtype: str) -> None:
    import draftwise
    from draftwise.api import Model
    from draftwise.models.tokenizer import Tokenizer

    be = MLXBackend.from_pretrained(default_model_dir, dtype=dtype, invariant=True)
    model = Model(be, Tokenizer.from_dir(default_model_dir), default_model_dir)
    drafted = 0
    for prompt in PROMPTS:
        outs = {}
        for drafter in ("none", "cacheback"):
            if drafter != "none":
                model.drafter(drafter).reset()
            ids: list[int] = []
            for r in draftwise.stream_generate(
                model, prompt, drafter=drafter, max_tokens=16, budget=8
            ):
                ids += r.tokens
                drafted += r.from_draft
            outs[drafter] = ids
        assert outs["cacheback"] == outs["none"], prompt
    assert drafted > 0  # the speculative runs did accept drafts
