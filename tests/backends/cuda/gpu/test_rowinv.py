"""``gpu/rowinv.py``: the fixed step on row-invariant Triton kernels, on CPU tensors under
Triton's interpreter (``TRITON_INTERPRET=1``, which Triton reads when it is imported, so
the tests run in a child pytest started with it set). Each kernel against torch, the
whole step against the torch fixed step for four families, a row's logits bit-equal in
every bucket, and greedy drafting through the kernels equal to plain decoding. On a GPU
``test_on_gpu.py`` runs the same step compiled."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip(
    "triton", reason="Triton is not installed (pip install triton; scripts/setup.sh --test does)"
)

import torch.nn.functional as F  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
ROOT = Path(__file__).resolve().parents[4]


@pytest.mark.skipif(INTERPRETED, reason="this is the parent run")
def test_the_kernels_under_the_interpreter(request):
    """Runs this file again with the interpreter on (a child process: Triton reads the
    switch at import), with this run's ``-m`` (the default run leaves the ``full``
    duplicates out). Its failures show here."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "DRAFTWISE_F32_KERNEL": "0"}
    marks = request.config.getoption("markexpr")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            *(["-m", marks] if marks else []),
            str(Path(__file__).relative_to(ROOT)),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert " passed" in last and ("skipped" not in last or "1 skipped" in last), (
        last
    )  # only the parent (the deselected duplicates are not "skipped")


inner = pytest.mark.skipif(not INTERPRETED, reason="runs in the child process (TRITON_INTERPRET=1)")


def _kernels(act: str = "silu", heads: int = 4, kv_heads: int = 2, d: int = 16, rot: int = 16):
    from types import SimpleNamespace as NS

    from draftwise.backends.cuda.gpu.rowinv import RowInvariant

    cfg = NS(act=act, n_heads=heads, n_kv_heads=kv_heads, head_dim=d, rot_dim=rot)
    return RowInvariant(NS(cfg=cfg, device=torch.device("cpu")), interpret=True)


