"""The target's hidden state a drafter reads after ``prefill``/``commit`` equals the
last-layer hidden state (after the final norm) of a plain transformers forward."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from draftwise.backends.cuda import TorchBackend  # noqa: E402
from draftwise.core.tree import DraftTree  # noqa: E402
from draftwise.errors import DraftwiseError  # noqa: E402
from tests.backends.cuda.test_torch_backend import V, _save_tiny  # noqa: E402


def _ref_hidden(model, ids) -> np.ndarray:
    """(T, C) transformers' last hidden state (after the final norm), no cache."""
    with torch.no_grad():
        out = model(torch.tensor([list(ids)]), output_hidden_states=True)
    return out.hidden_states[-1][0].numpy()


@pytest.mark.parametrize("invariant", [False, True])
def test_hidden_of_accepted_row_equals_plain_forward(tmp_path, invariant):
    model_dir, ref = _save_tiny(tmp_path / "m", "llama")
    rng = np.random.default_rng(0)
    ctx = rng.integers(0, V, 9)
    be = TorchBackend.from_pretrained(model_dir, device="cpu", invariant=invariant)
    be.prefill(ctx[:-1])
    assert be.hidden_len == be.cache_len == 8
    want = _ref_hidden(ref, ctx[:-1])
    np.testing.assert_allclose(be.last_hidden().numpy(), want[-1], atol=1e-4)

    # a tree with two branches; keep the root and the second branch (rows 0, 2, 4)
    tree = DraftTree(np.array([5, 6, 7, 8]), np.array([-1, -1, 0, 1]))
    be.verify(int(ctx[-1]), tree, need_logits=False)
    be.commit(np.array([0, 2, 4]))
    seq = [*ctx.tolist(), 6, 8]
    assert be.hidden_len == be.cache_len == len(seq)
    np.testing.assert_allclose(be.last_hidden().numpy(), _ref_hidden(ref, seq)[-1], atol=1e-4)

    be.trim(5)  # another length: nothing held for it
    with pytest.raises(DraftwiseError, match="no hidden state for cache length 5"):
        be.last_hidden()


@pytest.mark.parametrize("invariant", [False, True])
def test_hidden_rows_of_every_cached_position_equal_plain_forward(tmp_path, invariant):
    """``hidden_rows`` (a context drafter's input): the kept rows of the prompt and of
    every accepted row, in cache order, after a branch commit, a trim and a reset."""
    model_dir, ref = _save_tiny(tmp_path / "m", "llama")
    rng = np.random.default_rng(1)
    ctx = rng.integers(0, V, 9)
    be = TorchBackend.from_pretrained(model_dir, device="cpu", invariant=invariant)
    assert be.hidden_rows(0) is None  # not kept until a drafter asks
    be.keep_hidden_rows()
    be.prefill(ctx[:-1])
    tree = DraftTree(np.array([5, 6, 7, 8]), np.array([-1, -1, 0, 1]))
    be.verify(int(ctx[-1]), tree, need_logits=False)
    be.commit(np.array([0, 2, 4]))
    seq = [*ctx.tolist(), 6, 8]
    first, rows = be.hidden_rows(0)
    assert first == 0 and rows.shape == (len(seq), ref.config.hidden_size)
    np.testing.assert_allclose(rows.numpy(), _ref_hidden(ref, seq), atol=1e-4)
    first, rows = be.hidden_rows(7)  # only the newest
    assert first == 7
    np.testing.assert_allclose(rows.numpy(), _ref_hidden(ref, seq)[7:], atol=1e-4)
    be.trim(5)
    assert be.hidden_rows(0)[0] == 0 and be.hidden_rows(0)[1].shape[0] == 5
    assert be.hidden_rows(5) == (5, None)
    be.reset()
    assert be.hidden_rows(0) == (0, None)


def test_keeping_rows_empties_a_cache_that_has_none(tmp_path):
    """A drafter that asks for rows after positions were cached without them (a plain
    generation first): the cache is emptied, so the next prefill brings every row; once
    rows are kept, asking again changes nothing."""
    model_dir, _ = _save_tiny(tmp_path / "m", "llama")
    be = TorchBackend.from_pretrained(model_dir, device="cpu", invariant=False)
    be.prefill(np.arange(6))
    be.keep_hidden_rows()
    assert be.cache_len == 0 and be.hidden_rows(0) == (0, None)
    be.prefill(np.arange(6))
    be.keep_hidden_rows()
    assert be.cache_len == 6 and be.hidden_rows(0)[1].shape[0] == 6
