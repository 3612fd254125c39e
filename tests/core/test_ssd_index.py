"""SSD building blocks: suffix array, index narrowing, token ring, persistence."""

import numpy as np
import pytest

from draftwise.core.drafters.suffix_array import SuffixIndex, suffix_array
from draftwise.core.drafters.token_store import TokenStore
from draftwise.errors import DraftwiseError


def naive_sa(seq):
    """Sorted suffixes; separators (< 0) compare as distinct and below every token."""
    n = len(seq)
    t = [x if x >= 0 else i - n - 10 for i, x in enumerate(seq)]
    return sorted(range(n), key=lambda i: t[i:])


def sequences(rng):
    yield np.zeros(0, np.int64)
    yield np.array([7])
    yield np.array([3_000_000_000, 5, 3_000_000_000, 5, -1, 7])  # ids past int32: ranked
    for n in (1, 2, 5, 40, 97):
        yield np.zeros(n, np.int64)  # one token repeated: the deepest doubling
    for period in (1, 2, 3, 7):
        yield np.tile(rng.integers(0, 3, period), 20)[:57]
    for _ in range(40):
        yield rng.integers(0, 3, int(rng.integers(1, 80)))
    for _ in range(20):
        yield rng.integers(-1, 4, int(rng.integers(1, 80)))  # with separators


def test_suffix_array_equals_naive():
    rng = np.random.default_rng(0)
    for seq in sequences(rng):
        assert suffix_array(seq).tolist() == naive_sa(seq.tolist()), seq.tolist()


def test_depth_limited_suffix_array_sorts_prefixes():
    rng = np.random.default_rng(5)
    for seq in sequences(rng):
        n = len(seq)
        t = [x if x >= 0 else i - n - 10 for i, x in enumerate(seq.tolist())]
        for depth in (1, 3, 8):
            sa = suffix_array(seq, depth=depth)
            assert sorted(sa.tolist()) == list(range(n))
            heads = [t[i : i + depth] for i in sa.tolist()]
            assert heads == sorted(heads)


def test_suffix_array_large_random_is_sorted():
    rng = np.random.default_rng(1)
    seq = rng.integers(0, 50, 20000)
    sa = suffix_array(seq)
    assert np.array_equal(np.sort(sa), np.arange(seq.size))
    for a, b in zip(sa[:-1:97], sa[1::97], strict=False):  # spot-check neighbours
        assert seq[a : a + 30].tolist() <= seq[b : b + 30].tolist()


def naive_ranges(tokens, pattern):
    """For each depth, the set of logical end positions of pattern[:d+1] (reversed)."""
    out = []
    for d in range(len(pattern)):
        ends = {
            e
            for e in range(d, len(tokens))
            if all(tokens[e - j] == pattern[j] for j in range(d + 1))
        }
        if not ends:
            break
        out.append(ends)
    return out


def test_narrow_equals_naive_scan():
    rng = np.random.default_rng(2)
    for trial in range(60):
        n = int(rng.integers(1, 600))
        tokens = rng.integers(-1, 3 if trial % 2 else 6, n)
        start = int(rng.integers(0, 1000))
        ix = SuffixIndex.build(tokens, start=start, epoch=0, pad=9)
        for _ in range(5):
            pattern = rng.integers(0, 4, int(rng.integers(1, 9)))
            got = [set(ix.match_ends(lo, hi).tolist()) for lo, hi in ix.narrow(pattern)]
            want = [{e + start for e in s} for s in naive_ranges(tokens.tolist(), pattern.tolist())]
            assert got == want
            for lo, hi in ix.narrow(pattern):  # tokens_at reads the original order back
                e = ix.match_ends(lo, hi)
                assert np.array_equal(ix.tokens_at(e), np.full(e.size, pattern[0]))


def test_narrow_large_ranges_use_bisect():
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, 2, 5000)  # ranges far above the gather threshold
    ix = SuffixIndex.build(tokens, start=0, epoch=0, pad=17)
    pattern = tokens[-12:][::-1]
    got = [set(ix.match_ends(lo, hi).tolist()) for lo, hi in ix.narrow(pattern)]
    assert got == naive_ranges(tokens.tolist(), pattern.tolist())
    assert ix.narrow(np.array([5])) == [] and ix.narrow(np.array([1, 9])) == ix.narrow([1])[:1]


