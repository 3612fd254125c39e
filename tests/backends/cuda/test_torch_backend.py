"""TorchBackend against transformers' reference forward, on tiny random llama-family models.

Every check compares logits (float32, atol 1e-4) with either transformers' full-sequence
forward or this backend's own plain one-token decoding, so any error in RoPE positions,
the tree mask or the cache compaction shows up as a numeric mismatch.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from draftwise.backends.cuda import TorchBackend  # noqa: E402
from draftwise.backends.cuda import backend as backend_mod  # noqa: E402
from draftwise.core.tree import DraftTree  # noqa: E402
from draftwise.errors import DraftwiseError  # noqa: E402

V = 97
ATOL = 1e-4
TINY = dict(
    vocab_size=V,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}


def _save_tiny(path: Path, variant: str) -> tuple[Path, object]:
    torch.manual_seed(0)
    if variant == "qwen2":
        cfg = transformers.Qwen2Config(**TINY, tie_word_embeddings=False)
        model = transformers.Qwen2ForCausalLM(cfg)
    elif variant == "gemma2":  # soft-capped scores and logits, sandwich norms, GeGLU
        cfg = transformers.Gemma2Config(**TINY, head_dim=16, query_pre_attn_scalar=24,
                                        attn_logit_softcapping=1.5, final_logit_softcapping=3.0,
                                        sliding_window=8)
        model = transformers.Gemma2ForCausalLM(cfg)
    elif variant == "qwen3":  # per-head q/k norms; head_dim 24, not hidden / heads = 16
        cfg = transformers.Qwen3Config(**TINY, head_dim=24, tie_word_embeddings=False)
        model = transformers.Qwen3ForCausalLM(cfg)
    else:
        extra: dict = {"tie_word_embeddings": variant == "tied"}
        if variant == "llama3":
            extra["rope_parameters"] = LLAMA3_ROPE
        cfg = transformers.LlamaConfig(**TINY, **extra)
        model = transformers.LlamaForCausalLM(cfg)
    # Random init is near-uniform; widen the weights so logits differ visibly per input.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.eval()
    path.mkdir(parents=True, exist_ok=True)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    safetensors_torch.save_file(sd, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg.to_dict()))
    return path, model


@pytest.fixture(params=["llama", "tied", "qwen2", "llama3", "qwen3"])
def tiny(request, tmp_path):
    """(model_dir, reference transformers model) for each supported variant."""
    return _save_tiny(tmp_path / request.param, request.param)


def _ref_logits(model, ids) -> np.ndarray:
    """(T, V) transformers logits for every position of ``ids``, no cache."""
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits[0].numpy()


def _step(be: TorchBackend, token: int) -> np.ndarray:
    """One plain decoding step; returns the (V,) logits after ``token``."""
    out = be.verify(int(token), DraftTree.empty(), need_logits=True)
    be.commit(np.array([0]))
    assert out.logits is not None and out.argmax[0] == out.logits[0].argmax()
    return out.logits[0].copy()


def _random_tree(rng: np.random.Generator, n: int) -> DraftTree:
    parents = np.array([rng.integers(-1, i) for i in range(n)], dtype=np.int64)
    return DraftTree(rng.integers(0, V, n), parents)


def test_prefill_and_steps_match_transformers(tiny, monkeypatch):
    model_dir, ref_model = tiny
    monkeypatch.setattr(backend_mod, "PREFILL_CHUNK", 7)  # several chunks, one partial
    ids = np.random.default_rng(1).integers(0, V, 40)
    ref = _ref_logits(ref_model, ids)
    be = TorchBackend.from_pretrained(model_dir, device="cpu")
    be.prefill(ids[:30])
    assert be.cache_len == 30
    for i in range(30, 40):
        np.testing.assert_allclose(_step(be, ids[i]), ref[i], atol=ATOL)
    assert be.cache_len == 40


def test_tree_rows_match_sequential_decoding(tiny):
    model_dir, _ = tiny
    rng = np.random.default_rng(2)
    ctx = rng.integers(0, V, 12)
    be = TorchBackend.from_pretrained(model_dir, device="cpu")
    be.prefill(ctx[:-1])
    tree = _random_tree(rng, 15)
    out = be.verify(int(ctx[-1]), tree, need_logits=True)
    assert out.logits is not None and out.logits.shape == (16, V)
    np.testing.assert_array_equal(out.argmax, out.logits.argmax(-1))
    for row in range(16):
        path = [] if row == 0 else tree.tokens[tree.path_to(row - 1)].tolist()
        be.trim(len(ctx) - 1)
        for tok in [int(ctx[-1]), *path]:
            want = _step(be, tok)
        np.testing.assert_allclose(out.logits[row], want, atol=ATOL, err_msg=f"row {row}")


def test_commit_compacts_an_accepted_branch(tiny):
    model_dir, ref_model = tiny
    rng = np.random.default_rng(3)
    ctx = rng.integers(0, V, 10)
    # Two branches; accept the second, whose rows (0, 2, 4) are not a prefix: a real gather.
    tree = DraftTree.from_paths([[5, 6, 7], [8, 9, 10]])
    assert tree.tokens.tolist() == [5, 8, 6, 9, 7, 10]
    be = TorchBackend.from_pretrained(model_dir, device="cpu")
    be.prefill(ctx[:-1])
    out = be.verify(int(ctx[-1]), tree, need_logits=True)
    keep = np.array([0, 2, 4, 6])  # root, 8, 9, 10
    be.commit(keep)
    assert be.cache_len == len(ctx) + 3
    more = rng.integers(0, V, 5)
    seq = [*ctx.tolist(), 8, 9, 10, *more.tolist()]
    ref = _ref_logits(ref_model, seq)
    np.testing.assert_allclose(out.logits[keep], ref[len(ctx) - 1 : len(ctx) + 3], atol=ATOL)
    for j, tok in enumerate(more):
        np.testing.assert_allclose(_step(be, tok), ref[len(ctx) + 3 + j], atol=ATOL)


def test_commit_of_a_chain_prefix(tiny):
    model_dir, ref_model = tiny
    ctx = np.random.default_rng(4).integers(0, V, 8)
    be = TorchBackend.from_pretrained(model_dir, device="cpu")
    be.prefill(ctx[:-1])
    be.verify(int(ctx[-1]), DraftTree.chain([3, 4, 5]), need_logits=False)
    be.commit(np.array([0, 1]))  # accept root and token 3; rows already in place
    ref = _ref_logits(ref_model, [*ctx.tolist(), 3, 11])
    np.testing.assert_allclose(_step(be, 11), ref[-1], atol=ATOL)


def test_trim_and_reset(tiny):
    model_dir, ref_model = tiny
    ids = np.random.default_rng(5).integers(0, V, 20)
    be = TorchBackend.from_pretrained(model_dir, device="cpu")
    be.prefill(ids)
    be.trim(10)
    assert be.cache_len == 10
    ref = _ref_logits(ref_model, [*ids[:10].tolist(), 1, 2])
    _step(be, 1)
    np.testing.assert_allclose(_step(be, 2), ref[-1], atol=ATOL)
    with pytest.raises(DraftwiseError, match="13"):
        be.trim(13)
    be.reset()
    assert be.cache_len == 0
    be.prefill(ids[:3])
    np.testing.assert_allclose(_step(be, ids[3]), _ref_logits(ref_model, ids[:4])[-1], atol=ATOL)


def test_backend_attributes(tiny):
    model_dir, _ = tiny
    be = TorchBackend.from_pretrained(model_dir, device="cpu", max_cache_len=64)
    assert (be.vocab_size, be.context_limit, be.dtype) == (V, 64, "float32")
    assert be.name == "torch-cpu-float32-invariant"  # float32 on a CPU: the mode by default
    assert TorchBackend.from_pretrained(model_dir, device="cpu").context_limit == 256


def test_bfloat16_runs_and_roughly_agrees(tmp_path):
    model_dir, ref_model = _save_tiny(tmp_path / "m", "llama")
    ids = np.arange(10) % V
    be = TorchBackend.from_pretrained(model_dir, dtype="bfloat16", device="cpu")
    assert be.name == "torch-cpu-bfloat16-invariant"  # "auto": bit-exact mode on for bf16 on CPU
    normal = TorchBackend.from_pretrained(model_dir, dtype="bfloat16", device="cpu", invariant=False)
    assert normal.name == "torch-cpu-bfloat16"  # tune profiles keep the two modes apart
    be.prefill(ids[:-1])
    out = be.verify(int(ids[-1]), DraftTree.chain([1, 2]), need_logits=True)
    assert out.logits is not None and out.logits.dtype == np.float32
    np.testing.assert_allclose(out.logits[0], _ref_logits(ref_model, ids)[-1], atol=0.1)


def test_errors(tmp_path):
    model_dir, _ = _save_tiny(tmp_path / "m", "llama")
    be = TorchBackend.from_pretrained(model_dir, device="cpu", max_cache_len=16)
    with pytest.raises(DraftwiseError, match="prefill of 17 tokens.*16"):
        be.prefill(np.zeros(17, np.int64))
    be.prefill(np.zeros(14, np.int64))
    with pytest.raises(DraftwiseError, match="verify of 3 tokens after 14"):
        be.verify(0, DraftTree.chain([1, 2]), need_logits=False)
    with pytest.raises(DraftwiseError, match="token id 97"):
        be.verify(97, DraftTree.empty(), need_logits=False)
    with pytest.raises(DraftwiseError, match="without a preceding verify"):
        be.commit(np.array([0]))
    with pytest.raises(DraftwiseError, match="dtype 'int8'"):
        TorchBackend.from_pretrained(model_dir, dtype="int8")
    cfg = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(DraftwiseError, match="'gpt2'"):
        TorchBackend.from_pretrained(model_dir, device="cpu")
    rope = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}
    (model_dir / "config.json").write_text(json.dumps({**cfg, "rope_parameters": rope}))
    with pytest.raises(DraftwiseError, match="'yarn'"):
        TorchBackend.from_pretrained(model_dir, device="cpu")
    with pytest.raises(DraftwiseError, match="config.json"):
        TorchBackend.from_pretrained(tmp_path / "nowhere", device="cpu")


def test_unused_weights_are_refused(tmp_path):
    # An MLP bias is something the lean forward does not compute: refuse, never ignore.
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**TINY, mlp_bias=True)
    path = tmp_path / "m"
    path.mkdir()
    sd = {k: v.contiguous() for k, v in transformers.LlamaForCausalLM(cfg).state_dict().items()}
    safetensors_torch.save_file(sd, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg.to_dict()))
    with pytest.raises(DraftwiseError, match="mlp.*bias"):
        TorchBackend.from_pretrained(path, device="cpu")


# ----- the real default model ------------------------------------------------------------
@pytest.fixture(scope="module")
def real_model_dir(request) -> Path:
    # Prefer the shared session fixture from tests/conftest.py; fall back to converting here.
    try:
        return Path(request.getfixturevalue("default_model_dir"))
    except pytest.FixtureLookupError:
        from draftwise.models.default import ensure_default_model

        try:
            return ensure_default_model(progress=lambda _msg: None)
        except DraftwiseError as e:
            pytest.skip(str(e))


def test_default_model_matches_transformers_greedy(real_model_dir):
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(
        real_model_dir, dtype=torch.float32
    )
    prompt = [1, 504, 3458, 282, 4649, 314, 260, 1345, 28, 3303, 30]
    with torch.no_grad():
        gen = ref_model.generate(
            torch.tensor([prompt]), max_new_tokens=8, do_sample=False, attention_mask=None
        )[0, len(prompt) :].tolist()
    be = TorchBackend.from_pretrained(real_model_dir, device="cpu", max_cache_len=512)
    be.prefill(np.array(prompt[:-1]))
    # Verify the true continuation as a draft chain: every row must predict the next one.
    out = be.verify(prompt[-1], DraftTree.chain(gen[:-1]), need_logits=True)
    assert out.argmax.tolist() == gen
    ref = _ref_logits(ref_model, prompt + gen[:-1])[len(prompt) - 1 :]
    np.testing.assert_allclose(out.logits, ref, atol=2e-3)
    be.commit(np.arange(len(gen)))
    assert be.cache_len == len(prompt) + len(gen) - 1
