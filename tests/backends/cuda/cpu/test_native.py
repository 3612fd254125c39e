"""The compiled row-invariant attention (``native.py``, ``csrc/attention.c``): it builds
here, agrees with ``block_attention`` to float32 rounding, and gives a row the same bits
whatever else is computed with it and however many threads run it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from draftwise.backends.cuda.cpu import native  # noqa: E402
from draftwise.backends.cuda.invariant import block_attention, make_plan  # noqa: E402

H, HKV, D, TMAX = 9, 3, 64, 1024


@pytest.fixture(scope="module")
def lib():
    found = native.attention_lib()
    if found is None:
        pytest.skip("no C compiler here: the backend keeps block_attention")
    return found


def _case(seed: int, committed: int, rows: list[list[int]], d: int = D):
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(2, HKV, TMAX, d, generator=g)  # (2, H_kv, T_max, D)
    q = torch.randn(H, len(rows), d, generator=g).bfloat16()  # (H, T, D)
    return q, kv


def _rows(committed: int, n: int, rng: np.random.Generator) -> list[list[int]]:
    """n tree rows: random ancestor chains among the new slots, each ending at itself."""
    rows: list[list[int]] = [[committed]]
    for i in range(1, n):
        parent = rows[int(rng.integers(0, i))]
        rows.append([*parent, committed + i])
    return rows


@pytest.mark.parametrize("committed", [1, 63, 64, 300, 900])
def test_native_agrees_with_block_attention(lib, committed):
    rows = _rows(committed, 12, np.random.default_rng(committed))
    q, kv = _case(committed, committed, rows)
    want = block_attention(q, kv, make_plan(committed, rows, torch.device("cpu")), H // HKV)
    got = native.native_attention(
        lib, q, kv, committed, *_extra(make_plan(committed, rows, torch.device("cpu"), lib))
    )
    assert got.shape == want.shape == (len(rows), H * D)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


def _extra(plan):
    return plan.extra, plan.n_extra


@pytest.mark.parametrize("committed", [1, 63, 300])
@pytest.mark.parametrize(
    "head", [64, 80, 96, 128, 72], ids=["d64", "d80", "d96", "d128", "d72-scalar"]
)
def test_a_bfloat16_cache_is_attended_as_a_bfloat16_model_would(lib, committed, head):
    """The 4bit mode's cache: with avx512_bf16 the scores multiply the bfloat16 keys by
    the scaled query rounded to bfloat16 (vdpbf16ps, no widening), the values are widened
    exactly. So the output is the float64 attention of the bfloat16 query over the same
    values, to float32 rounding; and the float32 path over those values within the
    query's rounding. Where p @ V runs on vdpbf16ps too (head sizes 64, 96, 128), the
    softmax's weights enter it rounded to bfloat16 (the sum that divides stays exact)."""
    rows = _rows(committed, 9, np.random.default_rng(committed + head))
    g = torch.Generator().manual_seed(head)
    kv = torch.randn(2, HKV, TMAX, head, generator=g).bfloat16()  # (2, H_kv, T_max, D)
    q = torch.randn(H, len(rows), head, generator=g)  # (H, T, D) float32
    tables = _extra(make_plan(committed, rows, torch.device("cpu"), lib))
    got = native.native_attention(lib, q, kv, committed, *tables).view(len(rows), H, head)
    f32 = native.native_attention(lib, q, kv.float(), committed, *tables).view(len(rows), H, head)
    assert torch.allclose(got, f32, rtol=1e-2, atol=1e-2)
    rounded = lib.dw_attention_dpbf16() == 1 and head in (64, 80, 96, 128)
    pairs = native.attention_pv16(lib) and head in (64, 96, 128)  # p rounded to bfloat16
    for i, r in enumerate(rows):
        keys = [*range(committed), *r]
        for h in range(H):
            qs = q[h, i] * head**-0.5  # as native_attention scales it, in float32
            qs = (qs.bfloat16() if rounded else qs).double()
            k, v = kv[0, h // (H // HKV), keys].double(), kv[1, h // (H // HKV), keys].double()
            e = torch.exp((k @ qs) - (k @ qs).max())  # the softmax's numerators
            want = ((e.bfloat16().double() if pairs else e) @ v) / e.sum()
            # with pairs, a weight within float32 rounding of a bfloat16 midpoint may
            # round the other way: one bfloat16 step of the largest weight, at most
            flip = 2.0**-8 * float(e.max() / e.sum()) * float(v.abs().max()) if pairs else 0.0
            assert torch.allclose(got[i, h].double(), want, rtol=1e-4, atol=1e-5 + flip), (i, h)


@pytest.mark.parametrize(
    "kv_dtype, head",
    [(torch.float32, D), (torch.bfloat16, D), (torch.bfloat16, 80), (torch.bfloat16, 96),
     (torch.bfloat16, 128)],
    ids=["f32", "bf16", "bf16-d80", "bf16-d96", "bf16-d128"],
)
@pytest.mark.parametrize("committed", [200, 203])
@pytest.mark.parametrize("pv16", [1, 0], ids=["pv16", "pv32"])
def test_a_row_has_the_same_bits_alone_and_in_any_tree_at_any_thread_count(
    lib, kv_dtype, head, committed, pv16
):
    """Row i of a tree verify == the plain one-row step at the same position: committed
    c + depth, its own slot as the one extra key; with 1 and 2 threads, over a float32
    and a bfloat16 cache (whose rows go through p @ V in groups of up to 3, or 4 with
    vdpbf16ps: 24 rows cover every group size; both p @ V paths); at 203 committed keys
    a block of 8 scores (``dw_sum8x8`` on the AVX2 path) holds committed and tree keys
    together, and an odd key count pairs the last key with a zero."""
    rng = np.random.default_rng(7)
    rows = _rows(committed, 24, rng)
    q, kv = _case(1, committed, rows, head)
    kv = kv.to(kv_dtype)
    # The plain step of row i sees the same logical keys at slots 0..c+depth: lay them out
    # that way in a second cache and query it alone.
    old, was = torch.get_num_threads(), lib.dw_attention_pv16(-1)
    lib.dw_attention_pv16(pv16)
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            tree = native.native_attention(
                lib, q, kv, committed, *_extra(make_plan(committed, rows, torch.device("cpu"), lib))
            )
            for i, r in enumerate(rows):
                plain_kv = kv.clone()
                plain_kv[:, :, committed : committed + len(r)] = kv[:, :, r]
                pos = committed + len(r) - 1
                plan = make_plan(pos, [[pos]], torch.device("cpu"), lib)
                alone = native.native_attention(lib, q[:, i : i + 1], plain_kv, pos, *_extra(plan))
                assert torch.equal(alone[0], tree[i]), f"row {i} ({threads} threads)"
    finally:
        torch.set_num_threads(old)
        lib.dw_attention_pv16(was)


def test_padding_rows_copy_row_zero(lib):
    rows = [[10], [10, 11]]
    q, kv = _case(3, 10, rows)
    q = torch.cat([q, q[:, :1]], dim=1)  # a padding row
    out = native.native_attention(lib, q, kv, 10, *_extra(make_plan(10, rows, torch.device("cpu"), lib)))
    assert out.shape == (3, H * D) and torch.equal(out[2], out[0])


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("DRAFTWISE_NATIVE", "0")
    assert native.attention_lib() is None


def test_the_build_lands_in_the_draftwise_cache(lib, tmp_path, monkeypatch):
    """Built once per machine into cache_dir()/kernels (the one cache-dir rule of every
    layer: $DRAFTWISE_CACHE_DIR, else $XDG_CACHE_HOME/draftwise), temp file then rename."""
    monkeypatch.delenv("DRAFTWISE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    out = native._build(native._compiler())
    assert out is not None and out.parent == tmp_path / "draftwise" / "kernels"
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temp file left
    assert native._build(native._compiler()) == out  # reused, not rebuilt


@pytest.mark.parametrize("d", [40, 64, 96, 128, 256])
def test_every_head_size_agrees_with_a_float64_softmax(lib, d):
    """Head sizes 64, 80, 96 and 128 take the vectorised path, others the plain C
    loop: both equal softmax(q k^T / sqrt(d)) v over the row's key list."""
    rng = np.random.default_rng(d)
    committed = 37
    rows = _rows(committed, 9, rng)
    g = torch.Generator().manual_seed(d)
    kv = torch.randn(2, HKV, 128, d, generator=g)
    q = torch.randn(H, len(rows), d, generator=g).bfloat16()
    plan = make_plan(committed, rows, torch.device("cpu"), lib)
    got = native.native_attention(lib, q, kv, committed, *_extra(plan)).view(len(rows), H, d)
    for i, r in enumerate(rows):
        keys = [*range(committed), *r]
        for h in range(H):
            k, v = kv[0, h // (H // HKV), keys].double(), kv[1, h // (H // HKV), keys].double()
            p = torch.softmax(k @ q[h, i].double() * d**-0.5, dim=0)
            assert torch.allclose(got[i, h].double(), p @ v, rtol=1e-4, atol=1e-5), (i, h)


def test_every_kernel_source_ships_in_the_package():
    """The build reads SOURCES and HEADERS: an installed wheel must carry each of them
    (pyproject's package-data), or the kernels silently fall back to torch."""
    import fnmatch
    from pathlib import Path

    import tomllib

    root = Path(native.__file__).resolve().parents[4]  # cpu, cuda, backends, draftwise
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        pytest.skip("not a source checkout")
    globs = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]["draftwise"]
    pkg = root / "draftwise"
    for f in (*native.SOURCES, *native.HEADERS):
        rel = f.relative_to(pkg).as_posix()
        assert any(fnmatch.fnmatch(rel, g) for g in globs), f"{rel} is not package data"


@pytest.mark.parametrize("head", [64, 128])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_grouped_queries_have_the_bits_of_one_row_head_a_task(lib, kv_dtype, head):
    """The AVX2 path verifies two rows or more of head size 64 or 128 with a key/value
    head's queries in groups (``group_rows8``: each key widened once for 2 or 4
    queries). Every query must keep the bits of the (row, head) tasks: committed keys
    that end inside a block of 8 and in whole blocks, 1 to 13 tree rows (groups of 4, 2
    and a single query) and a prompt's causal chunk (each row's keys run on from the
    committed ones: shared with its group up to its own end), 1 and 2 threads."""
    if not lib.dw_attention_group(-1):
        pytest.skip("this build has no AVX2 grouped path (AVX-512, or no AVX2)")
    old = torch.get_num_threads()
    try:
        cases = itertools.product((0, 5, 8, 203, 517), (1, 2, 3, 5, 13), (0, 1))
        for committed, n, causal in cases:
            if causal:  # row i: slots committed .. committed + i (the fused prefill's plan)
                rows = [list(range(committed, committed + i + 1)) for i in range(n)]
            else:
                rows = _rows(committed, n, np.random.default_rng(committed + n))
            q, kv = _case(committed + n, committed, rows, head)
            kv = kv.to(kv_dtype)
            tables = _extra(make_plan(committed, rows, torch.device("cpu"), lib))
            for threads in (1, 2):
                torch.set_num_threads(threads)
                got = {}
                for grouped in (0, 1):
                    lib.dw_attention_group(grouped)
                    got[grouped] = native.native_attention(lib, q, kv, committed, *tables)
                assert torch.equal(got[0], got[1]), (committed, n, causal, threads)
    finally:
        lib.dw_attention_group(1)
        torch.set_num_threads(old)
