"""MLXBackend against mlx-lm's own full-sequence forward, on tiny random models.

Every check compares float32 logits (atol 1e-4) with the module's ``__call__`` on the
whole sequence (no cache), so an error in the per-row RoPE positions, the tree mask, the
cache growth or the commit gather shows up as a numeric mismatch.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from mlx_lm.models import llama as mlx_llama  # noqa: E402
from mlx_lm.models import qwen2 as mlx_qwen2  # noqa: E402

from draftwise.backends.mlx import MLXBackend  # noqa: E402
from draftwise.backends.mlx import backend as backend_mod  # noqa: E402
from draftwise.backends.mlx import llama as llama_mod  # noqa: E402
from draftwise.core.tree import DraftTree  # noqa: E402
from draftwise.errors import DraftwiseError  # noqa: E402

pytestmark = pytest.mark.mlx

V = 97
ATOL = 1e-4
TINY = dict(
    vocab_size=V,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-5,
    max_position_embeddings=256,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
CONTEXT = [3, 14, 15, 92, 65, 35, 89]
TREE_PATHS = [[5, 6, 7], [5, 8], [9, 10], [11]]


def tiny_backend(variant: str, max_cache_len: int = 256) -> MLXBackend:
    mx.random.seed(0)
    cfg = {"model_type": "qwen2" if variant == "qwen2" else "llama", **TINY}
    cfg["tie_word_embeddings"] = variant == "tied"
    if variant == "llama3":
        cfg.update(rope_theta=500000.0, rope_scaling=LLAMA3_ROPE)
    mod = mlx_qwen2 if variant == "qwen2" else mlx_llama
    module = mod.Model(mod.ModelArgs.from_dict(cfg))
    # Random init is near-uniform; widen the weights so logits differ visibly per input.
    params = module.parameters()
    noisy = [(k, v + 0.05 * mx.random.normal(v.shape)) for k, v in _flat(params)]
    module.load_weights(noisy)
    mx.eval(module.parameters())
    return MLXBackend(module, cfg, "float32", max_cache_len)


def _flat(tree: object, prefix: str = "") -> list[tuple[str, mx.array]]:
    if isinstance(tree, dict):
        return [kv for k, v in tree.items() for kv in _flat(v, f"{prefix}{k}.")]
    if isinstance(tree, list):
        return [kv for i, v in enumerate(tree) for kv in _flat(v, f"{prefix}{i}.")]
    return [(prefix[:-1], tree)]  # type: ignore[list-item]


def ref_last(be: MLXBackend, ids: list[int]) -> np.ndarray:
    """(V,) the module's own logits for the next token after ``ids`` (no cache)."""
    out = be.model.module(mx.array([ids]))  # (1, T, V)
    return np.array(out[0, -1])


@pytest.fixture(params=["llama", "tied", "qwen2", "llama3"])
def tiny(request: pytest.FixtureRequest) -> MLXBackend:
    return tiny_backend(request.param)


def test_tree_rows_equal_sequential_paths(tiny: MLXBackend) -> None:
    tree = DraftTree.from_paths(TREE_PATHS)
    tiny.prefill(np.array(CONTEXT[:-1]))
    out = tiny.verify(CONTEXT[-1], tree, need_logits=True)
    assert out.logits is not None and out.logits.shape == (len(tree) + 1, V)
    np.testing.assert_allclose(out.logits[0], ref_last(tiny, CONTEXT), atol=ATOL)
    for node in range(len(tree)):
        path = CONTEXT + tree.tokens[tree.path_to(node)].tolist()
        np.testing.assert_allclose(out.logits[node + 1], ref_last(tiny, path), atol=ATOL)
    np.testing.assert_array_equal(out.argmax, out.logits.argmax(axis=1))


@pytest.mark.parametrize("leaf", [0, 6, 5, 2])  # in place; gathers from deeper rows
def test_commit_then_plain_steps(leaf: int) -> None:
    be = tiny_backend("llama")
    tree = DraftTree.from_paths(TREE_PATHS)  # tokens [5, 9, 11, 6, 8, 10, 7]
    path = tree.path_to(leaf)
    be.prefill(np.array(CONTEXT[:-1]))
    first = be.verify(CONTEXT[-1], tree, need_logits=False)
    be.commit(np.array([0] + [p + 1 for p in path]))
    seq = CONTEXT + tree.tokens[path].tolist()
    assert be.cache_len == len(seq)
    seq.append(int(first.argmax[path[-1] + 1]))  # the bonus token is the next root
    for _ in range(3):
        out = be.verify(seq[-1], DraftTree.empty(), need_logits=True)
        be.commit(np.array([0]))
        assert out.logits is not None
        np.testing.assert_allclose(out.logits[0], ref_last(be, seq), atol=ATOL)
        seq.append(int(out.argmax[0]))


