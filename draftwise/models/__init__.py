"""Finding, converting and tokenising local models (no downloads, no transformers at run time).

Example::

    >>> from draftwise.models import resolve_model, read_config, check_architecture, Tokenizer
    >>> model_dir = resolve_model(None)  # the embedded SmolLM2-135M-Instruct  # doctest: +SKIP
    >>> check_architecture(read_config(model_dir), {"llama"})  # doctest: +SKIP
    >>> tok = Tokenizer.from_dir(model_dir)  # doctest: +SKIP
    >>> tok.encode_chat([{"role": "user", "content": "Hi"}])  # doctest: +SKIP
"""

from __future__ import annotations

from draftwise.models.convert import convert_gguf
from draftwise.models.default import ensure_default_model
from draftwise.models.paths import cache_dir
from draftwise.models.resolve import check_architecture, read_config, resolve_model
from draftwise.models.tokenizer import StreamingDetokenizer, Tokenizer

__all__ = [
    "StreamingDetokenizer",
    "Tokenizer",
    "cache_dir",
    "check_architecture",
    "convert_gguf",
    "ensure_default_model",
    "read_config",
    "resolve_model",
]
