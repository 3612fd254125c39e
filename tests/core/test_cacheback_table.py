"""Cacheback: dual-table drafting, table modes, dynamic-table files and memory accounting."""

import tracemalloc

import numpy as np
import pytest

from draftwise.core.decode import Decoder
from draftwise.drafting import make_drafter
from draftwise.core.drafters.base import NoDrafter
from draftwise.core.drafters.cacheback import Cacheback, FrozenTable, LRUTable
from draftwise.core.drafters.table_builder import build_frozen_table
from draftwise.core.sampling import SamplingParams
from draftwise.errors import DraftwiseError
from tests.fakes import FakeBackend


def frozen(pairs, fc=None):
    """A frozen table from {leader: [followers, most frequent first]}."""
    leaders = list(pairs)
    offsets = np.cumsum([0] + [len(pairs[k]) for k in leaders])
    fol = [f for k in leaders for f in pairs[k]]
    return FrozenTable(np.array(leaders), offsets, np.array(fol), fc=fc)


def test_dual_puts_dynamic_followers_before_frozen_and_dedups():
    fz = frozen({(1,): [(7,), (2,), (8,)], (2,): [(9,)]})
    d = Cacheback(ll=1, fl=1, crt=0, frozen=fz)
    d.table.insert((1,), (3,))
    d.table.insert((1,), (2,))  # dynamic, most recent first: 2, 3
    t = d.propose(np.array([1]), budget=8)
    assert t.tokens[t.depth == 1].tolist() == [2, 3, 7, 8]  # frozen (2,) is not repeated
    # (2,) -> frozen (9,); (7,), (3,), (8,) have no followers in either table
    assert t.tokens[t.depth == 2].tolist() == [9]
    modes = {m: Cacheback(ll=1, fl=1, crt=0, frozen=fz, table=m) for m in ("dynamic", "frozen")}
    for m in modes.values():
        m.table.insert((1,), (3,))
    assert modes["dynamic"].propose(np.array([1]), 8).tokens.tolist() == [3]
    assert modes["frozen"].propose(np.array([1]), 8).tokens.tolist() == [7, 2, 8, 9]


def test_frozen_respects_budget_and_crt():
    fz = frozen({(50,): [(f,) for f in range(10)], **{(f,): [(f + 100,)] for f in range(10)}})
    t = Cacheback(ll=1, fl=1, crt=3, frozen=fz, table="frozen").propose(np.array([50]), 8)
    assert len(t) == 8 and int((t.depth == 1).sum()) == 5 and int((t.depth == 2).sum()) == 3


def test_frozen_never_changes_and_reset_keeps_it():
    fz = frozen({(1,): [(2, 3)]})
    d = Cacheback(ll=1, fl=2, frozen=fz)
    d.begin(np.array([1, 5, 6, 1, 7, 8]))
    d.update(np.array([1, 5, 6, 1, 7, 8, 1, 4, 4]), 3)
    d.reset()
    assert list(fz.items()) == [((1,), [(2, 3)])] and len(d.table) == 0
    assert d.propose(np.array([1]), 4).tokens.tolist() == [2, 3]


def test_bad_options():
    fz = frozen({(1, 2): [(3,)]})
    with pytest.raises(DraftwiseError, match="leader length 2"):
        Cacheback(ll=1, frozen=fz)
    with pytest.raises(DraftwiseError, match="'bogus'"):
        Cacheback(table="bogus")
    with pytest.raises(DraftwiseError, match="needs a frozen table"):
        Cacheback(table="frozen")
    with pytest.raises(DraftwiseError, match="tokenizer_id"):
        Cacheback(frozen_path="x.npz")


def test_frozen_path_option(tmp_path):
    p = tmp_path / "f.npz"
    frozen({(1,): [(2, 3, 4)]}).save(p, "tok")
    d = make_drafter("cacheback", frozen_path=str(p), tokenizer_id="tok")
    assert d.propose(np.array([1]), 4).tokens.tolist() == [2, 3, 4]
    with pytest.raises(DraftwiseError, match="tokenizer"):
        make_drafter("cacheback", frozen_path=str(p), tokenizer_id="other")


