"""ContextBook: the fast path of a context that extends the last one gives the same
vocabulary, entries and columns as the general path, on random histories."""

from __future__ import annotations

import numpy as np
import pytest

from draftwise.core.drafters.context_book import ContextBook
from draftwise.core.drafters.context_entries import ContextEntries
from draftwise.core.drafters.context_vocab import ContextVocab


def _rows(rng: np.random.Generator, log: list[int]):
    """A backend's ``hidden_rows`` that sometimes holds fewer rows (a gap) or none."""

    def rows(start: int) -> tuple[int, object | None] | None:
        log.append(start)
        roll = int(rng.integers(0, 8))
        if roll == 0:
            return None
        return start + (1 if roll == 1 else 0), "rows"

    return rows


@pytest.mark.parametrize("extend", [True, False])
@pytest.mark.parametrize("entries", [True, False])
def test_equals_the_general_path_on_random_histories(extend: bool, entries: bool) -> None:
    rng = np.random.default_rng(1)
    base = rng.choice(30, 8, replace=False)
    for _ in range(60):
        book = ContextBook(base, 30, extend=extend, entries=entries)
        ref_vocab, ref_book = ContextVocab(base, 30), ContextEntries()
        ctx = rng.integers(0, 30, int(rng.integers(1, 6)))
        fast = 0
        for _ in range(25):
            seed = int(rng.integers(0, 2**31))
            got = book.update(ctx.copy(), _rows(np.random.default_rng(seed), []))
            ids = ref_vocab.update(ctx) if extend else ref_vocab.ids
            assert book.vocab_ids.tolist() == ids.tolist()
            if entries:
                want = ref_book.update(ctx, _rows(np.random.default_rng(seed), []))
                assert got == want
                assert book.pos.tolist() == ref_book.pos.tolist()
                assert book.cols.tolist() == ref_vocab.columns(ctx[ref_book.pos + 1]).tolist()
                assert 0 <= book.fresh <= book.pos.size
                fast += book.fresh > 0
            roll = int(rng.integers(0, 6))
            if roll == 0:  # a rollback and other tokens
                cut = int(rng.integers(1, ctx.size + 1))
                ctx = np.concatenate([ctx[:cut], rng.integers(0, 30, int(rng.integers(1, 4)))])
            elif roll == 1:  # a new text
                ctx = rng.integers(0, 30, int(rng.integers(1, 8)))
            else:  # accepted tokens and a new root: the fast path
                ctx = np.concatenate([ctx, rng.integers(0, 30, int(rng.integers(1, 4)))])
        if entries:
            assert fast > 0  # the fast path ran and kept columns


def test_the_fast_path_asks_rows_where_the_general_path_does() -> None:
    book, ref = ContextBook(np.arange(4), 20, True, True), ContextEntries()
    asked: list[int] = []
    want: list[int] = []
    ctx = np.array([1, 2, 3, 4, 5])
    for extra in ([6], [7, 8, 9], [10]):
        book.update(ctx, lambda s: (asked.append(s), (s, "rows"))[1])
        ref.update(ctx, lambda s: (want.append(s), (s, "rows"))[1])
        ctx = np.concatenate([ctx, extra])
    assert asked == want == [0, 3, 4]


@pytest.mark.parametrize("extend", [True, False])
def test_ids_outside_the_vocabulary_are_refused_on_both_paths(extend: bool) -> None:
    book = ContextBook(np.arange(4), 10, extend=extend, entries=True)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        book.update(np.array([1, 2, -3]), lambda s: (s, "rows"))
    book = ContextBook(np.arange(4), 10, extend=extend, entries=True)
    book.update(np.array([1, 2, 3]), lambda s: (s, "rows"))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        book.update(np.array([1, 2, 3, 10]), lambda s: (s, "rows"))  # the fast path
