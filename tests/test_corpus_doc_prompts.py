"""``scripts/corpus_doc_prompts.py``: training prompts from the corpus's text and code, and
``scripts/gguf_to_hf_dir.py``: a GGUF dequantised without transformers equals the
converter's folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.scripts import SCRIPTS, load_script


def test_chunks_keep_whole_blocks_and_cut_long_ones():
    mod = load_script("corpus_doc_prompts")
    assert mod.chunks("a\n\nb\n\nc", 4) == ["a\n\nb", "c"]
    assert mod.chunks("a\n\nb\n\nc", 4, offset=1) == ["b\n\nc"]
    long = "\n".join(f"line {i:03d} " + "x" * 50 for i in range(40))
    (one,) = mod.chunks(long, 300)
    assert one.startswith("line 000") and len(one) <= 600


def test_prompts_are_written_in_the_corpus_format(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    paras = "\n\n".join(f"Paragraph {i}. " * 20 for i in range(6))
    (corpus / "docs.txt").write_text("PEP 1\n\n" + paras)
    banner = "# ===== TheAlgorithms/Python: a.py =====\n"
    (corpus / "code.txt").write_text(banner + "def f():\n    return 1\n")
    out = tmp_path / "p.jsonl"
    cmd = [sys.executable, str(SCRIPTS / "corpus_doc_prompts.py"), "--corpus", str(corpus),
           "--out", str(out), "--size", "400"]
    subprocess.run(cmd, check=True, capture_output=True)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert {r["id"].split("-")[0] for r in rows} == {"docs", "code"}
    assert all(r["response"] is None and r["prompt"].strip() for r in rows)
    code = [r for r in rows if r["id"].startswith("code")]
    assert "def f():" in code[0]["prompt"] and "=====" not in code[0]["prompt"]
    bad = subprocess.run(cmd[:-2] + ["--size", "10"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--size must be >= 100" in bad.stderr


def test_unpermute_inverts_the_gguf_permutation():
    mod = load_script("gguf_to_hf_dir")
    w = np.arange(2 * 8 * 3, dtype=np.float32).reshape(16, 3)  # 2 heads of 8 rows
    heads = 2
    # convert_hf_to_gguf.py's llama permute
    g = w.reshape(heads, 2, w.shape[0] // heads // 2, 3).swapaxes(1, 2).reshape(w.shape)
    assert np.array_equal(mod.unpermute(g, heads), w)


def test_the_default_gguf_dequantised_equals_the_converters_folder(default_model_dir, tmp_path):
    pytest.importorskip("gguf")
    from safetensors.numpy import load_file

    src = json.loads((default_model_dir / "source.json").read_text()).get("gguf", "")
    if not Path(src).is_file():
        pytest.skip(f"the default model's GGUF is not at {src!r}")
    out = tmp_path / "m"
    cmd = [sys.executable, str(SCRIPTS / "gguf_to_hf_dir.py"), src, "--meta",
           str(default_model_dir), "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    got = load_file(str(out / "model.safetensors"))
    want = load_file(str(default_model_dir / "model.safetensors"))
    assert sorted(got) == sorted(want)
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert (out / "tokenizer.json").is_file() and not (out / "source.json").exists()
