"""``core.draft_lm.ScratchSlots``: the scratch count, the ``expand`` check and ``keep``
that both backends' draft models share, over a fake backend base."""

from __future__ import annotations

import numpy as np
import pytest

from draftwise.core.draft_lm import ScratchSlots
from draftwise.errors import DraftwiseError


class Base:
    """A backend's cache bookkeeping: ``_len`` cached tokens in ``room`` slots."""

    def __init__(self, room: int = 8) -> None:
        self._len, self.room, self.moves = 0, room, []

    def reset(self) -> None:
        self._len = 0

    def trim(self, n: int) -> None:
        self._len = n

    def prefill(self, tokens: np.ndarray) -> None:
        self._len += int(tokens.size)

    def _check_room(self, what: str, extra: int) -> None:
        if self._len + extra > self.room:
            raise DraftwiseError(f"{what}: no room for {extra} more")


class Lm(ScratchSlots, Base):
    def expand(self, tokens: np.ndarray, mask: np.ndarray) -> tuple[int, int]:
        r, s0 = self.scratch_rows(tokens, mask)
        self._scratch += r
        return r, s0

    def _move_slots(self, src: np.ndarray, dst: int) -> None:
        self.moves.append((src.tolist(), dst))


def test_scratch_count_check_and_keep() -> None:
    lm = Lm()
    lm.prefill(np.array([1, 2, 3]))
    assert lm.expand(np.array([5]), np.ones((1, 1), bool)) == (1, 0)
    assert lm.expand(np.array([6, 7]), np.ones((2, 3), bool)) == (2, 1)
    assert lm.scratch_len == 3
    with pytest.raises(DraftwiseError, match=r"draft mask must be \(1, 4\), got \(1, 3\)"):
        lm.expand(np.array([8]), np.ones((1, 3), bool))
    with pytest.raises(DraftwiseError, match="no room"):
        lm.expand(np.array([8, 9, 10]), np.ones((3, 6), bool))
    with pytest.raises(DraftwiseError, match=r"keep \[0, 3\] \(commit 1\) outside 3 scratch"):
        lm.keep(np.array([0, 3]), 1)
    lm.keep(np.array([0, 2]), 1)  # slot 0 committed, slot 2 becomes scratch row 0
    assert (lm._len, lm.scratch_len, lm.moves) == (4, 1, [([3, 5], 3)])
    lm.keep(np.array([0]), 0)  # already in place: nothing moves
    assert (lm._len, lm.scratch_len, len(lm.moves)) == (4, 1, 1)
    lm.trim(2)
    assert (lm._len, lm.scratch_len) == (2, 0)
    lm.expand(np.array([5]), np.ones((1, 1), bool))
    lm.prefill(np.array([4]))
    assert (lm._len, lm.scratch_len) == (3, 0)
    lm.expand(np.array([5]), np.ones((1, 1), bool))
    lm.reset()
    assert (lm._len, lm.scratch_len) == (0, 0)