def test_trim_and_reset() -> None:
    be = tiny_backend("llama")
    be.prefill(np.array(CONTEXT[:-1]))
    be.verify(CONTEXT[-1], DraftTree.chain([1, 2, 3]), need_logits=False)
    be.commit(np.array([0, 1, 2]))
    be.trim(4)
    out = be.verify(CONTEXT[4], DraftTree.empty(), need_logits=True)
    assert out.logits is not None
    np.testing.assert_allclose(out.logits[0], ref_last(be, CONTEXT[:5]), atol=ATOL)
    be.reset()
    assert be.cache_len == 0
    be.prefill(np.array([7, 8]))
    out = be.verify(9, DraftTree.empty(), need_logits=True)
    assert out.logits is not None
    np.testing.assert_allclose(out.logits[0], ref_last(be, [7, 8, 9]), atol=ATOL)


def test_prefill_chunks_and_cache_growth(monkeypatch: pytest.MonkeyPatch) -> None:
    # Small chunks and growth steps cross both boundaries several times.
    monkeypatch.setattr(backend_mod, "PREFILL_CHUNK", 3)
    monkeypatch.setattr(llama_mod, "GROW", 4)
    be = tiny_backend("llama")
    ids = [int(t) for t in np.random.default_rng(0).integers(0, V, 13)]
    be.prefill(np.array(ids[:-1]))
    tree = DraftTree.from_paths([[1, 2, 3], [4]])
    out = be.verify(ids[-1], tree, need_logits=True)
    assert out.logits is not None
    np.testing.assert_allclose(out.logits[0], ref_last(be, ids), atol=ATOL)
    np.testing.assert_allclose(out.logits[3], ref_last(be, ids + [1, 2]), atol=ATOL)


def test_user_errors() -> None:
    be = tiny_backend("llama", max_cache_len=8)
    with pytest.raises(DraftwiseError, match="without a preceding verify"):
        be.commit(np.array([0]))
    with pytest.raises(DraftwiseError, match="token id 97 outside"):
        be.prefill(np.array([1, 97]))
    with pytest.raises(DraftwiseError, match="context limit 8"):
        be.prefill(np.arange(9))
    be.prefill(np.arange(3))
    with pytest.raises(DraftwiseError, match="cannot trim the cache to 5"):
        be.trim(5)
    be.verify(3, DraftTree.chain([4, 5]), need_logits=False)
    with pytest.raises(DraftwiseError, match=r"commit rows \[0, 3\]"):
        be.commit(np.array([0, 3]))


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(DraftwiseError, match="unknown dtype 'int3'"):
        MLXBackend.from_pretrained(tmp_path, dtype="int3")
    with pytest.raises(DraftwiseError, match="no config.json"):
        MLXBackend.from_pretrained(tmp_path, dtype="float32")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(DraftwiseError, match="unsupported model_type 'gpt2'"):
        MLXBackend.from_pretrained(tmp_path, dtype="float32")


def test_hf_dir_with_rope_parameters_matches_transformers(tmp_path: Path) -> None:
    """A transformers-5 checkpoint keeps theta in ``rope_parameters``; mlx-lm alone
    would ignore it. Compare with transformers' own logits."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    st = pytest.importorskip("safetensors.torch")
    torch.manual_seed(0)
    hf = {k: v for k, v in TINY.items() if k != "rms_norm_eps"}
    cfg = transformers.LlamaConfig(
        **hf,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    st.save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        str(tmp_path / "model.safetensors"),
    )
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    be = MLXBackend.from_pretrained(tmp_path, dtype="float32")
    be.prefill(np.array(CONTEXT[:-1]))
    out = be.verify(CONTEXT[-1], DraftTree.chain([5, 6]), need_logits=True)
    with torch.no_grad():
        ref = model(torch.tensor([CONTEXT + [5, 6]])).logits[0, -3:].numpy()
    assert out.logits is not None
    np.testing.assert_allclose(out.logits, ref, atol=ATOL)


def test_a_config_that_does_not_fit_its_tensors_is_one_line(tmp_path: Path) -> None:
    """A model directory is user input: mlx-lm's strict load compares every tensor's
    shape with the module the config builds; the mismatch is one line naming it."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    st = pytest.importorskip("safetensors.torch")
    hf = {k: v for k, v in TINY.items() if k != "rms_norm_eps"}
    cfg = transformers.LlamaConfig(**hf, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).eval()
    st.save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                 str(tmp_path / "model.safetensors"))
    bad = cfg.to_dict() | {"head_dim": 2 * cfg.hidden_size // cfg.num_attention_heads}
    (tmp_path / "config.json").write_text(json.dumps(bad))
    with pytest.raises(DraftwiseError, match=r"Expected shape .* but received shape .*q_proj") as e:
        MLXBackend.from_pretrained(tmp_path, dtype="float32")
    assert "\n" not in str(e.value)