def test_ring_overwrite_keeps_newest_tokens():
    st = TokenStore(capacity=10)
    history = []
    rng = np.random.default_rng(4)
    for _ in range(30):
        prompt = rng.integers(0, 100, int(rng.integers(1, 6)))
        st.begin_request(prompt)
        history += [-1] + prompt.tolist()
        for _ in range(int(rng.integers(0, 3))):
            new = rng.integers(0, 100, int(rng.integers(1, 14)))  # sometimes > capacity
            st.append(new)
            history += new.tolist()
        assert st.total == len(history)
        assert st.read(st.oldest, st.total).tolist() == history[-10:]
        assert st.read(0, st.total).tolist() == history[-10:]  # reads clamp to what is held
    for p, a, e in st.records():
        assert p >= st.oldest and history[p - 1] == -1 and (e < 0 or e >= a)


def test_records_and_request_layout():
    st = TokenStore(capacity=64)
    st.begin_request([1, 2])
    st.append(np.array([3, 4]))
    st.begin_request([5])
    assert st.read(0, st.total).tolist() == [-1, 1, 2, 3, 4, -1, 5]
    assert st.records() == [(1, 3, 5), (6, 7, -1)]
    assert st.record_at(6) == (6, 7, -1) and st.record_at(2) is None
    with pytest.raises(DraftwiseError, match="-5"):
        st.append(np.array([-5]))
    with pytest.raises(DraftwiseError, match="2147483648"):
        st.append(np.array([1 << 31]))
    with pytest.raises(DraftwiseError, match="capacity"):
        TokenStore(capacity=1)


def test_save_load_round_trip(tmp_path):
    st = TokenStore(capacity=32)
    for i in range(6):
        st.begin_request([i, i + 1, i + 2])
        st.append(np.array([9, 8, 7, i]))
    path = tmp_path / "sub" / "ssd.npz"
    st.save(path, "tok-A")
    assert [p.name for p in path.parent.iterdir()] == ["ssd.npz"]  # no temp file left
    other = TokenStore(capacity=32)
    other.load(path, "tok-A")
    assert other.total == st.total and other.records() == st.records()
    assert np.array_equal(other.read(0, other.total), st.read(0, st.total))
    small = TokenStore(capacity=8)  # a smaller ring keeps the newest tokens
    small.load(path, "tok-A")
    assert small.read(0, small.total).tolist() == st.read(0, st.total).tolist()[-8:]
    assert all(p >= small.oldest for p, _, _ in small.records())


def test_load_rejects_bad_files_and_leaves_them(tmp_path):
    st = TokenStore(capacity=32)
    st.begin_request([1, 2, 3])
    good = tmp_path / "ssd.npz"
    st.save(good, "tok-A")
    with pytest.raises(DraftwiseError, match="tok-A"):
        TokenStore().load(good, "tok-B")
    raw = good.read_bytes()
    for name, data in (("trunc.npz", raw[: len(raw) // 2]), ("junk.npz", b"not a zip at all")):
        bad = tmp_path / name
        bad.write_bytes(data)
        target = TokenStore(capacity=32)
        target.begin_request([4, 4])
        with pytest.raises(DraftwiseError, match=name):
            target.load(bad, "tok-A")
        assert bad.read_bytes() == data  # the file is left as it was
        assert target.read(0, target.total).tolist() == [-1, 4, 4]  # and so is the store
    with pytest.raises(DraftwiseError, match="does not exist"):
        TokenStore().load(tmp_path / "missing.npz", "tok-A")
    v2 = tmp_path / "v2.npz"
    np.savez(v2, format_version=np.array(2), tokenizer_id=np.array("tok-A"))
    with pytest.raises(DraftwiseError, match="version 2"):
        TokenStore().load(v2, "tok-A")
    obj = tmp_path / "obj.npz"
    np.savez(
        obj,
        format_version=np.array(1),
        tokenizer_id=np.array("tok-A"),
        first=np.array(0),
        tokens=np.array([{"x": 1}], dtype=object),
        records=np.zeros((0, 3)),
    )
    with pytest.raises(DraftwiseError, match="obj.npz"):  # pickled arrays are refused
        TokenStore().load(obj, "tok-A")


def test_save_replaces_atomically(tmp_path):
    path = tmp_path / "ssd.npz"
    a, b = TokenStore(capacity=16), TokenStore(capacity=16)
    a.begin_request([1])
    b.begin_request([2, 2])
    a.save(path, "t")
    b.save(path, "t")
    c = TokenStore(capacity=16)
    c.load(path, "t")
    assert c.read(0, c.total).tolist() == [-1, 2, 2]
