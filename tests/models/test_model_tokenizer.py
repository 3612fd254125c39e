"""Tokenizer and StreamingDetokenizer against transformers' own tokenizer."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from draftwise.errors import DraftwiseError
from draftwise.models import StreamingDetokenizer, Tokenizer

TEXTS = [
    "Hello world!",
    "  leading spaces and\ttabs\nnew lines\n\n",
    "Émoji 😀👍🏽 and CJK 你好世界, math ∑∫ and ZWJ 👨‍👩‍👧",
    "def f(x):\n    return x ** 2  # code",
    "<|im_start|>user\nspecial tokens inline<|im_end|>",
]

CHATS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"}],
    [
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "Apple."},
        {"role": "user", "content": "Another, with an emoji 🍌?"},
    ],
    [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ],
]


@pytest.fixture(scope="module")
def tok(default_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(default_model_dir)


@pytest.fixture(scope="module")
def hf_tok(default_model_dir: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(default_model_dir)


def test_basic_attributes(tok: Tokenizer) -> None:
    assert tok.eos_token_ids == frozenset({2})
    assert tok.token_to_id("<|im_end|>") == 2
    assert tok.bos_token_id == 1
    assert tok.vocab_size == 49152
    assert tok.has_chat_template
    assert len(tok.identity()) == 64


def test_identity_is_file_hash(tok: Tokenizer, default_model_dir: Path) -> None:
    import hashlib

    assert (
        tok.identity()
        == hashlib.sha256((default_model_dir / "tokenizer.json").read_bytes()).hexdigest()
    )


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_and_matches_transformers(tok: Tokenizer, hf_tok: Any, text: str) -> None:
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert ids == hf_tok.encode(text, add_special_tokens=False)
    assert tok.encode(text, add_special_tokens=True) == hf_tok.encode(text, add_special_tokens=True)
    assert tok.decode(ids, skip_special_tokens=True) == hf_tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("messages", CHATS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(
    tok: Tokenizer, hf_tok: Any, messages: list[dict[str, Any]], add_generation_prompt: bool
) -> None:
    expected = hf_tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert (
        tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == expected
    )
    expected_ids = hf_tok.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=add_generation_prompt
    )
    if isinstance(expected_ids, dict) or hasattr(expected_ids, "keys"):
        expected_ids = expected_ids["input_ids"]
    assert tok.encode_chat(messages, add_generation_prompt=add_generation_prompt) == list(
        expected_ids
    )


CUSTOM_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] not in ['user', 'assistant', 'system'] %}"
    "{{ raise_exception('bad role') }}{% endif %}"
    "{% if m['role'] == 'assistant' %}"
    "{% generation %}{{ m['content'] | tojson }}{% endgeneration %}"
    "{% else %}{{ m['role'] }}: {{ m['content'] }}\n{% endif %}"
    "{% if loop.index > 5 %}{% break %}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}{{ eos_token }}"
)


def test_custom_template_features_match_transformers(
    default_model_dir: Path, tmp_path: Path
) -> None:
    transformers = pytest.importorskip("transformers")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_dir / name, tmp_path / name)
    (tmp_path / "chat_template.jinja").write_text(CUSTOM_TEMPLATE)
    ours = Tokenizer.from_dir(tmp_path)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    messages = [
        {"role": "user", "content": 'say "hi" ü'},
        {"role": "assistant", "content": 'hi "ü"'},
    ]
    assert ours.apply_chat_template(messages) == theirs.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    with pytest.raises(DraftwiseError, match="bad role"):
        ours.apply_chat_template([{"role": "robot", "content": "x"}])


def test_chat_errors(tok: Tokenizer, tmp_path: Path, default_model_dir: Path) -> None:
    with pytest.raises(DraftwiseError, match="non-empty list"):
        tok.apply_chat_template([])
    with pytest.raises(DraftwiseError, match="must be a dict"):
        tok.apply_chat_template(["hello"])  # type: ignore[list-item]
    shutil.copy(default_model_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    bare = Tokenizer.from_dir(tmp_path)
    assert not bare.has_chat_template and bare.eos_token_ids == frozenset()
    with pytest.raises(DraftwiseError, match="no chat template"):
        bare.apply_chat_template([{"role": "user", "content": "x"}])


def test_missing_tokenizer_file(tmp_path: Path) -> None:
    with pytest.raises(DraftwiseError, match="tokenizer file not found"):
        Tokenizer.from_dir(tmp_path)


def _stream(
    tok: Tokenizer, ids: list[int], chunk_sizes: list[int], skip: bool = False
) -> list[str]:
    detok = StreamingDetokenizer(tok, skip_special_tokens=skip)
    pieces, pos = [], 0
    for size in chunk_sizes:
        pieces.append(detok.add(ids[pos : pos + size]))
        pos += size
    pieces.append(detok.add(ids[pos:]))
    pieces.append(detok.finalize())
    return pieces


@pytest.mark.parametrize("text", TEXTS)
def test_streaming_equals_full_decode(tok: Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    rng = random.Random(0)
    for sizes in ([1] * len(ids), [rng.randint(0, 3) for _ in range(len(ids))], []):
        for skip in (False, True):
            pieces = _stream(tok, ids, sizes, skip)
            assert "".join(pieces) == tok.decode(ids, skip_special_tokens=skip)
            assert all("\ufffd" not in p for p in pieces)


def test_streaming_holds_back_partial_characters(tok: Tokenizer) -> None:
    ids = tok.encode("😀")
    assert len(ids) > 1  # byte-level BPE splits the emoji
    detok = StreamingDetokenizer(tok)
    assert detok.add(ids[:1]) == ""
    assert detok.add(ids[1:]) == "😀"
    assert detok.finalize() == ""


def test_finalize_flushes_incomplete_tail(tok: Tokenizer) -> None:
    ids = tok.encode("ok 😀")
    detok = StreamingDetokenizer(tok)
    text = detok.add(ids[:-1]) + detok.finalize()
    assert text == tok.decode(ids[:-1]) and text.endswith("\ufffd")
