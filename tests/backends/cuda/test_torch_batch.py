"""TorchBackend's N-Grammys paths on a tiny random llama, and the bigram table on the
default model: one-token top-k, the (k, w + 1) verification batch, the commit of a row."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from draftwise.backends.cuda import TorchBackend  # noqa: E402
from draftwise.core.acceptance import accept_greedy  # noqa: E402
from draftwise.core.batch import accept_batch  # noqa: E402
from draftwise.core.decode import Decoder  # noqa: E402
from draftwise.drafting import make_drafter  # noqa: E402
from draftwise.core.drafters.base import NoDrafter  # noqa: E402
from draftwise.core.drafters.bigram_table import build_bigram_table  # noqa: E402
from draftwise.core.sampling import SamplingParams  # noqa: E402
from draftwise.core.tree import DraftTree  # noqa: E402
from tests.backends.cuda.test_torch_backend import ATOL, V, _save_tiny, _step  # noqa: E402


@pytest.fixture(params=["llama", "qwen2", "gemma2"])
def be(request, tmp_path):
    path, _ = _save_tiny(tmp_path / request.param, request.param)
    return TorchBackend.from_pretrained(path, device="cpu")


def test_next_topk_equals_a_one_token_forward(be):
    ids = np.arange(0, V, 7)
    got = be.next_topk(ids, 5)
    for x, row in zip(ids, got, strict=True):
        be.reset()
        logits = _step(be, x)
        assert row.tolist() == np.argsort(-logits, kind="stable")[:5].tolist()


def test_batch_rows_match_tree_rows_and_commit(be):
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, V, 20)
    for k, w in [(1, 2), (4, 3), (3, 1)]:
        drafts = rng.integers(0, V, (k, w))
        be.reset(); be.prefill(prompt[:-1])
        am = be.verify_batch(int(prompt[-1]), drafts)  # (k, w + 1)
        for i in range(k):  # each row equals the same chain verified as a tree
            be.trim(19)
            out = be.verify(int(prompt[-1]), DraftTree.chain(drafts[i].tolist()), need_logits=False)
            assert out.argmax.tolist() == am[i].tolist()
    # commit a row: the next step's logits equal sequential decoding of that row
    drafts = rng.integers(0, V, (3, 3))
    be.reset(); be.prefill(prompt[:-1])
    be.verify_batch(int(prompt[-1]), drafts)
    be.commit_batch(2, 3)
    assert be.cache_len == 22
    after = _step(be, drafts[2, 2])
    be.reset(); be.prefill(prompt[:-1])
    for t in [prompt[-1], *drafts[2, :2]]:
        _step(be, t)
    np.testing.assert_allclose(after, _step(be, drafts[2, 2]), atol=ATOL)


def test_batch_accepts_what_the_tree_accepts(be):
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, V, 12)
    be.reset(); be.prefill(prompt[:-1])
    chain = [int(be.verify(int(prompt[-1]), DraftTree.empty(), False).argmax[0])]
    be.commit(np.array([0]))
    for _ in range(3):
        chain.append(int(_step(be, chain[-1]).argmax()))
    for _ in range(10):  # drafts that follow the greedy chain for a random length
        drafts = rng.integers(0, V, (4, 3))
        for i in range(4):
            m = int(rng.integers(0, 4))
            drafts[i, :m] = chain[:m]
        be.reset(); be.prefill(prompt[:-1])
        row, n, bonus = accept_batch(drafts, be.verify_batch(int(prompt[-1]), drafts))
        tree = DraftTree.from_paths(drafts.tolist())
        path, tbonus = accept_greedy(tree, be.verify(int(prompt[-1]), tree, False).argmax)
        assert (n, bonus) == (len(path), tbonus)
        assert drafts[row, :n].tolist() == tree.tokens[path].tolist()


@pytest.mark.parametrize("verify", ["tree", "batch"])
def test_greedy_ngrammys_equals_plain(be, verify):
    table = build_bigram_table(lambda ids: be.next_topk(ids, 4), V, 4)
    prompt = np.random.default_rng(2).integers(0, V, 16)
    dec = Decoder(be)
    plain = [t for s in dec.steps(prompt, NoDrafter(), SamplingParams(), 40) for t in s.tokens]
    d = make_drafter("ngrammys", table=table, k=4, w=3, verify=verify)
    spec = [t for s in dec.steps(prompt, d, SamplingParams(), 40) for t in s.tokens]
    assert spec == plain


@pytest.mark.slow
def test_default_model_table_equals_its_own_topk(torch_model):
    """The table builder's rows for 50 sampled tokens against the model's own logits after
    each token alone (plain verify). Only the sampled tokens are run through the model."""
    be = torch_model.backend
    ids = np.random.default_rng(0).choice(be.vocab_size, 50, replace=False)

    def sampled_topk(rows: np.ndarray) -> np.ndarray:
        out = np.zeros((rows.size, 10), np.int64)
        hit = np.isin(rows, ids)
        if hit.any():
            out[hit] = be.next_topk(rows[hit], 10)
        return out

    table = build_bigram_table(sampled_topk, be.vocab_size, 10, batch_size=4096)
    for x in ids:
        row = table.topk[x]
        be.reset()
        out = be.verify(int(x), DraftTree.empty(), need_logits=True)
        be.commit(np.array([0]))
        assert row[0] == out.argmax[0]
        assert row.tolist() == np.argsort(-out.logits[0], kind="stable")[:10].tolist()
    torch_model.decoder.reset()  # the backend was driven directly: tell the decoder
