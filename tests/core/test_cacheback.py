import numpy as np
import pytest

from draftwise.core.drafters.cacheback import Cacheback, LRUTable
from draftwise.errors import DraftwiseError


def test_leader_lru_eviction_at_lc():
    t = LRUTable(ll=1, fl=1, lc=2, fc=4)
    t.insert((1,), (10,))
    t.insert((2,), (20,))
    t.query((1,))  # a query refreshes leader 1, so 2 is now least recent
    t.insert((3,), (30,))
    assert [l for l, _ in t.items()] == [(1,), (3,)]
    t.insert((1,), (11,))  # an insertion refreshes leader 1 too
    t.insert((4,), (40,))
    assert [l for l, _ in t.items()] == [(1,), (4,)]


def test_follower_lru_eviction_at_fc_insertion_only():
    t = LRUTable(ll=1, fl=2, lc=8, fc=2)
    t.insert((1,), (2, 3))
    t.insert((1,), (4, 5))
    assert t.query((1,)) == [(4, 5), (2, 3)]  # most recent first
    t.query((1,))  # queries do not refresh followers
    t.insert((1,), (2, 3))  # re-insertion does
    t.insert((1,), (6, 7))  # evicts (4, 5), the least recently inserted
    assert t.query((1,)) == [(6, 7), (2, 3)]
    # followers compete only within their leader
    t.insert((9,), (1, 1))
    assert t.query((1,)) == [(6, 7), (2, 3)]


def test_sliding_window_update_equals_full_rebuild():
    rng = np.random.default_rng(1)
    seq = rng.integers(0, 5, 60)
    for ll, fl in [(1, 3), (2, 2), (3, 1)]:
        inc = Cacheback(ll=ll, fl=fl, lc=1000, fc=1000)
        inc.begin(seq[:10])
        n = 10
        while n < seq.size:
            k = int(rng.integers(1, 5))
            n = min(n + k, seq.size)
            inc.update(seq[:n], k if n < seq.size else k)
        full = LRUTable(ll, fl, 1000, 1000)
        full.insert_windows(seq.tolist(), 0)
        got = {l: set(f) for l, f in inc.table.items()}
        want = {l: set(f) for l, f in full.items()}
        assert got == want


def test_propose_respects_budget_and_crt():
    d = Cacheback(ll=1, fl=1, crt=3)
    for f in range(10):
        d.table.insert((0,), (f,))
        d.table.insert((f,), (f + 100,))
    t = d.propose(np.array([7, 0]), budget=8)
    assert len(t) == 8
    assert int((t.depth == 1).sum()) == 5  # budget - crt at the first level
    assert int((t.depth == 2).sum()) == 3
    assert len(d.propose(np.array([0]), budget=0)) == 0
    assert len(d.propose(np.array([55]), budget=8)) == 0  # unknown leader


def test_bad_parameters():
    with pytest.raises(DraftwiseError, match="fl"):
        Cacheback(fl=0)
    with pytest.raises(DraftwiseError, match="crt"):
        Cacheback(crt=-1)


def test_token_count_bounded():
    t = LRUTable(ll=1, fl=3, lc=4, fc=2)
    rng = np.random.default_rng(0)
    t.insert_windows(rng.integers(0, 50, 500).tolist(), 0)
    assert len(t) == 4 and t.token_count() <= 4 * (1 + 3 * 2)


@pytest.mark.parametrize("ll,fl", [(3, 3), (1, 3), (2, 1)])
def test_seen_before_counts_the_tokens_noted_unseen_as_if_shown(ll, fl):
    """A copy member kept behind (``note_unseen`` each step, one ``update`` with every
    token now and then, as ``auto`` does) answers ``seen_before`` at every step as one
    shown each token at once, and ends with the same table."""
    rng = np.random.default_rng(3)
    shown, lazy = Cacheback(ll=ll, fl=fl, table="dynamic"), Cacheback(ll=ll, fl=fl, table="dynamic")
    prompt = rng.integers(0, 6, 20)
    shown.begin(prompt)
    lazy.begin(prompt)
    text, behind = list(prompt), 0
    for step in range(300):
        new = rng.integers(0, 6, int(rng.integers(1, 5)))  # a step's accepted tokens
        text += new.tolist()
        ctx = np.array(text)
        shown.update(ctx, new.size)
        behind += new.size
        if rng.random() < 0.1:  # a step that drafts with it: shown all it missed
            lazy.update(ctx, behind)
            behind = 0
        else:
            lazy.note_unseen(ctx, new.size)
        assert lazy.seen_before(ctx) == shown.seen_before(ctx), step
        probe = np.array(text[:-2] + rng.integers(0, 6, 2).tolist())  # other endings
        assert lazy.seen_before(probe) == shown.seen_before(probe), step
    lazy.update(np.array(text), behind)
    assert list(lazy.table.items()) == list(shown.table.items())
    assert not lazy._unseen
