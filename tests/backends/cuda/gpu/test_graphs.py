"""``gpu/graphs.py`` on CPU tensors: the fixed-shape step (what CUDA captures) computes
what the eager forward does, a row's logits do not depend on its neighbours or the
padding, greedy drafting through it equals plain decoding, the loop caps trees to the
largest bucket, and buckets whose rows differ from the largest one's are dropped. Capture needs a
GPU (``test_on_gpu.py``)."""

from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from draftwise.backends.cuda import TorchBackend  # noqa: E402
from draftwise.backends.cuda.gpu.graphs import BUCKETS, StepGraphs  # noqa: E402
from draftwise.core.decode import Decoder  # noqa: E402
from draftwise.core.drafters.base import NoDrafter  # noqa: E402
from draftwise.core.drafters.cacheback import Cacheback  # noqa: E402
from draftwise.core.sampling import SamplingParams  # noqa: E402
from draftwise.core.tree import DraftTree  # noqa: E402
from draftwise.errors import DraftwiseError  # noqa: E402
from tests.backends.cuda.test_torch_backend import V, _save_tiny  # noqa: E402


@pytest.fixture(scope="module", params=["llama3", "gemma2"])
def model_dir(request, tmp_path_factory):
    """llama3, and gemma2 (soft-capping, a sliding window of 8 the contexts here pass)."""
    return _save_tiny(tmp_path_factory.mktemp("graphs") / "m", request.param)[0]


def _pair(model_dir):
    eager = TorchBackend.from_pretrained(model_dir, dtype="float32", device="cpu", graphs=False,
                                         invariant=False, max_cache_len=256)
    fixed = TorchBackend.from_pretrained(model_dir, dtype="float32", device="cpu", graphs=True,
                                         invariant=False, max_cache_len=256)
    return eager, fixed


def test_the_fixed_step_computes_what_the_eager_forward_does(model_dir):
    eager, fixed = _pair(model_dir)
    assert fixed.graphs is not None and not fixed.graphs.capture  # CPU: eager, same shapes
    assert fixed.model.max_cache_len == 256 + max(BUCKETS) and "graphs" in fixed.name
    ids = np.random.default_rng(0).integers(0, V, 40)
    tree = DraftTree(ids[31:37].astype(np.int64), np.array([-1, 0, 0, 1, 2, 4]))
    out = []
    for be in (eager, fixed):
        be.prefill(ids[:30])
        v = be.verify(int(ids[30]), tree, need_logits=True)
        out.append(v)
        be.commit(np.array([0, 2, 4]))  # a branch, not a prefix: K/V compaction
        out.append(be.verify(int(ids[38]), DraftTree.empty(), need_logits=True))
    np.testing.assert_allclose(out[2].logits, out[0].logits, atol=1e-4)
    np.testing.assert_allclose(out[3].logits, out[1].logits, atol=1e-4)
    assert out[3].argmax.tolist() == out[1].argmax.tolist()


def test_a_row_does_not_depend_on_its_neighbours(model_dir):
    """The same root over the same cache: alone (padded to a bucket) and inside trees of
    other shapes in that bucket, its logits are bit-equal (fixed shapes)."""
    _, be = _pair(model_dir)
    be.graphs.buckets = (16,)  # one bucket: every step the same shapes
    ids = np.random.default_rng(1).integers(0, V, 60)
    be.prefill(ids[:40])
    rows = []
    for tree in (DraftTree.empty(), DraftTree.chain(ids[41:46].tolist()),
                 DraftTree(ids[46:58].astype(np.int64), np.full(12, -1))):
        rows.append(torch.from_numpy(be.verify(int(ids[40]), tree, need_logits=True).logits[0]))
        be.trim(40)  # drop the pending rows: the next tree sees the same cache
    assert torch.equal(rows[0], rows[1]) and torch.equal(rows[0], rows[2])


def test_greedy_drafting_through_fixed_steps_equals_plain(model_dir):
    eager, fixed = _pair(model_dir)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]
    want = [t for s in Decoder(eager).steps(prompt, NoDrafter(), SamplingParams(), 40) for t in s.tokens]
    plain = [t for s in Decoder(fixed).steps(prompt, NoDrafter(), SamplingParams(), 40) for t in s.tokens]
    spec = [t for s in Decoder(fixed).steps(prompt, Cacheback(), SamplingParams(), 40) for t in s.tokens]
    assert plain == want and spec == plain


def test_the_loop_caps_trees_to_the_largest_bucket(model_dir):
    _, be = _pair(model_dir)
    be.graphs.buckets = (1, 4)
    be.max_tree_nodes = 3
    seen = []

    class Wide(NoDrafter):
        def propose(self, context, budget):
            seen.append(budget)
            return DraftTree(np.full(budget, 5), np.full(budget, -1))

    list(Decoder(be).steps([1, 2, 3], Wide(), SamplingParams(), 12, budget=16))
    assert seen and max(seen) == 3


