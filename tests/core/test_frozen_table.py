"""Frozen Cacheback table: builder exactness, lookup, files (round trip, corruption, tokenizer)."""

from collections import Counter

import numpy as np
import pytest

from draftwise.core.drafters.frozen_table import FrozenTable, hash_gram, hash_rows
from draftwise.core.drafters.table_builder import NgramCounter, build_frozen_table
from draftwise.errors import DraftwiseError


def naive_table(streams, ll, fl, lc, fc):
    """Seed §4 with Counters; ties -> lexicographically smaller tuple."""
    grams = Counter()
    for s in streams:
        s = list(s)
        for i in range(len(s) - ll - fl + 1):
            grams[(tuple(s[i : i + ll]), tuple(s[i + ll : i + ll + fl]))] += 1
    totals = Counter()
    for (lead, _), c in grams.items():
        totals[lead] += c
    leaders = sorted(totals, key=lambda x: (-totals[x], x))[:lc]
    out = []
    for lead in leaders:
        fol = [(f, c) for (l2, f), c in grams.items() if l2 == lead]
        out.append((lead, [f for f, _ in sorted(fol, key=lambda fc_: (-fc_[1], fc_[0]))[:fc]]))
    return out


@pytest.mark.parametrize(
    "ll, fl, lc, fc", [(1, 3, 5, 3), (2, 2, 1000, 1000), (1, 1, 3, 2), (3, 1, 7, 4)]
)
def test_builder_equals_naive_counter(ll, fl, lc, fc):
    rng = np.random.default_rng(ll * 10 + fl)
    streams = [rng.integers(0, 6, int(rng.integers(0, 80))) for _ in range(12)]
    streams.append(np.array([5, 4, 3, 2, 1, 0, 100000, 2**31 - 1, 7, 7]))  # big ids, short
    # small chunks force many merges; the key cap is never reached here
    t = build_frozen_table(streams, ll, fl, lc, fc, max_keys=1 << 20, chunk_tokens=37)
    assert list(t.items()) == naive_table(streams, ll, fl, lc, fc)
    assert (t.ll, t.fl, t.fc) == (ll, fl, fc)


def test_progress_and_empty_input():
    seen = []
    t = build_frozen_table(
        [np.array([1, 2]), np.array([], np.int64)], 1, 3, 4, 4, progress=seen.append
    )
    assert seen == [2, 0] and len(t) == 0 and t.query((1,)) == []
    with pytest.raises(DraftwiseError, match="fc"):
        build_frozen_table([], 1, 3, 4, 0)
    with pytest.raises(DraftwiseError, match="token ids"):
        build_frozen_table([np.array([1, -2, 3, 4])], 1, 1, 4, 4)


def test_pruning_keeps_heavy_hitters_bounded():
    rng = np.random.default_rng(0)
    noise = rng.integers(100, 10_000, 5000)
    heavy = np.tile([1, 2, 3, 4], 300)
    c = NgramCounter(4, max_keys=512, chunk_tokens=500)
    for part in np.array_split(np.concatenate([noise, heavy, noise[::-1]]), 20):
        c.add(part)
    grams, counts = c.result()
    assert c.pruned and grams.shape[0] <= 512
    top = grams[np.argmax(counts)].tolist()
    assert top in ([1, 2, 3, 4], [2, 3, 4, 1], [3, 4, 1, 2], [4, 1, 2, 3])


def test_hash_python_equals_numpy():
    rows = np.random.default_rng(1).integers(0, 2**31 - 1, (200, 3))
    assert hash_rows(rows).tolist() == [hash_gram(tuple(r)) for r in rows.tolist()]