@inner
@pytest.mark.parametrize("k", [64, 72])  # 72: K not a multiple of the K step (masked)
def test_the_gemm_and_its_epilogues_compute_what_torch_does(k):
    torch.manual_seed(0)
    ri = _kernels()
    x, w, res, b = torch.randn(5, k), torch.randn(40, k), torch.randn(5, 40), torch.randn(40)
    torch.testing.assert_close(ri.mm(x, w), x @ w.T, atol=2e-5, rtol=1e-5)
    from draftwise.backends.cuda.gpu.rowinv import MMConfig

    for bm in (32, 64):  # DRAFTWISE_MM_BM's taller tiles: 5 rows in one, masked
        tall = MMConfig(bn=16, bk=32, bm=bm)
        torch.testing.assert_close(ri.mm(x, w, cfg=tall), x @ w.T, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(ri.mm(x[:1], w, cfg=tall), x[:1] @ w.T, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(
        ri.mm(x, w, bias=b, res=res), res + x @ w.T + b, atol=2e-5, rtol=1e-5
    )
    w13 = torch.randn(80, k)
    g, u = (x @ w13.T).chunk(2, -1)
    torch.testing.assert_close(ri.mm(x, w13, glu=True), F.silu(g) * u, atol=1e-4, rtol=1e-5)
    gelu = _kernels(act="gelu_pytorch_tanh")
    torch.testing.assert_close(
        gelu.mm(x, w13, glu=True), F.gelu(g, approximate="tanh") * u, atol=1e-4, rtol=1e-5
    )


@inner
@pytest.mark.parametrize("split", [2, 4])
def test_split_k_computes_what_torch_does_and_a_row_keeps_its_bits(split, monkeypatch):
    """``DRAFTWISE_MM_SPLIT``: K in fixed parts walked side by side, added in order by
    ``_mm_reduce`` with every epilogue (bias and residual, the GLU, the norm inside,
    attention's grouped layout); a row alone computes bit-equal to the same row among
    seven others (the split depends on (N, K) only)."""
    from draftwise.backends.cuda.gpu.rowinv import MMConfig, config

    monkeypatch.setenv("DRAFTWISE_MM_SPLIT", "16")
    monkeypatch.setenv("DRAFTWISE_MM_CONFIG", "16,16,4,4")
    assert config(40, 128).split == 4 and config(40, 64).split == 2  # it does split here
    torch.manual_seed(2)
    ri = _kernels()
    eps = 1e-5
    ri.model.cfg.norm_eps = eps
    cfg = MMConfig(bn=16, bk=16, split=split)
    x, w, res, b = torch.randn(8, 128), torch.randn(40, 128), torch.randn(8, 40), torch.randn(40)
    w13, g = torch.randn(80, 128), torch.rand(128) + 0.5
    ref = res + x @ w.T + b
    got = ri.mm(x, w, bias=b, res=res, cfg=cfg)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-5)
    assert torch.equal(ri.mm(x[3:4], w, bias=b, res=res[3:4], cfg=cfg), got[3:4])
    hn = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g
    gate, up = (hn @ w13.T).chunk(2, -1)
    got = ri.mm(x, w13, glu=True, norm=g, cfg=cfg)
    torch.testing.assert_close(got, F.silu(gate) * up, atol=1e-3, rtol=1e-4)
    assert torch.equal(ri.mm(x[5:6], w13, glu=True, norm=g, cfg=cfg), got[5:6])
    o = torch.randn(1, 2, 16, 64)  # G = 2 kv heads, rep = 2, M = 8 rows, D = 64
    wo = torch.randn(24, 256)
    flat = o.reshape(4, 8, 64).transpose(0, 1).reshape(8, 256)
    got = ri.mm(o, wo, heads=(64, 2), rows=8, cfg=cfg)
    torch.testing.assert_close(got, flat @ wo.T, atol=1e-4, rtol=1e-5)


@inner
def test_calls_of_up_to_16_rows_take_16_row_tiles_wide_ones_where_asked(monkeypatch):
    """``DRAFTWISE_MM_BM=bucket`` (the default): 16-row tiles up to 16 rows, 64-row ones
    above; ``DRAFTWISE_MM_WIDE=1``: those 16-row tiles 64 outputs wide where the GEMM has
    one such tile an SM; ``DRAFTWISE_MM_NARROW``: narrow GEMMs keep 64-row tiles; each
    computes what torch does (plain and GLU)."""
    monkeypatch.setenv("DRAFTWISE_MM_WIDE", "1")
    monkeypatch.setenv("DRAFTWISE_MM_NARROW", "0")  # the default keeps GEMMs this narrow at 64
    torch.manual_seed(4)
    ri = _kernels()
    assert ri.bm_by_rows and ri.wide
    ri.sms = 2  # 256 outputs: four 64-wide tiles, two an SM
    seen = []
    real = ri.k._mm

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen.append((kw["BM"], kw["BN"]))
                return real[grid](*args, **kw)
            return launch

    ri.k = type("K", (), {"_mm": Spy(), "_mm_reduce": None})()
    x, w, w13 = torch.randn(20, 64), torch.randn(256, 64), torch.randn(512, 64)
    for rows in (1, 16, 20):
        torch.testing.assert_close(ri.mm(x[:rows], w), x[:rows] @ w.T, atol=2e-5, rtol=1e-5)
        g, u = (x[:rows] @ w13.T).chunk(2, -1)
        torch.testing.assert_close(ri.mm(x[:rows], w13, glu=True), F.silu(g) * u, atol=1e-4, rtol=1e-5)
    assert seen == [(16, 64)] * 4 + [(64, 32)] * 2
    ri.narrow = 256  # DRAFTWISE_MM_NARROW=256: this 256-output GEMM keeps its 64-row tiles
    torch.testing.assert_close(ri.mm(x[:1], w), x[:1] @ w.T, atol=2e-5, rtol=1e-5)
    assert seen[-1] == (64, 32)


@inner
@pytest.mark.parametrize("c", [64, 72])
def test_the_rmsnorm_kernel_computes_what_torch_does(c, monkeypatch):
    """``_rmsnorm`` (``DRAFTWISE_TRITON_NORM=1``): each row alone, bit-equal alone and
    among others."""
    monkeypatch.setenv("DRAFTWISE_TRITON_NORM", "1")
    torch.manual_seed(5)
    ri = _kernels()
    ri.model.cfg.norm_eps = 1e-6
    x, w = torch.randn(9, c) * 3, torch.rand(c) + 0.5
    got = ri.norm(x, w)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(ri.norm(x[4:5], w), got[4:5])


@inner
def test_the_gemm_reads_attention_output_in_its_grouped_layout():
    """(1, G, rep M, D), head h = g rep + j at rows j M .. j M + M: as the torch step's
    reshape/transpose copy lays it out."""
    torch.manual_seed(1)
    ri = _kernels()
    o = torch.randn(1, 2, 10, 16)  # G = 2 kv heads, rep = 2, M = 5 rows, D = 16
    w = torch.randn(24, 64)
    ref = o.reshape(4, 5, 16).transpose(0, 1).reshape(5, 64)  # (M, H D)
    torch.testing.assert_close(ri.mm(o, w, heads=(16, 2), rows=5), ref @ w.T, atol=2e-5, rtol=1e-5)


@inner
@pytest.mark.parametrize("rot", [16, 8])  # 8: a partial rotary factor
def test_rope_and_the_kv_write_are_the_torch_steps(rot):
    torch.manual_seed(2)
    ri = _kernels(rot=rot)
    b, s = 3, 20
    qk, v = torch.randn(b, 6, 16), torch.randn(b, 2, 16)
    pos, slots = torch.tensor([3, 7, 7]), torch.tensor([10, 11, 12])
    cos, sin = torch.randn(s, rot), torch.randn(s, rot)
    kv = torch.zeros(2, 2, s, 16)
    q = ri.rope_kv(qk, v, cos, sin, pos, slots, kv)
    c, sn = cos[pos][:, None], sin[pos][:, None]
    turned = torch.addcmul(qk[..., :rot] * c, qk[..., :rot].roll(rot // 2, dims=-1), sn)
    ref = torch.cat([turned, qk[..., rot:]], dim=-1)  # (B, H + H_kv, D)
    torch.testing.assert_close(q, ref[:, :4].transpose(0, 1).reshape(1, 2, 2 * b, 16))
    torch.testing.assert_close(kv[0][:, slots], ref[:, 4:].transpose(0, 1))
    torch.testing.assert_close(kv[1][:, slots], v.transpose(0, 1))
    assert kv[:, :, :10].abs().sum() == 0 and kv[:, :, 13:].abs().sum() == 0  # no other slot


def _attention_only(cap: float | None):
    """The kernels' launchers for a stand-in model that only attends (``cap``: gemma-2's
    score soft-capping), under the interpreter."""
    from types import SimpleNamespace as NS

    from draftwise.backends.cuda.gpu.rowinv import RowInvariant

    cfg = NS(act="silu", attn_scale=None, attn_softcap=cap)
    return RowInvariant(NS(cfg=cfg, device=torch.device("cpu")), interpret=True)


@inner
@pytest.mark.parametrize("cap,chunk", [(None, "0"), (5.0, "0"), (None, "64"), (5.0, "64")])
def test_the_attention_kernel_computes_what_sdpa_does(cap, chunk, monkeypatch):
    """Grouped query rows (rep 2) over 70 cache slots (two slot blocks, the second
    partial) under an additive bias that hides some slots per step row; written as
    (B, H D) rows. ``cap`` 5.0: gemma-2's score soft-capping; ``chunk`` 64: two chunks
    walked side by side and merged (``DRAFTWISE_ATTN_CHUNK``)."""
    monkeypatch.setenv("DRAFTWISE_ATTN_CHUNK", chunk)
    torch.manual_seed(4)
    g, rep, b, s, d = 2, 2, 3, 70, 16
    ri = _attention_only(cap)
    q, kv = torch.randn(1, g, rep * b, d), torch.randn(2, g, s, d)
    bias = torch.zeros(b, s)
    bias[0, 40:] = float("-inf")  # step row 0 sees slots 0..39, row 2 all but 5..9
    bias[2, 5:10] = float("-inf")
    got = ri.attend(q, kv, bias)  # (B, H D)
    scores = (q @ kv[0].unsqueeze(0).transpose(-1, -2)) * d**-0.5  # (1, G, rep B, S)
    if cap is not None:
        scores = torch.tanh(scores / cap) * cap
    probs = torch.softmax(scores + bias.repeat(rep, 1), dim=-1)
    ref = (probs @ kv[1].unsqueeze(0))[0]  # (G, rep B, D): row j B + b is head g rep + j
    ref = ref.reshape(g, rep, b, d).permute(2, 0, 1, 3).reshape(b, g * rep * d)
    torch.testing.assert_close(got, ref, atol=2e-5, rtol=1e-5)
    with pytest.raises(Exception, match="attention bias"):
        ri.attend(q, kv, bias[:, :10])


@inner
@pytest.mark.parametrize("chunk", ["0", "64", "128"])
@pytest.mark.parametrize("last", [40, 63, 64, 129])
def test_the_attention_kernel_stops_after_the_last_row_slot_with_the_same_bits(last, chunk, monkeypatch):
    """Given the rows' slots, the kernel walks only the blocks up to the last one; every
    later slot is hidden by the bias, so the result is bit-equal to walking all S slots
    (the hidden slots hold large finite values: they would show if read wrongly); in
    one program or in chunks merged after (``chunk``)."""
    from draftwise.backends.cuda.gpu.rowinv import ATTN_BS

    monkeypatch.setenv("DRAFTWISE_ATTN_CHUNK", chunk)
    torch.manual_seed(5)
    g, rep, b, s, d = 2, 2, 3, 200, 16
    ri = _attention_only(None)
    q, kv = torch.randn(1, g, rep * b, d), torch.randn(2, g, s, d)
    slots = torch.arange(last - b + 1, last + 1)  # (B,): the step rows' own slots
    kv[:, :, last + 1 :] = 1e4  # (never seen)
    bias = torch.zeros(b, s)
    bias[:, last + 1 :] = float("-inf")
    bias[0, slots[1:]] = float("-inf")  # a tree: row 0 does not see rows 1 and 2
    full = ri.attend(q, kv, bias)  # (B, H D)
    bounded = ri.attend(q, kv, bias, slots)
    assert torch.equal(bounded, full)
    assert full.abs().max() < 100  # the 1e4 slots were hidden
    blocks_end = -(-(last + 1) // ATTN_BS) * ATTN_BS  # the blocks after the last row's
    kv[:, :, blocks_end:] = float("nan")  # are not read at all by the bounded kernel
    assert torch.equal(ri.attend(q, kv, bias, slots), full)
    assert ri.attend(q, kv, bias).isnan().all() == (blocks_end < s)


def _backend(model_dir, dtype: str, kernels: str):
    from draftwise.backends.cuda import TorchBackend
    from draftwise.backends.cuda.gpu.graphs import StepGraphs

    be = TorchBackend.from_pretrained(
        model_dir, dtype=dtype, device="cpu", graphs=True, invariant=False, max_cache_len=128
    )
    be.graphs = StepGraphs(be.model, kernels=kernels)
    assert be.graphs.kernels == kernels
    return be


def _switches(spec: str, monkeypatch) -> None:
    """``attn[:chunk[:norm[:split[:own norm]]]]`` as the step's environment switches.
    GEMMs of every width take 16-row tiles up to 16 rows (``DRAFTWISE_MM_NARROW=0``: the
    tiny model's GEMMs are all narrower than the default's 4,096 outputs), as a real
    model's wide GEMMs do."""
    attn, chunk, norm, split, own = (spec.split(":") + ["0", "0", "0", "0"])[:5]
    monkeypatch.setenv("DRAFTWISE_MM_NARROW", "0")
    monkeypatch.setenv("DRAFTWISE_TRITON_NORM", own)
    monkeypatch.setenv("DRAFTWISE_TRITON_ATTN", attn)
    monkeypatch.setenv("DRAFTWISE_ATTN_CHUNK", chunk)
    monkeypatch.setenv("DRAFTWISE_NORM_IN_GEMM", norm)
    monkeypatch.setenv("DRAFTWISE_MM_SPLIT", split)
    if split != "0":
        monkeypatch.setenv("DRAFTWISE_MM_CONFIG", "16,16,4,4")


@inner
@pytest.mark.parametrize(
    "family,attn",
    [("llama3", "0"), ("qwen2", "0"), ("qwen3", "0"), ("gemma2", "0"), ("llama3", "1"), ("gemma2", "1"),
     ("gemma2", "1:64"), ("qwen2", "1:0:1"), ("qwen3", "1:0:1"), ("gemma2", "1:0:1"),
     ("qwen2", "1:0:1:16"), ("gemma2", "1:64:0:16"), ("gemma2", "1:256:0:0:1"), ("qwen3", "1:256:0:0:1")],
)
def test_the_step_computes_what_the_torch_fixed_step_does(family, attn, tmp_path, monkeypatch):
    """float32: the kernels' step equals the torch fixed step's to float rounding, after a
    tree and K/V compaction (bias, per-head norms, sandwich norms, GeGLU, soft-capping);
    ``attn``: with the attention kernel (``DRAFTWISE_TRITON_ATTN``) in place of SDPA,
    ``1:64`` in chunks of 64 slots (``DRAFTWISE_ATTN_CHUNK``), ``1:0:1`` with the
    RMSNorms inside the GEMMs (``DRAFTWISE_NORM_IN_GEMM``), ``:16`` with split-K
    (``DRAFTWISE_MM_SPLIT``, small tiles so that the tiny model's GEMMs split), ``:1``
    last with the RMSNorms on ``_rmsnorm`` (``DRAFTWISE_TRITON_NORM``)."""
    _switches(attn, monkeypatch)
    from draftwise.core.tree import DraftTree
    from tests.backends.cuda.test_torch_backend import V, _save_tiny

    model_dir = _save_tiny(tmp_path / family, family)[0]
    ids = np.random.default_rng(0).integers(0, V, 30)
    tree = DraftTree(ids[21:27].astype(np.int64), np.array([-1, 0, 0, 1, 2, 4]))
    out = []
    for kernels in ("torch", "triton"):
        be = _backend(model_dir, "float32", kernels)
        be.prefill(ids[:20])
        out.append(be.verify(int(ids[20]), tree, need_logits=True))
        be.commit(np.array([0, 2, 4]))
        out.append(be.verify(int(ids[28]), DraftTree.empty(), need_logits=True))
    np.testing.assert_allclose(out[2].logits, out[0].logits, atol=1e-4)
    np.testing.assert_allclose(out[3].logits, out[1].logits, atol=1e-4)
    assert out[3].argmax.tolist() == out[1].argmax.tolist()


@inner
@pytest.mark.parametrize("attn", ["0", "1", "1:64", "1:0:1", "1:64:1:16", "1:64:0:0:1"])
def test_a_row_is_bit_equal_in_every_bucket_and_greedy_drafting_is_lossless(attn, tmp_path, monkeypatch):
    """bfloat16: every bucket kept (a row computes the same alone and beside 3, 15 or 63
    others), and Cacheback through the kernels equals plain decoding through them; with
    SDPA, with the attention kernel, with it in chunks of 64 slots (the text passes 64
    tokens, so two chunks are merged), with the norms inside the GEMMs, all of that with
    split-K, and the default step's switches (``1:64:0:0:1``: chunks, the Triton
    RMSNorm; chunks of 64 rather than the default 128, so the short text spans two)."""
    _switches(attn, monkeypatch)
    from draftwise.backends.cuda.gpu.graphs import BUCKETS
    from draftwise.core.decode import Decoder
    from draftwise.core.drafters.base import NoDrafter
    from draftwise.core.drafters.cacheback import Cacheback
    from draftwise.core.sampling import SamplingParams
    from tests.backends.cuda.test_torch_backend import V, _save_tiny

    model_dir = _save_tiny(tmp_path / "m", "llama3")[0]
    be = _backend(model_dir, "bfloat16", "triton")
    prompt = np.random.default_rng(3).integers(0, V, 12)
    chunked = attn.split(":")[1:2] not in ([], ["0"])
    prompt = np.concatenate([prompt] * (5 if chunked else 2))  # a repeat, so Cacheback drafts
    outs = []
    for drafter in (NoDrafter(), Cacheback()):
        be.reset()
        outs.append(
            [t for s in Decoder(be).steps(prompt, drafter, SamplingParams(), 16) for t in s.tokens]
        )
    assert be.graphs.buckets == BUCKETS and be.graphs.agree
    assert outs[1] == outs[0] and len(outs[0]) >= 16
