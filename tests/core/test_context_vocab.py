"""The context draft vocabulary: fixed ids first, then the context's other ids in order of
first appearance; a new context replaces the extra columns."""

from __future__ import annotations

import numpy as np

from draftwise.core.drafters.context_vocab import ContextVocab, extra_bias


def test_extra_ids_follow_first_appearance_and_the_context():
    cv = ContextVocab(np.array([4, 2, 6]), vocab_size=12)
    assert cv.ids.tolist() == [4, 2, 6]  # before any context: the fixed ids
    assert cv.update(np.array([9, 2, 11, 9, 0, 6])).tolist() == [4, 2, 6, 9, 11, 0]
    assert cv.columns(np.array([6, 9, 0, 5])).tolist() == [2, 3, 5, -1]
    # a growing context keeps the columns it had
    assert cv.update(np.array([9, 2, 11, 9, 0, 6, 5, 9])).tolist() == [4, 2, 6, 9, 11, 0, 5]
    # another context: the old extra ids lose their columns
    assert cv.update(np.array([7, 4])).tolist() == [4, 2, 6, 7]
    assert cv.columns(np.array([9, 11, 7, 4])).tolist() == [-1, -1, 3, 0]
    assert cv.update(np.array([2, 6])).tolist() == [4, 2, 6]


def test_random_contexts_against_a_naive_list():
    rng = np.random.default_rng(0)
    base = rng.choice(50, 20, replace=False)
    cv = ContextVocab(base, vocab_size=50)
    for _ in range(50):
        ctx = rng.integers(0, 50, rng.integers(1, 40))
        want = base.tolist()
        for t in ctx.tolist():
            if t not in want:
                want.append(t)
        assert cv.update(ctx).tolist() == want
        assert cv.columns(np.arange(50)).tolist() == [
            want.index(i) if i in want else -1 for i in range(50)
        ]


def test_extra_bias_is_a_quantile_of_the_trained_biases():
    assert extra_bias(np.array([3.0, -1.0, 0.0, 1.0, 2.0]), 0.0) == -1.0
    assert extra_bias(np.array([3.0, -1.0, 0.0, 1.0, 2.0]), 0.5) == 1.0


def test_incremental_updates_equal_a_fresh_vocabulary():
    """Contexts that grow, roll back and restart: each update's ids and columns equal
    those of a vocabulary built from that context alone."""
    import numpy as np

    from draftwise.core.drafters.context_vocab import ContextVocab

    rng = np.random.default_rng(0)
    base = np.arange(10, 20)
    cv = ContextVocab(base, vocab_size=40)
    ctx = rng.integers(0, 40, 5)
    for _ in range(200):
        move = rng.integers(0, 4)
        if move == 0:  # a rollback (rejected drafts, a new turn's shorter prefix)
            ctx = ctx[: rng.integers(1, ctx.size + 1)]
        elif move == 1:  # a new text
            ctx = rng.integers(0, 40, rng.integers(1, 8))
        else:  # accepted tokens
            ctx = np.concatenate([ctx, rng.integers(0, 40, rng.integers(0, 4))])
        fresh = ContextVocab(base, vocab_size=40)
        assert cv.update(ctx).tolist() == fresh.update(ctx).tolist()
        ids = np.arange(40)
        assert cv.columns(ids).tolist() == fresh.columns(ids).tolist()
