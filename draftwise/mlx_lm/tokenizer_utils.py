"""mlx-lm's ``TokenizerWrapper`` over draftwise's light tokenizer.

mlx-lm hands back a wrapped transformers tokenizer; scripts use a small part of it:
``encode``, ``decode``, ``apply_chat_template``, ``eos_token_id(s)``, ``bos_token``,
``vocab_size``, ``has_chat_template``. This class offers that part with transformers'
defaults (``encode`` adds special tokens, ``apply_chat_template`` tokenizes), without
importing transformers.

Example::

    >>> model, tokenizer = load()  # doctest: +SKIP
    >>> ids = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}],
    ...                                     add_generation_prompt=True)  # doctest: +SKIP
    >>> tokenizer.decode(ids)[:22]  # doctest: +SKIP
    '<|im_start|>system\\nYou '
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from draftwise.errors import DraftwiseError
from draftwise.models.tokenizer import Tokenizer


class TokenizerWrapper:
    """The tokenizer ``draftwise.mlx_lm.load`` returns beside the model."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._extra_eos: set[int] = set()

    # -- text <-> ids --------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (``add_special_tokens`` as transformers: on by default)."""
        if not isinstance(text, str):
            raise DraftwiseError(f"encode takes a string, got {type(text).__name__}: {text!r}")
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: int | Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of one id or a list of ids."""
        seq = [ids] if isinstance(ids, int) else [int(t) for t in ids]
        return self.tokenizer.decode(seq, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tokenize: bool = True,
        **kwargs: Any,
    ) -> list[int] | str:
        """Render ``messages`` with the model's chat template: token ids (``tokenize=True``,
        transformers' default) or the text. ``continue_final_message=False`` and
        ``tools=None`` are accepted; other template options are an error."""
        kwargs = {k: v for k, v in kwargs.items() if _DEFAULT_TEMPLATE_OPTIONS.get(k, ...) != v}
        if kwargs:
            name, value = next(iter(kwargs.items()))
            raise DraftwiseError(
                f"apply_chat_template option {name}={value!r} is not supported by draftwise "
                "(it takes messages, add_generation_prompt and tokenize)"
            )
        if tokenize:
            return self.tokenizer.encode_chat(messages, add_generation_prompt)
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt)

    # -- special tokens ------------------------------------------------------------------

    @property
    def eos_token(self) -> str | None:
        return self.tokenizer.special_tokens.get("eos_token")

    @property
    def eos_token_id(self) -> int | None:
        """The tokenizer config's end-of-sequence token (one of ``eos_token_ids``)."""
        eos = self.eos_token
        return self.tokenizer.token_to_id(eos) if eos is not None else None

    @property
    def eos_token_ids(self) -> set[int]:
        """Every id that ends a generation: the configs' EOS ids plus ``add_eos_token``'s."""
        return set(self.tokenizer.eos_token_ids) | self._extra_eos

    def add_eos_token(self, token: str | int) -> None:
        """Stop generations at ``token`` too (a token string or an id), as mlx-lm."""
        if isinstance(token, int) or (isinstance(token, str) and token.isdigit()):
            token_id: int | None = int(token)
        else:
            token_id = self.tokenizer.token_to_id(token)
        if token_id is None or not 0 <= token_id < self.vocab_size:
            raise DraftwiseError(f"'{token}' is not a token for this tokenizer")
        self._extra_eos.add(token_id)

    @property
    def bos_token(self) -> str | None:
        return self.tokenizer.special_tokens.get("bos_token")

    @property
    def bos_token_id(self) -> int | None:
        return self.tokenizer.bos_token_id

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def __len__(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def has_chat_template(self) -> bool:
        return self.tokenizer.has_chat_template

    @property
    def chat_template(self) -> str | None:
        return self.tokenizer.chat_template

    def encode_prompt(self, prompt: Any) -> list[int]:
        """Token ids of a ``generate`` prompt, exactly as mlx-lm reads it: a string is
        encoded as is (no chat template), with special tokens unless it already starts
        with the BOS token; a token list (or array) is used as given."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise DraftwiseError("the prompt is empty: give some text")
            bos = self.bos_token
            return self.encode(prompt, add_special_tokens=bos is None or not prompt.startswith(bos))
        if isinstance(prompt, Mapping) or (
            isinstance(prompt, Sequence) and prompt and isinstance(prompt[0], Mapping)
        ):
            raise DraftwiseError(
                "mlx-lm's generate takes text or token ids, not chat messages: render them "
                "first with tokenizer.apply_chat_template(messages, add_generation_prompt=True)"
            )
        import numpy as np

        try:
            ids = np.asarray(prompt)
        except (TypeError, ValueError) as exc:
            raise DraftwiseError(
                f"the prompt must be a string or token ids, got {prompt!r}"
            ) from exc
        if ids.ndim != 1 or ids.size == 0 or ids.dtype.kind not in "iu":
            raise DraftwiseError(
                f"the prompt must be a string or a non-empty list of token ids, got {prompt!r}"
            )
        return [int(t) for t in ids]


_DEFAULT_TEMPLATE_OPTIONS: dict[str, Any] = {"continue_final_message": False, "tools": None}