def test_bucket_and_room_errors(model_dir):
    _, be = _pair(model_dir)
    with pytest.raises(DraftwiseError, match="1..64 rows, got 65"):
        be.graphs.bucket(65)
    with pytest.raises(DraftwiseError, match="positive row counts"):
        StepGraphs(be.model, buckets=(0, 4))
    with pytest.raises(DraftwiseError, match="need 321 cache slots"):
        TorchBackend(be.model, 257, graphs=StepGraphs(be.model, buckets=(64,)))
    with pytest.raises(DraftwiseError, match="CUDA graphs need a CUDA device"):
        StepGraphs(be.model, capture=True)


def test_buckets_whose_rows_differ_from_the_largest_are_dropped(model_dir):
    """A model whose step shifts a row's logits with the bucket (as GEMMs of other
    shapes may on a GPU): the first step finds it and keeps one bucket."""
    _, be = _pair(model_dir)
    real = be.model.forward_fixed

    def shifted(tokens, positions, slots, bias, local=None):
        out = real(tokens, positions, slots, bias, local)
        return out + 1e-3 * min(tokens.shape[0], 16)  # buckets 16 and 64 agree, 1 and 4 not

    be.model.forward_fixed = shifted
    ids = np.random.default_rng(2).integers(0, V, 20)
    be.prefill(ids[:10])
    be.verify(int(ids[10]), DraftTree.empty(), need_logits=False)
    assert be.graphs.agree is False and be.graphs.buckets == (16, 64)
    _, ok = _pair(model_dir)
    ok.prefill(ids[:10])
    ok.verify(int(ids[10]), DraftTree.empty(), need_logits=False)
    # (CPU GEMMs of 1 and 4 rows take other kernels: there the buckets may disagree too)
    assert ok.graphs.agree == (ok.graphs.buckets == BUCKETS) and 64 in ok.graphs.buckets


def test_kernels_that_fail_at_the_first_step_fall_back_to_torch(model_dir):
    """Chosen automatically, row-invariant kernels that fail (a GPU or Triton they do
    not support) leave the step to torch's kernels, with a warning, and the output is
    the torch step's; asked for explicitly, the failure is raised."""
    eager, fixed = _pair(model_dir)

    class Broken:
        def forward_fixed(self, *args):
            raise RuntimeError("no kernel for this GPU")

    ids = np.random.default_rng(2).integers(0, V, 30)
    want = eager
    want.prefill(ids[:20])
    ref = want.verify(int(ids[20]), DraftTree.empty(), need_logits=True).logits
    for explicit in (False, True):
        fixed.reset()
        fixed.graphs = StepGraphs(fixed.model)  # CPU: torch's kernels...
        fixed.model.rowinv, fixed.graphs.kernels = Broken(), "triton"  # ...then Triton's, broken
        fixed.graphs._fallback = not explicit
        fixed.prefill(ids[:20])
        if explicit:
            with pytest.raises(RuntimeError, match="no kernel"):
                fixed.verify(int(ids[20]), DraftTree.empty(), need_logits=True)
            continue
        with pytest.warns(RuntimeWarning, match="Triton kernels failed"):
            got = fixed.verify(int(ids[20]), DraftTree.empty(), need_logits=True).logits
        assert fixed.graphs.kernels == "torch" and fixed.model.rowinv is None
        np.testing.assert_allclose(got, ref, atol=1e-4)