def test_greedy_with_frozen_equals_plain():
    be = FakeBackend(vocab_size=6, sharpness=4.0)
    params = SamplingParams()
    prompt = [1, 2, 3, 1, 2, 3, 1]

    def run(drafter):
        dec = Decoder(be)
        steps = list(dec.steps(prompt, drafter, params, 80, budget=8))
        return [t for s in steps for t in s.tokens], len(steps)

    plain, n_plain = run(NoDrafter())
    rng = np.random.default_rng(0)  # a frozen table of unrelated text: mostly wrong guesses
    fz = build_frozen_table([rng.integers(0, 6, 300)], 1, 3, 6, 4)
    good = build_frozen_table([np.array(plain)], 1, 3, 6, 4)  # a table of the answer itself
    for table in ("dual", "frozen", "dynamic"):
        for f in (fz, good):
            assert run(Cacheback(frozen=f, table=table))[0] == plain
    assert run(Cacheback(frozen=good, table="frozen"))[1] < n_plain


def test_lru_save_load_round_trip_keeps_order(tmp_path):
    t = LRUTable(ll=2, fl=2, lc=5, fc=3)
    rng = np.random.default_rng(3)
    t.insert_windows(rng.integers(0, 4, 200).tolist(), 0)
    t.query(next(iter(t.items()))[0])  # refresh the LRU leader
    p = tmp_path / "dyn.npz"
    t.save(p, "tok")
    u = LRUTable.load(p, "tok")
    assert list(u.items()) == list(t.items()) and (u.ll, u.fl, u.lc, u.fc) == (2, 2, 5, 3)
    # and it keeps behaving identically
    for table in (t, u):
        table.insert((9, 9), (1, 1))
        table.insert(list(table.items())[2][0], (5, 5))
    assert list(u.items()) == list(t.items())
    e = LRUTable(1, 3, 4, 4)
    e.save(p, "tok")
    assert len(LRUTable.load(p, "tok")) == 0


def test_cacheback_save_load_and_corrupt_file_untouched(tmp_path):
    d = Cacheback(ll=1, fl=2, lc=16, fc=4)
    d.begin(np.array([1, 2, 3, 1, 2, 4, 5, 1, 2, 3]))
    p = tmp_path / "state.npz"
    d.save(p, "tok")
    d2 = Cacheback(ll=1, fl=2)
    d2.load(p, "tok")
    assert list(d2.table.items()) == list(d.table.items())
    ctx = np.array([9, 1])
    assert d2.propose(ctx, 6).tokens.tolist() == d.propose(ctx, 6).tokens.tolist()
    with pytest.raises(DraftwiseError, match="tokenizer"):
        d2.load(p, "other")
    bad = p.read_bytes()[:100]
    p.write_bytes(bad)
    before = list(d2.table.items())
    with pytest.raises(DraftwiseError, match=str(p)):
        d2.load(p, "tok")
    assert p.read_bytes() == bad and list(d2.table.items()) == before


def test_inconsistent_lru_file_rejected(tmp_path):
    from draftwise.core.drafters.table_io import write_table

    p = tmp_path / "x.npz"
    meta = {"ll": 1, "fl": 1, "lc": 4, "fc": 2}
    leaders = np.array([[1], [2]], np.int32)
    for counts, fol, what in [
        ([1, 3], [[5], [6], [7], [8]], "follower counts"),
        ([2, 1], [[5], [5], [6]], "same follower twice"),
        ([1, 1], [[5]], "followers shape"),
    ]:
        arrays = {"leaders": leaders, "counts": np.array(counts), "followers": np.array(fol)}
        write_table(p, "lru", "tok", meta, arrays)
        with pytest.raises(DraftwiseError, match=what):
            LRUTable.load(p, "tok")


def test_nbytes_matches_tracemalloc():
    """The per-leader constants of LRUTable.nbytes, checked against real allocations."""
    t = LRUTable(ll=1, fl=3, lc=1 << 20, fc=8)
    tokens = np.random.default_rng(0).permutation(np.arange(300, 20_300))
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        toks = tokens.tolist()
        t.insert_windows(toks, 0)
        t.insert_windows(toks[::-1], 0)  # a second follower per leader
        del toks
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert 0.8 * used <= t.nbytes() <= 1.5 * used, (used, t.nbytes())


def test_worst_case_memory():
    gib, mib = 2**30, 2**20
    assert LRUTable.worst_case_nbytes(1, 3, 1 << 20, 128) < 2 * gib  # the paper's settings
    assert LRUTable.worst_case_nbytes(1, 3, 1 << 16, 32) < 40 * mib  # the defaults
