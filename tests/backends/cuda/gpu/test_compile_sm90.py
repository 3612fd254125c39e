"""The row-invariant kernels compile for Hopper (sm_90) here, without a GPU, through
Triton's own ``ptxas``, and every tile the step may choose fits a Hopper SM's shared
memory: a lent H100 once spent its first call on a 64-row tile table whose gate/up tile
wanted 256 KiB (the limit is 227 KiB). Pointers are declared 16-byte aligned, as the
JIT specialises real tensors, so the pipelined (shared-memory) loads are what compiles."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")

HOPPER_SMEM = 232448  # bytes a block may take on an H100/H200 (227 KiB)


def _compile(fn, ptrs: dict[str, str], consts: dict, aligned: tuple[str, ...] = (), **options):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    floats = {"scale", "cap", "eps"}
    sig = {n: ptrs.get(n) or ("constexpr" if n in consts else "fp32" if n in floats else "i32") for n in names}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in names if n in ptrs or n in aligned}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(n),): v for n, v in consts.items()},
                    attrs=attrs)
    try:
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    except RuntimeError as exc:  # no ptxas in this Triton build
        if "ptxas" in str(exc).lower() and "not found" in str(exc).lower():
            pytest.skip(f"Triton cannot assemble for sm_90 here: {exc}")
        raise


MM_PTRS = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "res_ptr": "*bf16", "bias_ptr": "*bf16",
           "g_ptr": "*bf16", "ws_ptr": "*fp32"}


# the default tiles, the 16-row ones, the tile tables device_check.py tries, split-K
@pytest.mark.parametrize("bm,tiles,split", [("64", "", "0"), ("16", "", "0"), ("64", "64,128,4,4", "0"),
                                            ("64", "64,128,8,3", "0"), ("64", "", "2"), ("64", "", "4"),
                                            ("64", "32,128,4,6", "0")])
def test_every_gemm_tile_of_the_8b_shape_fits_in_shared_memory(bm, tiles, split, monkeypatch):
    from draftwise.backends.cuda.gpu import rowinv_kernels as kern
    from draftwise.backends.cuda.gpu.rowinv import config

    monkeypatch.setenv("DRAFTWISE_MM_BM", bm)
    monkeypatch.setenv("DRAFTWISE_MM_CONFIG", tiles)
    monkeypatch.setenv("DRAFTWISE_MM_SPLIT", split)
    # Llama-3.1-8B: q/k/v, o, gate/up (the GLU: two weight tiles a step), down, the head
    layers = {(6144, 4096, 0), (4096, 4096, 0), (14336, 4096, 1), (4096, 14336, 0), (128256, 4096, 0)}
    seen = set()
    for n, k, act in sorted(layers):
        c = config(n, k, sms=132)
        key = (c.bn, c.bk, c.warps, c.stages, c.bm, c.split, act, n == 4096)
        if key in seen:
            continue
        seen.add(key)
        # the residual-adding GEMMs, and those reading an RMSNorm's input (DRAFTWISE_NORM_IN_GEMM)
        consts = dict(K=k, A_HEADS=False, HD=128, REP=4, HAS_BIAS=False, ACT=act, HAS_RES=act == 0 and n == 4096,
                      NORM=n != 4096, EVEN_K=True, UPCAST=False, BM=c.bm, BN=c.bn, BK=c.bk, SPLIT=c.split,
                      PDL=False)
        out = _compile(kern._mm, MM_PTRS, consts, aligned=("N", "M", "sxm", "swn", "som", "srm", "up_off"),
                       num_warps=c.warps, num_stages=c.stages)
        assert out.metadata.shared <= HOPPER_SMEM, (key, out.metadata.shared)
        if c.split > 1:
            red = {k: consts[k] for k in ("K", "HAS_BIAS", "ACT", "HAS_RES", "NORM", "SPLIT", "PDL")}
            _compile(kern._mm_reduce, {"ws_ptr": "*fp32", "out_ptr": "*bf16", "res_ptr": "*bf16",
                                       "bias_ptr": "*bf16"}, {**red, "BM": 16, "BN": 64},
                     aligned=("N", "M", "som", "srm"))
    if bm == "64" and not tiles and split == "0":  # the 16-row tiles of calls up to 16 rows
        for act, wide in ((1, True), (0, True), (1, False)):  # gate/up, the head (DRAFTWISE_MM_WIDE)
            c = config(14336 if act else 128256, 4096, sms=132)
            consts = dict(K=4096, A_HEADS=False, HD=128, REP=4, HAS_BIAS=False, ACT=act, HAS_RES=False,
                          NORM=False, EVEN_K=True, UPCAST=False, BM=16, BN=64 if wide else c.bn, BK=c.bk, SPLIT=1,
                          PDL=wide)
            out = _compile(kern._mm, MM_PTRS, consts, aligned=("N", "M", "sxm", "swn", "som", "srm", "up_off"),
                           num_warps=c.warps, num_stages=c.stages, launch_pdl=wide)
            assert out.metadata.shared <= HOPPER_SMEM, (act, wide, out.metadata.shared)
            assert ("griddepcontrol.wait" in out.asm["ptx"]) == wide  # DRAFTWISE_PDL's wait
    if split != "0":  # the 8B shape's o and down projections do split
        assert config(4096, 4096, 132).split > 1 and config(4096, 14336, 132).split > 1


@pytest.mark.parametrize("split,pipe,bounded,pdl", [(False, 0, True, False), (True, 0, True, False),
                                                    (True, 2, True, True), (False, 3, True, False),
                                                    (True, 2, False, False)])
def test_the_attention_kernels_compile(split, pipe, bounded, pdl):
    from draftwise.backends.cuda.gpu import rowinv_kernels as kern

    s = 8256
    ptrs = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "bias_ptr": "*fp32", "o_ptr": "*bf16",
            "slots_ptr": "*i64", "part_ptr": "*fp32"}
    consts = dict(S=s, D=128, REP=4, BD=128, BQ=16, BS=64, CHUNK=256 if split else s, SOFTCAP=False,
                  UPCAST=False, BOUNDED=bounded, SPLIT=split, PIPE=pipe, PDL=pdl)
    assert _compile(kern._attn, ptrs, consts).metadata.shared <= HOPPER_SMEM
    if split:
        consts = dict(S=s, D=128, REP=4, BD=128, BQ=16, CHUNK=256, NC=-(-s // 256), BOUNDED=True, PDL=pdl)
        _compile(kern._attn_combine, {"part_ptr": "*fp32", "o_ptr": "*bf16", "slots_ptr": "*i64"}, consts)


def test_the_rmsnorm_kernel_compiles():
    from draftwise.backends.cuda.gpu import rowinv_kernels as kern

    _compile(kern._rmsnorm, {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16"},
             dict(C=4096, BC=4096, PDL=True), aligned=("sx", "so"), launch_pdl=True)
