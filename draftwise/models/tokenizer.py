"""A light tokenizer: the ``tokenizers`` library plus jinja2 chat templates, no transformers.

Importing transformers costs seconds of start-up, so this module reads a HF-format model
directory itself: ``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``
(which wins over ``tokenizer_config.json["chat_template"]``, as in transformers),
``generation_config.json`` and ``config.json``. Chat templates render exactly like
``transformers``' ``apply_chat_template(..., tokenize=False)``.

Example::

    >>> tok = Tokenizer.from_dir(model_dir)  # doctest: +SKIP
    >>> ids = tok.encode_chat([{"role": "user", "content": "Hi!"}])  # doctest: +SKIP
    >>> detok = StreamingDetokenizer(tok)  # doctest: +SKIP
    >>> "".join(detok.add([i]) for i in ids) + detok.finalize() == tok.decode(ids)  # doctest: +SKIP
    True
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import tokenizers
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from draftwise.errors import DraftwiseError

_SPECIAL_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class Tokenizer:
    """Text <-> token ids for one model directory, plus its chat template.

    Example::

        >>> tok = Tokenizer.from_dir(model_dir)  # doctest: +SKIP
        >>> tok.decode(tok.encode("Hello world"))  # doctest: +SKIP
        'Hello world'
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        special_tokens: Mapping[str, str],
        eos_token_ids: Iterable[int],
        chat_template: str | None,
        identity: str,
    ) -> None:
        self.backend = backend
        self.special_tokens = dict(special_tokens)
        self.eos_token_ids: frozenset[int] = frozenset(eos_token_ids)
        self.chat_template = chat_template
        self._identity = identity
        self._template: jinja2.Template | None = None
        bos = self.special_tokens.get("bos_token")
        self.bos_token_id: int | None = backend.token_to_id(bos) if bos else None
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_dir(cls, model_dir: str | os.PathLike[str]) -> Tokenizer:
        """Load the tokenizer of a HF-format model directory.

        Example::

            >>> Tokenizer.from_dir("/models/SmolLM2-135M-Instruct").eos_token_ids  # doctest: +SKIP
            frozenset({2})
        """
        root = Path(model_dir)
        path = root / "tokenizer.json"
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raise DraftwiseError(f"tokenizer file not found: '{path}'") from None
        try:
            backend = tokenizers.Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as exc:  # the Rust side raises a bare Exception
            raise DraftwiseError(f"cannot read tokenizer file '{path}': {exc}") from exc
        tok_config = _read_json(root / "tokenizer_config.json")
        special = {
            name: text for name in _SPECIAL_NAMES if (text := _token_text(tok_config.get(name)))
        }
        eos_ids: set[int] = set()
        if (eos := special.get("eos_token")) is not None and (
            eos_id := backend.token_to_id(eos)
        ) is not None:
            eos_ids.add(eos_id)
        for name in ("generation_config.json", "config.json"):
            eos_ids.update(_as_ids(_read_json(root / name).get("eos_token_id")))
        return cls(
            backend,
            special_tokens=special,
            eos_token_ids=eos_ids,
            chat_template=_find_chat_template(root, tok_config),
            identity=hashlib.sha256(raw).hexdigest(),
        )

    # -- plain text ---------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text`` (``add_special_tokens`` runs the post-processor, e.g. BOS).

        Example::

            >>> tok.encode("Hello")  # doctest: +SKIP
            [19556]
        """
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``.

        Example::

            >>> tok.decode([19556])  # doctest: +SKIP
            'Hello'
        """
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        """Id of the vocabulary entry ``token`` (e.g. ``"<|im_end|>"``), or None.

        Example::

            >>> tok.token_to_id("<|im_end|>")  # doctest: +SKIP
            2
        """
        return self.backend.token_to_id(token)

    def identity(self) -> str:
        """SHA-256 hex digest of the ``tokenizer.json`` bytes (ties saved drafter tables to it).

        Example::

            >>> len(tok.identity())  # doctest: +SKIP
            64
        """
        return self._identity

    # -- chat -----------------------------------------------------------------------------

    @property
    def has_chat_template(self) -> bool:
        """Whether the model directory ships a chat template."""
        return bool(self.chat_template)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> str:
        """Render ``messages`` (``[{"role": ..., "content": ...}, ...]``) with the chat template.

        Example::

            >>> tok.apply_chat_template([{"role": "user", "content": "Hi"}])  # doctest: +SKIP
            '<|im_start|>system\\n...<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
        """
        if not self.chat_template:
            raise DraftwiseError(
                "this model has no chat template; give a plain prompt instead of messages"
            )
        if isinstance(messages, (str, bytes)) or not messages:
            raise DraftwiseError(f"messages must be a non-empty list of dicts, got {messages!r}")
        chat: list[dict[str, Any]] = []
        for message in messages:
            if not isinstance(message, Mapping):
                raise DraftwiseError(
                    f"each message must be a dict with 'role' and 'content', got {message!r}"
                )
            clean = {key: value for key, value in message.items() if value is not None}
            reasoning = next(
                (clean[k] for k in _REASONING_FIELDS if clean.get(k) is not None), None
            )
            if reasoning is not None:  # the names transformers also fills in
                clean = {"thinking": reasoning, **clean, "reasoning_content": reasoning}
            chat.append(clean)
        if self._template is None:
            self._template = _compile_template(self.chat_template)
        try:
            return self._template.render(
                messages=chat,
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        except jinja2.TemplateError as exc:
            raise DraftwiseError(f"the chat template rejected the messages: {exc}") from exc

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of the rendered chat (no extra special tokens, like transformers).

        Example::

            >>> tok.encode_chat([{"role": "user", "content": "Hi"}])[:1]  # doctest: +SKIP
            [1]
        """
        return self.encode(
            self.apply_chat_template(messages, add_generation_prompt), add_special_tokens=False
        )


class StreamingDetokenizer:
    """Turn a stream of token ids into text pieces whose concatenation is the full decode.

    Keeps a small window of tokens (the ones before the last emitted text, for context,
    plus the pending ones), so each ``add`` costs O(new tokens) amortised. Text ending in an
    incomplete UTF-8 character (decoded as ``'\\ufffd'``) is held back until completed.

    Example::

        >>> detok = StreamingDetokenizer(tok)  # doctest: +SKIP
        >>> pieces = [detok.add([i]) for i in ids] + [detok.finalize()]  # doctest: +SKIP
        >>> "".join(pieces) == tok.decode(ids)  # doctest: +SKIP
        True
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self._prefix_offset = 0  # window start: tokens kept only for decoding context
        self._read_offset = 0  # tokens before this have been emitted as text

    def _decode(self, start: int, end: int | None = None) -> str:
        return self.tokenizer.decode(self.token_ids[start:end], self.skip_special_tokens)

    def add(self, token_ids: Iterable[int]) -> str:
        """Append ``token_ids`` and return the text they completed ("" if none yet)."""
        self.token_ids.extend(int(t) for t in token_ids)
        if len(self.token_ids) == self._read_offset:
            return ""
        prefix = self._decode(self._prefix_offset, self._read_offset)
        text = self._decode(self._prefix_offset)
        if len(text) <= len(prefix) or text.endswith("\ufffd"):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self.token_ids)
        return text[len(prefix) :]

    def finalize(self) -> str:
        """Return whatever text is still held back (e.g. a trailing incomplete character)."""
        if len(self.token_ids) == self._read_offset:
            return ""
        prefix = self._decode(self._prefix_offset, self._read_offset)
        text = self._decode(self._prefix_offset)
        self._prefix_offset = self._read_offset = len(self.token_ids)
        return text[len(prefix) :]


# -- helpers ------------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    """Contents of an optional JSON object file ({} if missing)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DraftwiseError(f"cannot read '{path}': {exc}") from exc
    if not isinstance(data, dict):
        raise DraftwiseError(f"'{path}' does not hold a JSON object")
    return data


def _token_text(value: Any) -> str | None:
    """A special token as saved in tokenizer_config.json: a string or ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _as_ids(value: Any) -> list[int]:
    """``eos_token_id`` as saved in a config: an int, a list of ints, or missing."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _find_chat_template(root: Path, tok_config: Mapping[str, Any]) -> str | None:
    """``chat_template.jinja`` if present, else the (default) template in tokenizer_config."""
    path = root / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    return template if isinstance(template, str) and template else None


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}`` (assistant-mask markers): render the body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _compile_template(source: str) -> jinja2.Template:
    """Compile a chat template in the same sandbox setup as transformers."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, "jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise DraftwiseError(f"the model's chat template is invalid: {exc}") from exc
