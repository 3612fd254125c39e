"""``cpu/hugepages.py``: the tensors a CPU step streams, copied into one mapping on 2 MB
pages, keep their values, dtypes and shapes; a model placed there verifies with the same
bits as one that is not; ``DRAFTWISE_HUGEPAGES=0`` leaves every tensor where it is."""

from __future__ import annotations

import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from draftwise.backends.cuda import TorchBackend  # noqa: E402
from draftwise.backends.cuda.cpu import hugepages, native  # noqa: E402
from draftwise.core.tree import DraftTree  # noqa: E402
from tests.backends.cuda.test_torch_backend import _save_tiny  # noqa: E402

needs_huge = pytest.mark.skipif(
    not hugepages.available(), reason="no MADV_HUGEPAGE here (Linux only)"
)


@needs_huge
def test_placed_copies_keep_values_and_live_on_after_the_originals():
    rng = np.random.default_rng(0)
    src = [
        torch.from_numpy(rng.integers(0, 255, (3, 5), dtype=np.uint8)),
        torch.from_numpy(rng.standard_normal((7, 4)).astype(np.float32)),
        torch.zeros(0, dtype=torch.int64),
        torch.from_numpy(rng.standard_normal(33).astype(np.float32)).to(torch.bfloat16),
    ]
    want = [t.clone() for t in src]
    got = hugepages.place(src)
    base = got[0].data_ptr()
    assert base % hugepages.HUGE == 0  # the mapping's first 2 MB boundary
    for g, w, s in zip(got, want, src, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)
        assert g.data_ptr() % hugepages.ALIGN == 0
        assert g.numel() == 0 or g.data_ptr() != s.data_ptr()  # a copy, not the original
    del src, want
    gc.collect()
    got[1].add_(1.0)  # the mapping outlives every other reference: writable, intact
    assert torch.isfinite(got[1]).all() and got[0].sum() >= 0


@needs_huge
def test_a_large_placement_is_backed_by_huge_pages():
    """Where the kernel has transparent huge pages on (``always`` or ``madvise``), the
    mapping's 2 MB pages show in the process's AnonHugePages."""
    try:
        mode = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        pytest.skip("no transparent huge pages here")
    if "[never]" in mode:
        pytest.skip("transparent huge pages are off on this machine")

    def anon_huge_kb() -> int:
        with open("/proc/self/smaps_rollup") as f:
            return sum(int(ln.split()[1]) for ln in f if ln.startswith("AnonHugePages:"))

    before = anon_huge_kb()
    (big,) = hugepages.place([torch.ones(16 << 20, dtype=torch.uint8)])
    assert int(big[-1]) == 1
    # (a request: a machine with its memory fragmented could fall back to small pages,
    # but the kernel compacts memory for a mapping that asked, and 16 MB is little)
    assert anon_huge_kb() - before >= 8 << 10


def test_off_or_unfit_tensors_stay_where_they_are(monkeypatch):
    a = torch.arange(8.0)
    strided = torch.arange(16.0)[::2]
    assert hugepages.place([a, strided])[0] is a  # one non-contiguous: nothing moves
    monkeypatch.setenv("DRAFTWISE_HUGEPAGES", "0")
    assert not hugepages.available()
    assert hugepages.place([a])[0] is a


@needs_huge
@pytest.mark.skipif(native.int4_lib() is None, reason="no compiled int4 kernel")
def test_a_placed_model_verifies_with_the_same_bits(tmp_path, monkeypatch):
    model_dir, _ = _save_tiny(tmp_path / "m", "llama")
    rng = np.random.default_rng(5)
    ctx = rng.integers(0, 97, 40)
    tree = DraftTree.chain(rng.integers(0, 97, 5).tolist())
    outs = []
    for on in ("1", "0"):
        monkeypatch.setenv("DRAFTWISE_HUGEPAGES", on)
        be = TorchBackend.from_pretrained(model_dir, dtype="4bit", device="cpu", max_cache_len=128)
        m = be.model
        ptrs = [ly.w13.packed.data_ptr() for ly in m.layers] + [m.cache.data_ptr()]
        lo, hi = min(ptrs), max(ptrs)
        if on == "1":  # every packed weight and the cache in one mapping
            assert m.cache.data_ptr() % hugepages.ALIGN == 0
            assert hi - lo < 64 << 20
        be.prefill(ctx[:-1])
        out = be.verify(int(ctx[-1]), tree, need_logits=True)
        assert out.logits is not None
        outs.append(out.logits)
    assert np.array_equal(outs[0], outs[1])