def test_query_limit_and_collisions_verified(monkeypatch):
    t = FrozenTable(np.array([[3, 4], [1, 2]]), np.array([0, 1, 3]), np.array([[9], [8], [7]]))
    assert t.query((1, 2)) == [(8,), (7,)] and t.query((1, 2), limit=1) == [(8,)]
    assert t.query((3, 4), limit=0) == [] and t.query((4, 3)) == [] and t.query((1,)) == []
    # force every leader to the same hash: lookup must still compare the leaders
    import draftwise.core.drafters.frozen_table as ft

    monkeypatch.setattr(ft, "hash_rows", lambda rows: np.zeros(len(rows), np.uint64))
    monkeypatch.setattr(ft, "hash_gram", lambda gram: 0)
    t = FrozenTable(np.array([[3, 4], [1, 2]]), np.array([0, 1, 3]), np.array([[9], [8], [7]]))
    assert t.query((1, 2)) == [(8,), (7,)] and t.query((3, 4)) == [(9,)] and t.query((5, 5)) == []


def test_bad_arrays_rejected():
    with pytest.raises(DraftwiseError, match="offsets"):
        FrozenTable(np.array([[1]]), np.array([0, 2]), np.array([[1, 2]]))
    with pytest.raises(DraftwiseError, match="fc"):
        FrozenTable(np.array([[1]]), np.array([0, 2]), np.array([[1], [2]]), fc=1)


def small_table():
    rng = np.random.default_rng(5)
    return build_frozen_table([rng.integers(0, 9, 400)], 1, 3, 6, 5)


def test_save_load_round_trip(tmp_path):
    t = small_table()
    p = tmp_path / "t.npz"
    t.save(p, "tok-A")
    u = FrozenTable.load(p, "tok-A")
    assert list(u.items()) == list(t.items()) and (u.ll, u.fl, u.lc, u.fc) == (
        t.ll,
        t.fl,
        t.lc,
        t.fc,
    )
    assert u.nbytes == t.nbytes > 0
    assert [f.name for f in tmp_path.iterdir()] == ["t.npz"]  # no temp file left behind
    with np.load(p, allow_pickle=False) as z:  # plain arrays, no pickle needed
        assert int(z["format"]) == 1 and str(z["tokenizer"]) == "tok-A"


def test_tokenizer_mismatch_and_wrong_kind(tmp_path):
    p = tmp_path / "t.npz"
    small_table().save(p, "tok-A")
    with pytest.raises(DraftwiseError, match="tokenizer"):
        FrozenTable.load(p, "tok-B")
    from draftwise.core.drafters.lru_table import LRUTable

    with pytest.raises(DraftwiseError, match="'frozen' table, not 'lru'"):
        LRUTable.load(p, "tok-A")


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "flip"])
def test_corrupt_file_rejected_and_untouched(tmp_path, damage):
    p = tmp_path / "t.npz"
    small_table().save(p, "tok-A")
    raw = p.read_bytes()
    bad = {
        "truncate": raw[: len(raw) // 2],
        "garbage": b"not a table at all" * 10,
        "empty": b"",
        "flip": raw[:60] + bytes(b ^ 0xFF for b in raw[60:200]) + raw[200:],
    }[damage]
    p.write_bytes(bad)
    with pytest.raises(DraftwiseError, match=str(p)):
        FrozenTable.load(p, "tok-A")
    assert p.read_bytes() == bad


def test_missing_file_and_bad_dir(tmp_path):
    with pytest.raises(DraftwiseError, match="not found"):
        FrozenTable.load(tmp_path / "nope.npz", "tok")
    with pytest.raises(DraftwiseError, match="cannot write"):
        small_table().save(tmp_path / "no" / "dir.npz", "tok")


def test_failed_save_keeps_old_file(tmp_path, monkeypatch):
    p = tmp_path / "t.npz"
    small_table().save(p, "tok-A")
    before = p.read_bytes()

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez_compressed", boom)
    with pytest.raises(DraftwiseError, match="No space"):
        small_table().save(p, "tok-A")
    assert p.read_bytes() == before and [f.name for f in tmp_path.iterdir()] == ["t.npz"]


def test_shipped_default_table_matches_default_tokenizer(default_model_dir):
    from draftwise.core.drafters.frozen_table import DEFAULT_TABLE
    from draftwise.models.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(default_model_dir)
    t = FrozenTable.load(DEFAULT_TABLE, tok.identity())
    assert (t.ll, t.fl) == (1, 3) and len(t) > 10_000
    assert len(t.query(tuple(tok.encode(" the")))) == t.fc
