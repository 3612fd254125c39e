"""What only a GPU can check (``pytest -m cuda``; ``scripts/device_check.py`` runs it on a
lent H100/H200): the torch backend on CUDA agrees with the CPU, the device sampling and
the pinned staging buffer run for real, and greedy drafting equals plain decoding there.
Skipped where torch sees no CUDA device (CI, this project's CPUs)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from draftwise.backends.cuda import TorchBackend  # noqa: E402
from draftwise.core.tree import DraftTree  # noqa: E402
from tests.backends.cuda.test_torch_backend import V, _save_tiny  # noqa: E402

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (a lent GPU runs these)"),
]


def test_cuda_logits_match_the_cpu(tmp_path):
    model_dir, _ = _save_tiny(tmp_path / "m", "llama3")
    ids = np.random.default_rng(0).integers(0, V, 30)
    tree = DraftTree.chain(ids[21:26].tolist())
    out = []
    for device in ("cpu", "cuda"):
        be = TorchBackend.from_pretrained(model_dir, dtype="float32", device=device)
        be.prefill(ids[:20])
        v = be.verify(int(ids[20]), tree, need_logits=True)
        out.append(v.logits)
    np.testing.assert_allclose(out[1], out[0], atol=2e-3)


def test_device_sampling_and_staging_on_the_gpu(tmp_path):
    from draftwise.backends.cuda.gpu.sampling import HostStaging

    staging = HostStaging(torch.device("cuda"))
    host = np.arange(12, dtype=np.int64)
    dev = staging.upload(host)
    assert dev.device.type == "cuda" and dev.cpu().numpy().tolist() == host.tolist()
    model_dir, _ = _save_tiny(tmp_path / "m", "qwen2")
    be = TorchBackend.from_pretrained(model_dir, dtype="float32", device="cuda")
    assert be.device_sampling  # on by default on CUDA


def test_greedy_drafting_equals_plain_on_the_gpu(tmp_path):
    from draftwise.core.decode import Decoder
    from draftwise.core.drafters.base import NoDrafter
    from draftwise.core.drafters.cacheback import Cacheback
    from draftwise.core.sampling import SamplingParams

    model_dir, _ = _save_tiny(tmp_path / "m", "tied")
    be = TorchBackend.from_pretrained(model_dir, dtype="bfloat16", device="cuda")
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    plain = [t for s in Decoder(be).steps(prompt, NoDrafter(), SamplingParams(), 40) for t in s.tokens]
    spec = [t for s in Decoder(be).steps(prompt, Cacheback(), SamplingParams(), 40) for t in s.tokens]
    assert spec == plain


def test_graph_steps_are_row_invariant_on_the_gpu(tmp_path):
    """A row alone (a plain step) and the same row inside trees of 3..63 nodes, at three
    cache lengths: bit-equal bfloat16 logits, replayed from captured graphs."""
    model_dir, _ = _save_tiny(tmp_path / "m", "llama3")
    be = TorchBackend.from_pretrained(model_dir, dtype="bfloat16", device="cuda", max_cache_len=512)
    assert be.graphs is not None and be.graphs.capture and "graphs" in be.name
    rng = np.random.default_rng(0)
    ids = rng.integers(0, V, 250)
    for ctx in (20, 100, 180):  # (the tiny config's limit is 256 positions)
        be.reset()
        be.prefill(ids[:ctx])
        alone = be.verify(int(ids[ctx]), DraftTree.empty(), need_logits=True).logits[0]
        be.trim(ctx)
        for n in (3, 15, 40, 63):
            parents = np.array([-1] + [int(rng.integers(-1, i)) for i in range(1, n)])
            tree = DraftTree(rng.integers(0, V, n), parents)
            got = be.verify(int(ids[ctx]), tree, need_logits=True).logits[0]
            be.trim(ctx)
            assert np.array_equal(got, alone), (ctx, n, be.graphs.buckets)


def test_the_triton_step_keeps_every_bucket_on_the_gpu(tmp_path):
    """With Triton there (the device machine has it), CUDA steps run the row-invariant
    kernels and no bucket is dropped: a plain step runs one row, bit-equal to its row in
    a 64-row step (the row-invariance test above proves it on trees)."""
    pytest.importorskip("triton")
    from draftwise.backends.cuda.gpu.graphs import BUCKETS

    model_dir, _ = _save_tiny(tmp_path / "m", "llama3")
    be = TorchBackend.from_pretrained(model_dir, dtype="bfloat16", device="cuda", max_cache_len=256)
    assert be.graphs is not None and be.graphs.kernels == "triton"
    be.prefill(np.arange(1, 21))
    be.verify(21, DraftTree.empty(), need_logits=False)
    assert be.graphs.agree and be.graphs.buckets == BUCKETS
