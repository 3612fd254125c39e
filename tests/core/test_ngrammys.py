"""The N-Grammys drafters: bigram table, context matcher, mixed drafts, batch acceptance."""

from __future__ import annotations

import numpy as np
import pytest

from draftwise.core.acceptance import accept_greedy
from draftwise.core.batch import accept_batch
from draftwise.core.decode import Decoder
from draftwise.drafting import make_drafter, parse_spec
from draftwise.core.drafters.base import NoDrafter
from draftwise.core.drafters.bigram_table import BigramTable, build_bigram_table, unigram_ranking
from draftwise.core.drafters.context_ngram import match_context
from draftwise.core.drafters.ngrammys import NGrammys
from draftwise.core.sampling import SamplingParams
from draftwise.core.tree import DraftTree
from draftwise.errors import DraftwiseError
from tests.fakes import FakeBackend, FakeBatchBackend

V = 24


def fake_table(be: FakeBackend, k: int = 6) -> BigramTable:
    """The fake model's exact top-k after each one-token sequence."""
    fn = lambda ids: np.stack([np.argsort(-be.logits_after([int(x)]), kind="stable")[:k] for x in ids])  # noqa: E731
    return build_bigram_table(fn, be.vocab_size, k, batch_size=5)


def test_table_equals_model_topk_and_chains():
    be = FakeBackend(vocab_size=V, seed=1)
    t = fake_table(be)
    for x in range(V):
        assert t.topk[x, 0] == be.logits_after([x]).argmax()
    d = t.drafts(3, k=4, w=3)
    assert d.shape == (4, 3) and d[:, 0].tolist() == t.topk[3, :4].tolist()
    assert all(d[i, j + 1] == t.topk[d[i, j], 0] for i in range(4) for j in range(2))


def test_table_round_trip_and_rejections(tmp_path):
    e = np.random.default_rng(0).standard_normal((V, 5)).astype(np.float32)
    t = build_bigram_table(lambda ids: np.stack([(ids + i) % V for i in range(3)], 1), V, 3,
                           unigram=unigram_ranking(e, e * 2))
    path = tmp_path / "bigram.npz"
    t.save(path, "tok-a")
    back = BigramTable.load(path, "tok-a")
    assert np.array_equal(back.topk, t.topk) and np.array_equal(back.unigram, t.unigram)
    assert sorted(back.unigram.tolist()) == list(range(V))
    with pytest.raises(DraftwiseError, match="tokenizer"):
        BigramTable.load(path, "tok-b")
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(DraftwiseError, match="corrupt"):
        BigramTable.load(path, "tok-a")
    with pytest.raises(DraftwiseError, match="ids must lie"):
        BigramTable(np.full((4, 2), 9), np.zeros(0))


def naive_match(ctx: list[int], q: int, w: int, k: int) -> list[list[int]]:
    count: dict[tuple[int, ...], int] = {}
    last: dict[tuple[int, ...], int] = {}
    query = ctx[-q:]
    for i in range(len(ctx) - q - w + 1):
        if ctx[i : i + q] == query:
            c = tuple(ctx[i + q : i + q + w])
            count[c] = count.get(c, 0) + 1
            last[c] = i
    ranked = sorted(count, key=lambda c: (-count[c], -last[c]))
    return [list(c) for c in ranked[:k]]


@pytest.mark.parametrize("q,w,k", [(1, 1, 3), (1, 3, 10), (2, 2, 5), (3, 4, 2)])
def test_context_matcher_equals_naive_scan(q, w, k):
    rng = np.random.default_rng(q * 100 + w)
    for _ in range(30):
        ctx = rng.integers(0, 4, int(rng.integers(1, 60)))
        assert match_context(ctx, q, w, k).tolist() == naive_match(ctx.tolist(), q, w, k)


def test_mixed_fills_from_context_then_bigram():
    be = FakeBackend(vocab_size=V, seed=2)
    d = NGrammys(table=fake_table(be), k=4, w=2)
    ctx = np.array([7, 1, 2, 7, 1, 2, 7])
    drafts = d.propose_batch(ctx, budget=16)
    assert drafts[0].tolist() == [1, 2] and d.last_from_context == 1
    assert drafts.shape == (4, 2) and len({tuple(r) for r in drafts.tolist()}) == 4


@pytest.mark.parametrize("k,w", [(1, 2), (3, 3), (6, 2)])
def test_batch_accepts_what_the_tree_accepts(k, w):
    rng = np.random.default_rng(k * 10 + w)
    for _ in range(200):
        drafts = rng.integers(0, 3, (k, w))
        chain = rng.integers(0, 3, w + 1)  # the model's greedy continuation
        argmax = np.empty((k, w + 1), np.int64)  # row i follows the chain while it matches
        for i in range(k):
            ok = np.cumprod(drafts[i] == chain[:w])
            argmax[i] = np.where(np.concatenate([[1], ok]), chain, rng.integers(0, 3, w + 1))
        tree = DraftTree.from_paths(drafts.tolist())
        tree_argmax = np.empty(len(tree) + 1, np.int64)
        tree_argmax[0] = chain[0]
        for n in range(len(tree)):
            path = tree.tokens[tree.path_to(n)]
            on_chain = np.array_equal(path, chain[: path.size])
            tree_argmax[n + 1] = chain[path.size] if on_chain else rng.integers(0, 3)
        tpath, tbonus = accept_greedy(tree, tree_argmax)
        row, n, bonus = accept_batch(drafts, argmax)
        assert n == len(tpath) and bonus == tbonus
        assert drafts[row, :n].tolist() == tree.tokens[tpath].tolist()


@pytest.mark.parametrize("verify", ["tree", "batch"])
def test_greedy_ngrammys_equals_plain(verify):
    be = FakeBatchBackend(vocab_size=V, seed=3, sharpness=6.0)
    prompt = np.random.default_rng(0).integers(0, V, 30)
    plain = [t for s in Decoder(be).steps(prompt, NoDrafter(), SamplingParams(), 80) for t in s.tokens]
    d = make_drafter("ngrammys", table=fake_table(be), k=5, w=3, verify=verify)
    be.forwards = 0
    steps = list(Decoder(be).steps(prompt, d, SamplingParams(), 80, budget=16))
    assert [t for s in steps for t in s.tokens] == plain
    assert be.forwards == len(steps) < 80  # one forward per step, and fewer steps


def test_specs_and_errors():
    part = parse_spec("ngrammys:k=5,w=4,verify=batch").parts[0]
    assert (part.name, part.options) == ("ngrammys", {"k": "5", "w": "4", "verify": "batch"})
    assert make_drafter("context-ngram:k=2,w=3+cacheback").name == "context-ngram+cacheback"
    with pytest.raises(DraftwiseError, match="needs the model-derived bigram table"):
        make_drafter("ngrammys")
    with pytest.raises(DraftwiseError, match="bad drafter option"):
        make_drafter("context-ngram:k")
    with pytest.raises(DraftwiseError, match="option w must be >= 1, got 0"):
        make_drafter("context-ngram:w=0")
    with pytest.raises(DraftwiseError, match="verify must be"):
        make_drafter("context-ngram:verify=rows")
    with pytest.raises(DraftwiseError, match="given both"):
        make_drafter("context-ngram:k=2", k=3)
