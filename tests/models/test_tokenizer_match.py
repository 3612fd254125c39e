"""A draft model must share the target's tokenizer; a different one is refused in one line
that says how they differ."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from draftwise.errors import DraftwiseError
from draftwise.models import Tokenizer
from draftwise.models.tokenizer_match import check_same_tokenizer, tokenizer_difference


def variant(src: Path, dst: Path, edit) -> Tokenizer:  # type: ignore[no-untyped-def]
    dst.mkdir()
    for name in ("tokenizer_config.json", "config.json", "generation_config.json"):
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    data = json.loads((src / "tokenizer.json").read_text())
    edit(data)
    (dst / "tokenizer.json").write_text(json.dumps(data, indent=1))
    return Tokenizer.from_dir(dst)


def test_same_and_reformatted_tokenizers_pass(default_model_dir, tmp_path):  # type: ignore[no-untyped-def]
    target = Tokenizer.from_dir(default_model_dir)
    check_same_tokenizer(target, Tokenizer.from_dir(default_model_dir), "x")
    same = variant(default_model_dir, tmp_path / "same", lambda d: None)  # other bytes
    assert same.identity() != target.identity()
    assert tokenizer_difference(target, same) is None


def test_other_tokenizers_refused_with_the_difference(default_model_dir, tmp_path):  # type: ignore[no-untyped-def]
    target = Tokenizer.from_dir(default_model_dir)

    def rename(d):  # type: ignore[no-untyped-def]
        vocab = d["model"]["vocab"]
        tok = next(t for t, i in vocab.items() if i == 1000)
        vocab["zz-renamed"] = vocab.pop(tok)
        d["model"]["merges"] = []  # merges name tokens: drop them (the vocabulary decides)

    def shrink(d):  # type: ignore[no-untyped-def]
        d["model"]["vocab"] = {t: i for t, i in d["model"]["vocab"].items() if i < 40000}
        d["model"]["merges"] = []

    renamed = variant(default_model_dir, tmp_path / "renamed", rename)
    want = r"draft model 'd1' has another tokenizer: token id 1000 is 'zz-renamed'"
    with pytest.raises(DraftwiseError, match=want):
        check_same_tokenizer(target, renamed, "d1")
    smaller = variant(default_model_dir, tmp_path / "smaller", shrink)
    want = r"vocabulary of 40000 tokens, the target's has 49152"
    with pytest.raises(DraftwiseError, match=want) as e:
        check_same_tokenizer(target, smaller, "d2")
    assert "\n" not in str(e.value)


@pytest.mark.slow
@pytest.mark.torch
def test_build_draft_lm_refuses_other_tokenizer(torch_model, default_model_dir, tmp_path):  # type: ignore[no-untyped-def]
    from draftwise.drafting.draft_models import build_draft_lm

    other = tmp_path / "other"
    other.mkdir()
    for f in default_model_dir.iterdir():
        (other / f.name).symlink_to(f)
    (other / "tokenizer.json").unlink()
    data = json.loads((default_model_dir / "tokenizer.json").read_text())
    data["model"]["vocab"] = {t: i for t, i in data["model"]["vocab"].items() if i < 30000}
    data["model"]["merges"] = []
    (other / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(DraftwiseError, match="has another tokenizer: vocabulary of 30000"):
        build_draft_lm(torch_model.drafting, other)
    lm = build_draft_lm(torch_model.drafting, default_model_dir)  # the same model drafts for itself
    assert lm.vocab_size == torch_model.backend.vocab_size
