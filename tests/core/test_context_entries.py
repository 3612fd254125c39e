"""ContextEntries: which entries a context drafter keeps, drops and adds, against a
from-scratch rebuild on random histories (growth, rollbacks, new prompts, gaps)."""

from __future__ import annotations

import numpy as np

from draftwise.core.drafters.context_entries import ContextEntries


def test_a_step_adds_the_new_positions_only() -> None:
    book = ContextEntries()
    assert book.plan(np.arange(10, 16)) == (0, 0)
    assert book.added(np.arange(10, 16), first=0) == (1, 5)  # entries 1..4
    ctx = np.arange(10, 19)  # three tokens accepted, a new root
    assert book.plan(ctx) == (4, 4)  # all kept; rows from g_4 (entry 5 needs it)
    assert book.added(ctx, first=4) == (5, 8)
    assert book.pos.tolist() == list(range(1, 8))


def test_rows_missing_before_first_leave_a_gap() -> None:
    book = ContextEntries()
    book.plan(np.arange(8))
    assert book.added(np.arange(8), first=4) == (5, 7)  # rows from 4 only: entries 5, 6
    assert book.pos.tolist() == [5, 6]
    assert book.added(np.arange(8), first=7) == (7, 7)  # no rows at all: nothing


def test_matches_a_rebuild_on_random_histories() -> None:
    """Held entries are exactly the positions p >= 1 whose tokens 0..p+1 are those of the
    current context and whose rows the backend gave."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        book = ContextEntries()
        ctx = rng.integers(0, 3, int(rng.integers(2, 6)))
        built: dict[int, tuple[int, ...]] = {}  # position -> the tokens it was made from
        for _ in range(12):
            keep, rows_from = book.plan(ctx)
            built = {p: t for p, t in built.items() if p in set(book.pos.tolist())}
            first = rows_from + int(rng.integers(0, 2))  # the backend may hold fewer
            a, b = book.added(ctx, first=min(first, ctx.size - 1))
            for p in range(a, b):
                built[p] = tuple(ctx[: p + 2].tolist())
            assert book.pos.tolist() == sorted(built)
            for p, toks in built.items():  # every held entry is still right
                assert toks == tuple(ctx[: p + 2].tolist())
            assert keep <= len(built)
            roll = int(rng.integers(0, 3))
            if roll == 0:  # a rollback and other tokens
                cut = int(rng.integers(1, ctx.size + 1))
                ctx = np.concatenate([ctx[:cut], rng.integers(0, 3, int(rng.integers(1, 4)))])
            else:  # accepted tokens
                ctx = np.concatenate([ctx, rng.integers(0, 3, int(rng.integers(1, 4)))])


def test_update_is_plan_rows_added() -> None:
    """``update`` asks the backend's rows from where ``plan`` says and records them."""
    asked: list[int] = []

    def rows(start: int) -> tuple[int, object | None]:
        asked.append(start)
        return start, "rows"

    book = ContextEntries()
    assert book.update(np.array([5, 6, 7, 8]), rows) == (0, 0, 1, 3, "rows")
    assert book.update(np.array([5, 6, 7, 9, 4]), rows) == (1, 1, 2, 4, "rows")
    assert asked == [0, 1] and book.pos.tolist() == [1, 2, 3]
    assert ContextEntries().update(np.array([1, 2, 3]), lambda s: None) == (0, 2, 2, 2, None)
