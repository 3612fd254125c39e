"""The model families people run, end to end on both backends: a small random
checkpoint of each family's transformers config (the default model's tokenizer, no
download) gives transformers' greedy ``generate`` token for token with ``none``, ``auto``,
``redrafter`` (a random network) and ``draft`` (early exit); seeded T = 0.8 equals
``none``; in the bf16 invariant mode a row alone equals the same row inside a tree."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from draftwise.core.tree import DraftTree  # noqa: E402
from tests.invariance import plain_logits, tree_with_path  # noqa: E402

pytestmark = pytest.mark.torch
SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)
TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
N = 24
WINDOW = 8  # gemma's sliding window: far shorter than the prompts and outputs here


def family_config(family: str, vocab: int):
    if family == "llama3":
        return transformers.LlamaConfig(**SIZES, vocab_size=vocab, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    if family == "qwen2":
        return transformers.Qwen2Config(**SIZES, vocab_size=vocab, tie_word_embeddings=False)
    if family == "qwen3":
        return transformers.Qwen3Config(**SIZES, vocab_size=vocab, head_dim=24, tie_word_embeddings=True)
    if family == "mistral":
        return transformers.MistralConfig(**SIZES, vocab_size=vocab, sliding_window=None)
    if family == "phi3":  # qkv_proj and gate_up_proj, as Phi-3-mini-4k
        return transformers.Phi3Config(**SIZES, vocab_size=vocab, pad_token_id=0)
    if family == "phi3-longrope":  # as Phi-4-mini: LongRoPE over the first half of each head
        return transformers.Phi3Config(**SIZES, vocab_size=vocab, pad_token_id=0, partial_rotary_factor=0.5,
                                       original_max_position_embeddings=128, rope_parameters={
                                           "rope_type": "longrope", "rope_theta": 10000.0,
                                           "short_factor": [1.0, 1.3, 1.9, 2.6], "long_factor": [4.0] * 4})
    if family == "gemma2":  # soft-capping, (1 + w) norms, sandwich norms, GeGLU, scaled queries
        return transformers.Gemma2Config(**SIZES, vocab_size=vocab, head_dim=16, query_pre_attn_scalar=24,
                                         attn_logit_softcapping=1.5, final_logit_softcapping=3.0,
                                         sliding_window=WINDOW)
    if family == "gemma3":  # + q/k norms and a second RoPE base for the sliding layers
        return transformers.Gemma3TextConfig(**SIZES, vocab_size=vocab, head_dim=16, query_pre_attn_scalar=16,
                                             layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                             sliding_window=WINDOW)
    if family == "gemma3-mm":  # an image-text checkpoint (Gemma 3 4B+): its text model
        return transformers.Gemma3Config(mm_tokens_per_image=4, text_config=dict(
            **SIZES, vocab_size=vocab, head_dim=16, query_pre_attn_scalar=16, sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"]), vision_config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
            patch_size=14))
    if family == "llama-linear":  # linear RoPE scaling
        return transformers.LlamaConfig(**SIZES, vocab_size=vocab, rope_parameters={
            "rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})
    raise AssertionError(family)


def save_family(family: str, out: Path, default_model_dir: Path):
    """A random checkpoint of ``family``, widened so that its greedy text varies."""
    vocab = json.loads((default_model_dir / "config.json").read_text())["vocab_size"]
    cfg = family_config(family, vocab)
    torch.manual_seed(0)
    if family == "gemma3-mm":
        model = transformers.Gemma3ForConditionalGeneration(cfg).eval()
    else:
        model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    out.mkdir(parents=True)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    if family == "gemma3-mm":  # the Hub files' names (transformers 5 would write model.language_model.*)
        hub = (("model.language_model.", "language_model.model."), ("model.vision_tower.", "vision_tower."),
               ("model.multi_modal_projector.", "multi_modal_projector."))
        for old, new in hub:
            sd = {(new + k[len(old):] if k.startswith(old) else k): v for k, v in sd.items()}
    safetensors_torch.save_file(sd, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg.to_dict()))
    for name in TOKENIZER:
        if (default_model_dir / name).exists():
            (out / name).write_bytes((default_model_dir / name).read_bytes())
    return out, model


@pytest.fixture(scope="module", params=["llama3", "qwen2", "qwen3", "mistral", "phi3", "llama-linear",
                                        "gemma2", "gemma3", "gemma3-mm", "phi3-longrope"])
def family(request, default_model_dir, tmp_path_factory):
    return request.param, *save_family(request.param, tmp_path_factory.mktemp(request.param) / "model",
                                       default_model_dir)


def random_redrafter(model, out: Path) -> Path:
    from draftwise.backends.cuda.redrafter.checkpoint import save_redrafter, weights_fingerprint
    from draftwise.backends.cuda.redrafter.net import ReDrafterNet
    from draftwise.core.drafters.redrafter_ckpt import ReDrafterConfig

    embed = model.backend.model.embed
    torch.manual_seed(1)
    cfg = ReDrafterConfig(int(embed.shape[1]), int(embed.shape[0]), 1024, 1,
                          model.drafting.tokenizer_id, weights_fingerprint(embed), context_dim=16)
    return save_redrafter(ReDrafterNet(cfg, embed.float(), torch.arange(1024)), out)


def ids_of(model, prompt, drafter, **kw) -> list[int]:
    import draftwise

    last = None
    for r in draftwise.stream_generate(model, prompt, drafter=drafter, max_tokens=N,
                                       chat_template=False, **kw):
        last = r
    return list(last.token_ids)


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_greedy_equals_transformers_generate_with_every_drafter(family, backend, tmp_path):
    import draftwise

    if backend == "mlx":
        pytest.importorskip("mlx_lm")
    name, model_dir, ref = family
    prompt = list(np.random.default_rng(0).integers(100, 20000, 12))
    with torch.no_grad():
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=N, do_sample=False,
                            pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
    model = draftwise.load(model_dir, backend=backend, dtype="float32")
    ckpt = random_redrafter(draftwise.load(model_dir, backend="torch", dtype="float32"),
                            tmp_path / "redrafter")
    for drafter in ("none", "auto", f"redrafter:bw=2,t=3,path={ckpt}", "draft:layers=1"):
        got = ids_of(model, prompt, drafter)
        n = len(got)  # an end-of-text token of the tokenizer may stop draftwise early
        assert n and got == want[:n], f"{name} {backend} {drafter}: {got} != {want[:n]}"
    hot = ids_of(model, prompt, "none", temp=0.8, seed=3)
    for drafter in ("auto", f"redrafter:bw=2,t=3,path={ckpt}"):
        assert ids_of(model, prompt, drafter, temp=0.8, seed=3) == hot, f"{name} {backend} {drafter}"


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_bf16_invariant_row_alone_equals_the_row_in_a_tree(family, backend):
    name, model_dir, _ = family
    if backend == "mlx":
        if not name.startswith("gemma"):
            pytest.skip("the MLX invariant mode has its own tests (tests/backends/mlx); here: gemma's windows")
        pytest.importorskip("mlx_lm")
        from draftwise.backends.mlx import MLXBackend

        be = MLXBackend.from_pretrained(model_dir, dtype="bfloat16", invariant=True)
    else:
        from draftwise.backends.cuda import TorchBackend

        be = TorchBackend.from_pretrained(model_dir, dtype="bfloat16", device="cpu", invariant=True)
    rng = np.random.default_rng(4)
    ctx = rng.integers(100, 20000, 40)
    path = [int(t) for t in rng.integers(100, 20000, 3)]
    be.prefill(ctx[:-1])
    alone = plain_logits(be, ctx, path)
    tree, rows = tree_with_path(rng, path, 9, 20000)
    out = be.verify(int(ctx[-1]), tree, need_logits=True)
    assert out.logits is not None
    for i, row in enumerate(rows):
        assert np.array_equal(out.logits[row], alone[i]), f"{name}: row {row} differs"
    assert be.verify(int(ctx[-1]), DraftTree.empty(), need_logits=True).logits is not None


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_logits_match_transformers(family, backend):
    """float32 logits of a prefill and a 6-token chain verify against transformers' own
    forward: the discriminating check (random models' greedy text repeats a lot)."""
    name, model_dir, ref = family
    if backend == "mlx":
        pytest.importorskip("mlx_lm")
        from draftwise.backends.mlx import MLXBackend as Backend
    else:
        from draftwise.backends.cuda import TorchBackend as Backend
    ids = np.random.default_rng(5).integers(100, 20000, 30)
    with torch.no_grad():
        want = ref(torch.tensor([ids.tolist()])).logits[0].numpy()  # (30, V)
    # gemma: the invariant mode's block attention too (its windows and soft-capping)
    for invariant in (False, True) if name.startswith("gemma") else (False,):
        be = Backend.from_pretrained(model_dir, dtype="float32", invariant=invariant)
        be.prefill(ids[:23])
        out = be.verify(int(ids[23]), DraftTree.chain(ids[24:30].tolist()), need_logits=True)
        assert out.logits is not None
        np.testing.assert_allclose(out.logits, want[23:30], atol=2e-4,
                                   err_msg=f"{name} {backend} invariant={invariant}")


@pytest.mark.parametrize("bits", [4, 8])
def test_an_mlx_quantized_checkpoint_loads_on_both_backends(bits, default_model_dir, tmp_path, capfd):
    """mlx-community style: MLX runs it as it is; torch dequantises it (saying so in one
    line) and computes the same logits; on each, ``auto`` equals ``none``."""
    pytest.importorskip("mlx_lm")
    from mlx_lm import convert

    import draftwise
    from draftwise.backends.cuda import TorchBackend
    from draftwise.backends.mlx import MLXBackend

    hf, _ = save_family("qwen2", tmp_path / "hf", default_model_dir)
    q = tmp_path / f"q{bits}"
    convert(str(hf), mlx_path=str(q), quantize=True, q_bits=bits, q_group_size=64)
    ids = np.random.default_rng(6).integers(100, 20000, 20)
    logits = []
    for be in (MLXBackend.from_pretrained(q, dtype=f"{bits}bit"), TorchBackend.from_pretrained(q, dtype="float32")):
        be.prefill(ids[:15])
        out = be.verify(int(ids[15]), DraftTree.chain(ids[16:20].tolist()), need_logits=True)
        logits.append(out.logits)
    assert "is MLX-quantized" in capfd.readouterr().err
    np.testing.assert_allclose(logits[1], logits[0], atol=2e-3)
    for backend, dtype in (("mlx", f"{bits}bit"), ("torch", "float32")):
        model = draftwise.load(q, backend=backend, dtype=dtype)
        assert ids_of(model, ids.tolist(), "auto") == ids_of(model, ids.tolist(), "none")
