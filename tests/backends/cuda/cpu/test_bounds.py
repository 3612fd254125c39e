"""Checks at the Python-C boundary (``bounds.py``): every ctypes entry point refuses
out-of-range starts, writes, slots, counts, dtypes and layouts with ``ValueError`` before
C runs (a recording stand-in for the library proves no call was made); in-range random
calls to the real kernels agree with a float64 reference (run under AddressSanitizer
and UBSan by ``scripts/test.sh --sanitize``)."""

from __future__ import annotations

import re
import time
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from draftwise.backends.cuda.cpu import native  # noqa: E402
from draftwise.backends.cuda.cpu.bounds import check_slots, check_write  # noqa: E402
from draftwise.backends.cuda.cpu.fused import FusedForward  # noqa: E402
from tests.backends.cuda.cpu.test_native import lib  # noqa: E402,F401  (the compiled kernel, or skip)

pytestmark = pytest.mark.sanitize
H, HKV, D, TMAX = 4, 2, 16, 64


class Recorder:
    """Stands in for the compiled library: records every call, runs nothing."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str):
        if not name.startswith("dw_"):
            raise AttributeError(name)
        return lambda *args: self.calls.append(name) or 0


def attention_args(rows: int = 3, e: int = 4, committed: int = 10):
    kv = torch.zeros(2, HKV, TMAX, D)  # (2, H_kv, T_max, D)
    q = torch.zeros(H, rows, D)  # (H, T, D)
    extra = torch.tensor([[committed + j for j in range(e)]] * rows, dtype=torch.int64)  # (T, E)
    n_extra = torch.full((rows,), e, dtype=torch.int32)  # (T,)
    return q, kv, committed, extra, n_extra


def test_in_range_arguments_reach_the_library():
    lib = Recorder()
    native.native_attention(lib, *attention_args())
    q, kv, *rest = attention_args()
    native.native_attention(lib, q, kv.bfloat16(), *rest)  # the 4bit mode's cache
    assert lib.calls == ["dw_attention_kv", "dw_attention_kv"]


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda a: a[3].__setitem__((1, 2), TMAX), "slot extra[1, 2] = 64 outside"),
        (lambda a: a[3].__setitem__((0, 0), -1), "slot extra[0, 0] = -1 outside"),
        (lambda a: a[4].__setitem__(2, 5), "n_extra holds counts outside 0..4"),
        (lambda a: a[4].__setitem__(0, -1), "n_extra holds counts outside"),
    ],
    ids=["slot-past-tmax", "negative-slot", "count-past-width", "negative-count"],
)
def test_bad_slots_raise_before_c(change, needle):
    lib = Recorder()
    args = list(attention_args())
    change(args)
    with pytest.raises(ValueError, match=re.escape(needle)):
        native.native_attention(lib, *args)
    assert lib.calls == []


@pytest.mark.parametrize(
    "index, value, needle",
    [
        (2, lambda: TMAX + 1, "committed=65 outside"),
        (3, lambda: torch.zeros(3, 4, dtype=torch.int32), "extra must be torch.int64"),
        (3, lambda: torch.zeros(4, 3, dtype=torch.int64).t(), "extra must be contiguous"),
        (3, lambda: torch.zeros(5, 4, dtype=torch.int64), "slot tables of 5 rows for 3 query rows"),
        (4, lambda: torch.zeros(2, dtype=torch.int32), "slot tables of 3 and 2 rows"),
        (1, lambda: torch.zeros(2, HKV, TMAX, D, dtype=torch.float64), "float32 or bfloat16 CPU cache"),
        (1, lambda: torch.zeros(2, HKV, TMAX, 8), "for queries of head size 16"),
        (1, lambda: torch.zeros(2, 3, TMAX, D), "4 query heads over 3 key/value heads"),
    ],
    ids=["committed", "extra-dtype", "extra-layout", "extra-rows", "count-rows",
         "kv-dtype", "kv-head-size", "kv-heads"],
)
def test_bad_shapes_and_layouts_raise_before_c(index, value, needle):
    lib = Recorder()
    args = list(attention_args())
    args[index] = value()
    with pytest.raises(ValueError, match=needle):
        native.native_attention(lib, *args)
    assert lib.calls == []


def test_matmul_wrappers_check_the_packed_weight():
    lib = Recorder()
    with pytest.raises(ValueError, match="packed float32 weight must be torch.float32"):
        native.native_f32_mm(lib, torch.zeros(2, 32), torch.zeros(2, 32, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="packed 4-bit weight must be contiguous"):
        packed = torch.zeros(2, 320, 2, dtype=torch.uint8).transpose(1, 2)  # (2, 2, 320)
        native.native_int4_mm(lib, torch.zeros(2, 64, dtype=torch.bfloat16), packed)
    with pytest.raises(ValueError, match="x must have 2 dimensions"):
        native.native_f32_mm(lib, torch.zeros(32), torch.zeros(2, 32, 16))
    assert lib.calls == []


def fused_stub(lib: Recorder, t_max: int = TMAX) -> FusedForward:
    """A FusedForward over a two-layer stand-in model (no weights are read: the library
    is a recorder), to drive its argument checks."""
    cfg = SimpleNamespace(n_layers=2, dim=32, n_heads=H, n_kv_heads=HKV, head_dim=D,
                          ffn_dim=64, norm_eps=1e-5)
    model = SimpleNamespace(
        cfg=cfg,
        cache=torch.zeros(2, 2, HKV, t_max, D),  # (L, 2, H_kv, T_max, D)
        embed=torch.zeros(100, 32),
    )
    f = FusedForward.__new__(FusedForward)
    f.model, f.lib = model, lib
    f._w = [None] * 4
    f._nw = [None] * 2
    f._final = torch.zeros(32, dtype=torch.bfloat16)
    f._cos = torch.zeros(t_max, D)
    f._sin = torch.zeros(t_max, D)
    f._embed_bits = None  # ``step`` casts the float32 rows (its bfloat16 view: None)
    f._cos_np, f._sin_np = f._cos.numpy(), f._sin.numpy()
    f._weights = (None,) * 7
    f._cache_ok = None
    return f


def plan(rows: int, committed: int, slots: list[list[int]]):
    e = max((len(s) for s in slots), default=0)
    extra = torch.zeros(rows, e, dtype=torch.int64)
    for i, s in enumerate(slots):
        extra[i, : len(s)] = torch.tensor(s)
    n = torch.tensor([len(s) for s in slots], dtype=torch.int32)
    return SimpleNamespace(committed=committed, extra=extra, n_extra=n)


def test_the_fused_forward_checks_its_write_and_slots_before_c():
    lib = Recorder()
    f = fused_stub(lib)
    tokens, pos = torch.tensor([1, 2]), torch.tensor([60, 61])
    f(tokens, pos, 60, plan(2, 60, [[60], [60, 61]]), 2)  # in range: reaches C
    assert lib.calls == ["dw_forward"]
    for start, n_write, needle in [(63, 2, "start=63 \\+ n_write=2 exceeds its 64 slots"),
                                   (-1, 1, "both must be >= 0"), (0, 3, "n_write=3 exceeds")]:
        with pytest.raises(ValueError, match=needle):
            f(tokens, pos, start, plan(2, 60, [[60], [60, 61]]), n_write)
    with pytest.raises(ValueError, match="slot extra\\[1, 1\\] = 64 outside"):
        f(tokens, pos, 60, plan(2, 60, [[60], [60, 64]]), 2)
    with pytest.raises(ValueError, match="cache of shape"):
        f.model.cache = torch.zeros(2, 2, HKV, TMAX, 8)
        f(tokens, pos, 60, plan(2, 60, [[60], [60, 61]]), 2)
    assert lib.calls == ["dw_forward"]


def test_the_fused_step_checks_its_arguments_before_c():
    """``FusedForward.step`` (a verify's numpy path) refuses every out-of-range token,
    position, slot and count, and a malformed table or cache, before C runs."""
    lib = Recorder()
    f = fused_stub(lib)
    tok, pos = np.array([1, 2]), np.array([60, 61])
    extra, n = np.array([[60, 0], [60, 61]]), np.array([1, 2], np.int32)
    f.step(tok, pos, 60, 60, extra, n, 2)  # in range: reaches C
    assert lib.calls == ["dw_forward"]
    good = (tok, pos, 60, 60, extra, n, 2)

    def but(**change):  # ``good`` with some arguments changed
        names = ("tok", "pos", "start", "committed", "extra", "n", "n_write")
        return tuple(change.get(k, v) for k, v in zip(names, good, strict=True))

    bad = [
        (but(tok=np.array([1, 100])), "token ids \\[1, 100\\] outside the vocabulary 0..99"),
        (but(tok=np.array([-1, 2])), "outside the vocabulary"),
        (but(pos=np.array([60, 64])), "positions \\[60, 64\\] outside the rope table's 0..63"),
        (but(pos=np.array([60])), "\\(T,\\) each"),
        (but(start=63), "start=63 \\+ n_write=2 exceeds its 64 slots"),
        (but(extra=np.array([[60, 0], [60, 64]])), "slot extra\\[1, 1\\] = 64 outside"),
        (but(extra=np.array([[-3, 0], [60, 61]])), "slot extra\\[0, 0\\] = -3 outside"),
        (but(n=np.array([1, 3], np.int32)), "counts outside 0..2"),
        (but(extra=extra.astype(np.int32)), "extra must be a 2-d int64 array"),
        (but(n=n.astype(np.int64)), "n_extra must be a 1-d int32 array"),
        (but(extra=np.asfortranarray(extra)), "extra must be contiguous"),
        (but(committed=65), "committed=65 outside"),
    ]
    for args, needle in bad:
        with pytest.raises(ValueError, match=needle):
            f.step(*args)
    with pytest.raises(ValueError, match="cache of shape"):
        f.model.cache = torch.zeros(2, 2, HKV, TMAX, 8)
        f.step(tok, pos, 60, 60, extra, n, 2)
    assert lib.calls == ["dw_forward"]


def test_check_cost_is_per_table_not_per_layer():
    """The slot check runs once per plan table (a step), not once per layer and head:
    30 layers' calls cost little more than one."""
    extra = torch.randint(0, 8000, (16, 12), dtype=torch.int64)
    n = torch.full((16,), 12, dtype=torch.int32)
    check_slots(extra, n, 16, 8192)  # warm
    t0 = time.perf_counter()
    for _ in range(200):
        check_slots(extra.clone(), n, 16, 8192)  # a new table each time: full checks
    full = (time.perf_counter() - t0) / 200
    t0 = time.perf_counter()
    for _ in range(200):
        check_slots(extra, n, 16, 8192)  # the same table: the memo
    memo = (time.perf_counter() - t0) / 200
    print(f"slot check: {full * 1e6:.1f} us a new table, {memo * 1e6:.2f} us a repeat")
    assert memo < full
    extra[0, 0] = 8192  # an in-place write invalidates the memo
    with pytest.raises(ValueError, match="outside"):
        check_slots(extra, n, 16, 8192)
    with pytest.raises(ValueError, match="exceeds"):
        check_write(8190, 4, 8192)


def test_random_in_range_calls_agree_with_a_reference(lib):
    """Property test: random head sizes, heads, cache sizes, committed lengths and slot
    lists within bounds; the kernel equals softmax(q k^T / sqrt(d)) v over each row's
    keys in float64 (and, under ``--sanitize``, touches no byte outside its buffers)."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.settings(max_examples=40, deadline=None, derandomize=True)
    @hypothesis.given(
        d=st.sampled_from([8, 16, 64, 80, 96, 128]),
        hkv=st.integers(1, 3),
        rep=st.integers(1, 3),
        tmax=st.integers(1, 200),
        data=st.data(),
    )
    def check(d, hkv, rep, tmax, data):
        h = hkv * rep
        committed = data.draw(st.integers(0, tmax))
        rows = data.draw(st.integers(1, 6))
        slots = [
            data.draw(st.lists(st.integers(0, tmax - 1), min_size=0 if committed else 1, max_size=7))
            for _ in range(rows)
        ]
        e = max(len(s) for s in slots)
        extra = torch.zeros(rows, max(e, 1), dtype=torch.int64)
        for i, s in enumerate(slots):
            extra[i, : len(s)] = torch.tensor(s, dtype=torch.int64)
        n = torch.tensor([len(s) for s in slots], dtype=torch.int32)
        g = torch.Generator().manual_seed(d * 1000 + tmax)
        kv = torch.randn(2, hkv, tmax, d, generator=g)
        q = torch.randn(h, rows, d, generator=g)
        got = native.native_attention(lib, q, kv, committed, extra, n).view(rows, h, d)
        for i, s in enumerate(slots):
            keys = [*range(committed), *s]
            for hh in range(h):
                k, v = kv[0, hh // rep, keys].double(), kv[1, hh // rep, keys].double()
                p = torch.softmax(k @ q[hh, i].double() * d**-0.5, dim=0)
                assert torch.allclose(got[i, hh].double(), p @ v, rtol=1e-4, atol=1e-5)

    check()


def test_random_out_of_range_slots_never_reach_c():
    lib = Recorder()
    rng = np.random.default_rng(0)
    for _ in range(200):
        rows, e, tmax = (int(v) for v in rng.integers(1, 8, 3))
        extra = torch.from_numpy(rng.integers(-3, tmax + 3, (rows, e)))
        n = torch.from_numpy(rng.integers(0, e + 1, rows).astype(np.int32))
        used = np.arange(e)[None, :] < n.numpy()[:, None]
        bad = bool((used & ((extra.numpy() < 0) | (extra.numpy() >= tmax))).any())
        q, kv = torch.zeros(2, rows, 8), torch.zeros(2, 1, tmax, 8)
        if bad:
            with pytest.raises(ValueError, match="outside"):
                native.native_attention(lib, q, kv, 0, extra, n)
        else:
            native.native_attention(lib, q, kv, 0, extra, n)
    assert 0 < len(lib.calls) < 200


def test_the_eager_replay_checks_its_write_and_slots_before_c():
    from draftwise.backends.cuda.cpu.fused_eager import eager_forward

    lib = Recorder()
    f = fused_stub(lib)
    f.model.layers = []  # the checks come before the first layer
    tokens, pos = torch.tensor([1, 2]), torch.tensor([60, 61])
    with pytest.raises(ValueError, match="start=63 \\+ n_write=2 exceeds its 64 slots"):
        eager_forward(f, tokens, pos, 63, plan(2, 60, [[60], [60, 61]]), 2)
    with pytest.raises(ValueError, match="outside the cache's 0..63"):
        eager_forward(f, tokens, pos, 60, plan(2, 60, [[60], [99]]), 2)
    assert lib.calls == []
