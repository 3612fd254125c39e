"""The ``4bit`` mode: a Q4 GGUF's own codes, the 4-bit kernel's row invariance, and the
mode end to end on the real default model (speculative output == plain, greedy)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from draftwise.backends.cuda.cpu import native  # noqa: E402
from draftwise.backends.cuda.cpu.int4 import (  # noqa: E402
    Int4Weight,
    int4_available,
    linear,
    pack_native,
    q8_of_split,
    quantize_rtn,
)
from draftwise.backends.gguf_q4 import GROUP, HEAD, dequantize, split_q8  # noqa: E402
from draftwise.errors import DraftwiseError  # noqa: E402

pytestmark = pytest.mark.skipif(not int4_available(), reason="no CPU int4 kernel here")
KERNELS = [
    "torch",
    pytest.param(
        "native",
        marks=pytest.mark.skipif(
            native.int4_lib() is None, reason="no compiled int4 kernel (C compiler, AVX-512 VNNI or AVX2 and FMA)"
        ),
    ),
]

# SmolLM2-135M's fused linears: q/k/v, o, gate/up, down; the split Q8_0 head
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (49152, 1152)]


def _random_q4(rng: np.random.Generator, n: int, k: int):
    codes = rng.integers(0, 16, (n, k)).astype(np.uint8)
    scale = (rng.random((n, k // GROUP)) * 0.02 + 1e-3).astype(np.float32)
    zero = (rng.standard_normal((n, k // GROUP)) * 0.01).astype(np.float32)
    return codes, scale, zero


def _quantised(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """The activations the kernel multiplies: torch's takes them as they are; the native
    one quantises each row's blocks of 32 to int8 (``csrc/int4.c``): d = max|x| / 127,
    q = round-half-even(x * (127 / max|x|)), computed in float32."""
    if w.lib is None:
        return x.float()
    t, k = x.shape
    v = x.float().numpy().reshape(t, k // GROUP, GROUP)
    amax = np.abs(v).max(axis=2, keepdims=True)  # (T, B, 1)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), np.float32(0))
    q = np.rint((v * inv.astype(np.float32)).astype(np.float32))
    assert np.abs(q).max(initial=0) <= 127
    d = (amax / np.float32(127)).astype(np.float32)
    return torch.from_numpy((q.astype(np.float64) * d).reshape(t, k))


def _reference(w: Int4Weight, q4) -> np.ndarray:
    """The dense weights each kernel multiplies by: torch's rounds scale and zero to
    bfloat16, the native one scale and min (zero - 8 scale) to float16."""
    codes, scale, zero = q4
    n = codes.shape[0]
    if w.lib is None:
        sz = w.scales_zeros.float().numpy()[:, :n]  # (K/32, N, 2)
        return dequantize((codes, sz[..., 0].T.copy(), sz[..., 1].T.copy()))
    s16 = scale.astype(np.float16).astype(np.float64)
    m16 = (zero.astype(np.float64) - 8 * scale).astype(np.float16).astype(np.float64)
    return (np.repeat(s16, GROUP, 1) * codes + np.repeat(m16, GROUP, 1)).astype(np.float32)


@pytest.mark.parametrize("kernel", KERNELS)
def test_matmul_equals_dequantised_weights(kernel):
    rng = np.random.default_rng(0)
    q4 = _random_q4(rng, 192, 576)
    w = Int4Weight.from_codes(*q4, kernel=kernel)
    assert (w.lib is not None) == (kernel == "native")
    x = torch.randn(5, 576).bfloat16()
    ref = (_quantised(x, w).double() @ torch.from_numpy(_reference(w, q4)).double().T).float()
    got = linear(x, w).float()
    assert got.shape == (5, 192)
    # bfloat16 outputs: within a few of their roundings (2^-8 relative) of each output
    assert torch.allclose(got, ref, rtol=1e-2, atol=1e-3 * ref.abs().max().item())
    # and the quantisation of the activations moves the product by little
    exact = (x.double() @ torch.from_numpy(_reference(w, q4)).double().T).float()
    assert torch.allclose(got, exact, rtol=5e-2, atol=2e-2 * exact.abs().max().item())
    b = torch.randn(192).bfloat16()
    assert torch.equal(linear(x, w, b), linear(x, w) + b)


def test_native_tiles_hold_each_code_where_the_kernel_reads_it():
    """pack_native's layout, checked against its docstring code by code."""
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 16, (32, 64)).astype(np.uint8)
    scale = rng.random((32, 2)).astype(np.float32)
    zero = rng.random((32, 2)).astype(np.float32)
    t = pack_native(codes, scale, zero).numpy()  # (2, 2, 320)
    assert t.shape == (2, 2, 320)
    for n in (0, 5, 17, 31):
        for kk in (0, 1, 2, 3, 4, 6, 7, 8, 13, 31, 33, 63):
            j, i, b, r = n // 16, n % 16, kk // 32, kk % 32
            g, half, e = r // 8, (r % 8) // 4, r % 4
            byte = t[j, b, 64 * g + 4 * i + e]
            assert (byte >> (4 * half)) & 15 == codes[n, kk]
        s16 = t[n // 16, 0, 256:288].copy().view(np.float16)[n % 16]
        m16 = t[n // 16, 0, 288:320].copy().view(np.float16)[n % 16]
        assert s16 == np.float16(scale[n, 0])
        assert m16 == np.float16(np.float64(zero[n, 0]) - 8 * np.float64(scale[n, 0]))


def test_native_packing_refuses_scales_beyond_float16():
    codes = np.zeros((16, 32), np.uint8)
    with pytest.raises(DraftwiseError, match="float16"):
        pack_native(codes, np.full((16, 1), 1e6, np.float32), np.zeros((16, 1), np.float32))


def test_an_unknown_kernel_is_refused():
    with pytest.raises(DraftwiseError, match="'gpu'"):
        Int4Weight.from_codes(*_random_q4(np.random.default_rng(0), 16, 32), kernel="gpu")


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_a_row_gets_the_same_bits_for_every_row_count(n, k, kernel):
    """What the batch-invariant mode relies on: row r of an M-row matmul is bit-equal to
    the same row computed alone, for M = 1..64 (2 torch threads, as CI and users run)."""
    rng = np.random.default_rng(n + k)
    w = Int4Weight.from_codes(*_random_q4(rng, n, k), kernel=kernel)
    x = torch.randn(64, k).bfloat16()
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        alone = torch.cat([w(x[i : i + 1]) for i in range(64)])  # (64, N)
        for m in (2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 64):
            assert torch.equal(w(x[:m]), alone[:m]), f"rows differ inside an {m}-row matmul"
        if kernel == "native":  # one thread per output tile: the thread count changes nothing
            torch.set_num_threads(1)
            assert torch.equal(w(x[:16]), alone[:16])
    finally:
        torch.set_num_threads(old)


def test_quantize_rtn_recovers_grid_weights_and_bounds_the_error():
    rng = np.random.default_rng(1)
    codes, scale, zero = _random_q4(rng, 8, 64)
    codes[:, ::GROUP] = 0  # every block spans the whole code range: its grid is recoverable
    codes[:, 1::GROUP] = 15
    w = torch.from_numpy(dequantize((codes, scale, zero)))
    c2, s2, z2 = quantize_rtn(w)
    assert np.array_equal(c2, codes)
    assert np.allclose(s2, scale, rtol=1e-5) and np.allclose(z2, zero, atol=1e-6)
    dense = torch.randn(16, 96)
    c, s, z = quantize_rtn(dense)
    err = np.abs(dequantize((c, s, z)) - dense.numpy()).reshape(16, 3, GROUP)
    assert (err <= s[..., None] / 2 + 1e-6).all()
    with pytest.raises(DraftwiseError, match="multiples of 32"):
        quantize_rtn(torch.zeros(4, 40))


@pytest.mark.parametrize("kernel", KERNELS)
def test_output_sizes_not_a_multiple_of_16_are_padded(kernel):
    rng = np.random.default_rng(5)
    q4 = _random_q4(rng, 100, 64)
    w = Int4Weight.from_codes(*q4, kernel=kernel)
    x = torch.randn(7, 64).bfloat16()
    y = w(x)
    assert y.shape == (7, 100)
    ref = _quantised(x, w).float() @ torch.from_numpy(_reference(w, q4)).T
    assert torch.allclose(y.float(), ref, rtol=1e-2, atol=1e-3 * ref.abs().max().item())
    assert torch.equal(w(x[:1]), y[:1])


def test_from_codes_refuses_bad_shapes():
    with pytest.raises(DraftwiseError, match="multiple of 32"):
        Int4Weight.from_codes(np.zeros((4, 40), np.uint8), np.zeros((4, 1)), np.zeros((4, 1)))


def test_gguf_codes_are_the_converted_weights(default_model_dir):
    """Every Q4_1 linear of the embedded GGUF, read as codes, dequantises to the float32
    weights the converter wrote (q/k rows put back in Hugging Face order)."""
    from safetensors.numpy import load_file

    from draftwise.backends.gguf_q4 import gguf_source, read_q4_linears

    src = gguf_source(default_model_dir)
    assert src is not None and src.suffix == ".gguf"
    q4 = read_q4_linears(src)
    assert len(q4) == 30 * 7 + 1
    dense = load_file(str(default_model_dir / "model.safetensors"))
    dense[HEAD] = dense["model.embed_tokens.weight"]  # tied: the Q8_0 token_embd
    assert q4[HEAD][0].shape == (49152, 2 * 576)  # split into two 4-bit halves
    for name, codes in q4.items():
        want = dense[name]
        assert np.allclose(dequantize(codes, want.shape[1]), want, rtol=1e-6, atol=1e-7), name


def test_split_q8_is_exact():
    """The two 4-bit halves hold the Q8_0 weights exactly (in real arithmetic: their
    float32 sum differs from d * q8 by rounding only)."""
    rng = np.random.default_rng(3)
    q8 = rng.integers(-128, 128, (6, 64)).astype(np.int8)
    d = (rng.random((6, 2)) * 0.01).astype(np.float32)
    codes, scale, zero = split_q8(q8, d)
    assert codes.shape == (6, 128) and codes.max() <= 15
    hi = codes[:, :64].astype(np.int64) - 8
    lo = codes[:, 64:].astype(np.int64)
    assert np.array_equal(16 * hi + lo, q8.astype(np.int64))  # the integer identity
    want = (q8.reshape(6, 2, 32) * d[..., None]).reshape(6, 64)
    assert np.allclose(dequantize((codes, scale, zero), 64), want, rtol=1e-6, atol=1e-9)


def test_wrong_codes_are_refused(default_model_dir, monkeypatch):
    """Codes that do not dequantise to the checkpoint (another GGUF, rows out of order)
    are refused at load in one line, not computed with."""
    from draftwise.backends.cuda import backend as be_mod
    from draftwise.backends.cuda.backend import TorchBackend

    real = be_mod.read_q4_linears

    def swapped(path):
        q4 = real(path)
        name = "model.layers.0.self_attn.k_proj.weight"
        c, s, z = q4[name]
        q4[name] = (c[::-1].copy(), s[::-1].copy(), z[::-1].copy())
        return q4

    monkeypatch.setattr(be_mod, "read_q4_linears", swapped)
    with pytest.raises(DraftwiseError, match="k_proj.*do not match"):
        TorchBackend.from_pretrained(default_model_dir, dtype="4bit", device="cpu", max_cache_len=64)


@pytest.mark.slow
@pytest.mark.serial  # at the machine's threads: the kernels' split over threads as users run it
def test_4bit_speculative_output_equals_plain(default_model_dir):
    """Greedy ``auto`` and ``cacheback`` == ``none`` in the 4bit mode (invariant by default
    on CPU), on our own prompts; and the mode really computes with 4-bit weights."""
    import draftwise
    from tests.prompts import OWN_PROMPTS

    model = draftwise.load(default_model_dir, backend="torch", dtype="4bit")
    assert model.backend.name == "torch-cpu-4bit-invariant"
    assert isinstance(model.backend.model.layers[0].w13, Int4Weight)
    head = model.backend.model.head_q
    assert head is not None
    # the Q8_0 head: two 4-bit halves for torch's kernel, Q8_0 tiles for the native one
    if head.lib is None:
        assert head.repeat == 2
    else:
        assert head.repeat == 1 and head.packed.shape[-1] == 576
    for text in OWN_PROMPTS[:3]:
        plain = draftwise.generate(model, text, max_tokens=48, drafter="none")
        for spec in ("cacheback", "auto"):
            assert draftwise.generate(model, text, max_tokens=48, drafter=spec) == plain, spec


@pytest.mark.slow
def test_4bit_seeded_sampling_equals_plain(default_model_dir):
    """At temperature 0.8 / top-p 0.95 the same seed gives ``auto`` the tokens of ``none``
    in the 4bit mode (every emitted token drawn with its position's uniform)."""
    import draftwise
    from tests.prompts import OWN_PROMPTS

    model = draftwise.load(default_model_dir, backend="torch", dtype="4bit")
    kw = dict(max_tokens=40, temp=0.8, top_p=0.95)
    for seed, text in enumerate(OWN_PROMPTS[:2]):
        runs = {}
        for spec in ("none", "auto"):
            last = None
            for r in draftwise.stream_generate(model, text, drafter=spec, seed=seed, **kw):
                last = r
            runs[spec] = last.token_ids
        assert len(runs["none"]) > 0 and runs["auto"] == runs["none"]


def test_q8_of_split_recovers_the_q8_codes():
    rng = np.random.default_rng(11)
    q8 = rng.integers(-128, 128, (32, 64)).astype(np.int8)
    d = rng.random((32, 2)).astype(np.float16).astype(np.float32)
    back = q8_of_split(*split_q8(q8, d))
    assert back is not None
    assert np.array_equal(back[0], q8) and np.array_equal(back[1], d)
    codes, scale, zero = split_q8(q8, d)
    assert q8_of_split(codes, scale, zero + 1) is None  # not a split: stays 4-bit


@pytest.mark.skipif(native.int4_lib() is None, reason="no compiled int4 kernel (C compiler, AVX-512 VNNI or AVX2 and FMA)")
def test_native_q8_head_equals_its_weights_and_is_row_invariant():
    """A split Q8_0 head runs as Q8_0 in the native kernel: the product of the dense
    weights d * q8 and the quantised activations (to bfloat16 output rounding), each row's
    bits independent of the rows beside it and of the thread count; and the tiles hold
    each code, scale and code sum where the kernel reads them."""
    rng = np.random.default_rng(12)
    q8 = rng.integers(-128, 128, (160, 576)).astype(np.int8)
    d = (rng.random((160, 18)) * 0.01).astype(np.float16).astype(np.float32)
    w = Int4Weight.from_codes(*split_q8(q8, d), repeat=2, kernel="native")
    assert w.packed.shape == (10, 18, 576) and w.repeat == 1
    t = w.packed.numpy()
    for n, kk in ((0, 0), (3, 5), (17, 37), (159, 575)):
        j, i, b, r = n // 16, n % 16, kk // 32, kk % 32
        assert t[j, b, 64 * (r // 4) + 4 * i + r % 4].view(np.int8) == q8[n, kk]
        assert t[j, b, 512:544].copy().view(np.float16)[i] == np.float16(d[n, b])
        assert t[j, b, 544:576].copy().view(np.int16)[i] == q8[n, 32 * b : 32 * b + 32].astype(int).sum()
    x = torch.randn(40, 576).bfloat16()
    dense = torch.from_numpy(np.repeat(d, GROUP, 1) * q8.astype(np.float32))  # (N, K)
    ref = (_quantised(x, w).double() @ dense.double().T).float()
    y = w(x)
    assert torch.allclose(y.float(), ref, rtol=1e-2, atol=1e-3 * ref.abs().max().item())
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        alone = torch.cat([w(x[i : i + 1]) for i in range(40)])
        for m in (2, 7, 8, 9, 16, 40):
            assert torch.equal(w(x[:m]), alone[:m])
        torch.set_num_threads(1)
        assert torch.equal(w(x[:9]), alone[:9])
    finally:
        torch.set_num_threads(old)


def _fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 fused multiply-add: the product is exact in float64 and the sum is rounded
    twice (to float64, then float32), which differs from one rounding only on a float32
    halfway point within 2^-29 of the float64 sum: never, for this file's seeds."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)


def _bf16_bits(v: np.ndarray) -> np.ndarray:
    """vcvtneps2bf16: round to nearest even, zero and denormals to a signed zero."""
    u = v.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    tiny = (u & 0x7F800000) == 0
    return np.where(tiny, (u >> 16) & 0x8000, r).astype(np.uint16)


def _reference_bits(x: torch.Tensor, codes, d16, m16, q8: bool) -> np.ndarray:
    """``csrc/int4.c``'s arithmetic replayed in numpy, operation for operation: each row's
    blocks of 32 quantised (d_x = max|x| / 127, q_x = rint(x * (127 / max|x|)), s_x =
    d_x * sum q_x, float32), the exact integer block sums, then per block
    ``tot = fma(sum, d * d_x, tot)`` and (4-bit) ``tot = fma(s_x, m, tot)``, rounded to
    bfloat16 bits as vcvtneps2bf16."""
    t, k = x.shape
    nb = k // GROUP
    v = x.float().numpy().reshape(t, nb, GROUP)
    amax = np.abs(v).max(axis=2)  # (T, B)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, np.float32(1)), np.float32(0))
    q = np.rint(v * inv[..., None].astype(np.float32)).astype(np.int64)  # (T, B, 32)
    dx = (amax / np.float32(127)).astype(np.float32)
    sx = (dx * q.sum(axis=2).astype(np.float32)).astype(np.float32)
    w = codes.astype(np.int64).reshape(codes.shape[0], nb, GROUP)  # (N, B, 32)
    sums = np.einsum("tbk,nbk->tnb", q, w).astype(np.float32)  # exact, (T, N, B)
    tot = np.zeros((t, codes.shape[0]), np.float32)
    for b in range(nb):
        tot = _fma32(sums[:, :, b], (d16[None, :, b] * dx[:, b : b + 1]).astype(np.float32), tot)
        if not q8:
            tot = _fma32(np.broadcast_to(sx[:, b : b + 1], tot.shape), m16[None, :, b], tot)
    return _bf16_bits(tot)


@pytest.mark.skipif(native.int4_lib() is None, reason="no compiled int4 kernel (C compiler, AVX-512 VNNI or AVX2 and FMA)")
def test_the_native_kernel_gives_its_documented_bits():
    """Both builds of the kernel (AVX-512 VNNI, and AVX2 where that is missing) compute
    the arithmetic ``csrc/int4.c`` documents: checked against a numpy replay to the last
    bit of the bfloat16 outputs, 4-bit and Q8 tiles, 1..9 rows. (A float32 rounding inside
    the sum, such as a multiply-add left unfused, rarely reaches a bfloat16 output: that
    much this cannot see; a wrong quantisation, code, scale or sum it does.)"""
    rng = np.random.default_rng(21)
    n, k = 48, 128
    codes, scale, zero = _random_q4(rng, n, k)
    w = Int4Weight.from_codes(codes, scale, zero, kernel="native")
    d16 = scale.astype(np.float16).astype(np.float32)
    m16 = (zero.astype(np.float64) - 8 * scale.astype(np.float64)).astype(np.float16).astype(np.float32)
    q8 = rng.integers(-128, 128, (n, k)).astype(np.int8)
    dq = (rng.random((n, k // GROUP)) * 0.01).astype(np.float16).astype(np.float32)
    wq = Int4Weight.from_codes(*split_q8(q8, dq), repeat=2, kernel="native")
    assert wq.repeat == 1  # run as Q8 tiles
    x = (torch.randn(9, k) * torch.rand(9, 1) * 4).bfloat16()
    x[3, :GROUP] = 0  # an all-zero block: d_x = 0
    for rows in (1, 4, 9):
        got = linear(x[:rows], w).view(torch.int16).numpy().view(np.uint16)
        assert np.array_equal(got, _reference_bits(x[:rows], codes, d16, m16, q8=False))
        got = linear(x[:rows], wq).view(torch.int16).numpy().view(np.uint16)
        assert np.array_equal(got, _reference_bits(x[:rows], q8, dq, None, q8=True))