def test_the_triton_switches_are_checked(monkeypatch, model_dir):
    """Bad values of the kernel switches are refused with the value named."""
    from draftwise.backends.cuda.gpu.rowinv import MMConfig, RowInvariant, config

    _, fixed = _pair(model_dir)
    monkeypatch.setenv("DRAFTWISE_TRITON", "off")
    with pytest.raises(DraftwiseError, match="DRAFTWISE_TRITON must be 0 or 1, got 'off'"):
        RowInvariant.build(fixed.model)
    monkeypatch.delenv("DRAFTWISE_TRITON")
    monkeypatch.setenv("DRAFTWISE_TRITON_ATTN", "yes")
    with pytest.raises(DraftwiseError, match="DRAFTWISE_TRITON_ATTN must be 0 or 1, got 'yes'"):
        RowInvariant(fixed.model)
    monkeypatch.delenv("DRAFTWISE_TRITON_ATTN")
    for bad in ("100", "-64", "64k"):
        monkeypatch.setenv("DRAFTWISE_ATTN_CHUNK", bad)
        with pytest.raises(DraftwiseError, match=f"DRAFTWISE_ATTN_CHUNK must be 0 or a multiple of 64 slots, got '{bad}'"):
            RowInvariant(fixed.model)
    monkeypatch.setenv("DRAFTWISE_ATTN_CHUNK", "128")
    assert RowInvariant(fixed.model).chunk == 128
    monkeypatch.delenv("DRAFTWISE_ATTN_CHUNK")
    assert RowInvariant(fixed.model).chunk is None  # the default: by the cache's size
    monkeypatch.setenv("DRAFTWISE_MM_WIDE", "yes")
    with pytest.raises(DraftwiseError, match="DRAFTWISE_MM_WIDE must be 0 or 1, got 'yes'"):
        RowInvariant(fixed.model)
    monkeypatch.setenv("DRAFTWISE_MM_WIDE", "0")
    assert not RowInvariant(fixed.model).wide
    monkeypatch.delenv("DRAFTWISE_MM_WIDE")
    assert RowInvariant(fixed.model).wide and RowInvariant(fixed.model).own_norm  # the defaults
    for name, bad, words in (("DRAFTWISE_MM_NARROW", "4k", "a count of outputs (0 or more)"),
                             ("DRAFTWISE_ATTN_PIPE", "5", "0-4 (pipeline stages; 0: off)")):
        monkeypatch.setenv(name, bad)
        with pytest.raises(DraftwiseError, match=re.escape(f"{name} must be {words}, got '{bad}'")):
            RowInvariant(fixed.model)
        monkeypatch.delenv(name)
    monkeypatch.setenv("DRAFTWISE_MM_NARROW", "0")
    assert RowInvariant(fixed.model).narrow == 0
    monkeypatch.delenv("DRAFTWISE_MM_NARROW")
    assert RowInvariant(fixed.model).narrow == 4096  # the default
    monkeypatch.setenv("DRAFTWISE_PDL", "1")
    assert not RowInvariant(fixed.model).pdl  # Hopper only, never under the interpreter
    monkeypatch.setenv("DRAFTWISE_PDL", "on")
    with pytest.raises(DraftwiseError, match="DRAFTWISE_PDL must be 0 or 1, got 'on'"):
        RowInvariant(fixed.model)
    monkeypatch.delenv("DRAFTWISE_PDL")
    monkeypatch.setenv("DRAFTWISE_TRITON_NORM", "yes")
    with pytest.raises(DraftwiseError, match="DRAFTWISE_TRITON_NORM must be 0 or 1, got 'yes'"):
        RowInvariant(fixed.model)
    monkeypatch.delenv("DRAFTWISE_TRITON_NORM")
    monkeypatch.setenv("DRAFTWISE_NORM_IN_GEMM", "on")
    with pytest.raises(DraftwiseError, match="DRAFTWISE_NORM_IN_GEMM must be 0 or 1, got 'on'"):
        RowInvariant(fixed.model)
    monkeypatch.delenv("DRAFTWISE_NORM_IN_GEMM")
    for bad in ("16,256", "12,256,4,4", "16,256,3,4", "16,256,4,0"):
        monkeypatch.setenv("DRAFTWISE_MM_CONFIG", bad)
        with pytest.raises(DraftwiseError, match="DRAFTWISE_MM_CONFIG"):
            config(4096, 4096)
    monkeypatch.setenv("DRAFTWISE_MM_CONFIG", "32,128,8,3")
    assert (config(4096, 4096).bn, config(4096, 4096).warps) == (32, 8)
    for bad in ("8", "48", "sixty-four", "128"):
        monkeypatch.setenv("DRAFTWISE_MM_BM", bad)
        with pytest.raises(DraftwiseError, match=f"DRAFTWISE_MM_BM must be one of 16, 32, 64 or bucket, got '{bad}'"):
            config(4096, 4096)
    monkeypatch.setenv("DRAFTWISE_MM_BM", "16")
    assert config(4096, 4096).bm == 16 == config(14336, 4096).bm  # every GEMM, any shape
    assert not RowInvariant(fixed.model).bm_by_rows  # and every call
    monkeypatch.delenv("DRAFTWISE_MM_CONFIG")
    assert config(4096, 4096) == MMConfig(16, 256, 4, 4, 16)  # the first H200 session's tiles
    monkeypatch.delenv("DRAFTWISE_MM_BM")
    assert config(4096, 4096) == config(128256, 4096) == MMConfig(32, 128, 4, 6, 64)
    assert RowInvariant(fixed.model).bm_by_rows  # 16-row tiles up to 16 rows: the default
    monkeypatch.setenv("DRAFTWISE_MM_BM", "bucket")
    assert RowInvariant(fixed.model).bm_by_rows and config(4096, 4096).bm == 64
