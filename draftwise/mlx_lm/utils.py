"""mlx-lm's ``load`` (which mlx-lm keeps in ``mlx_lm.utils``): ``(model, tokenizer)``.

Example::

    >>> from draftwise.mlx_lm import load
    >>> model, tokenizer = load()  # the embedded SmolLM2-135M-Instruct  # doctest: +SKIP
    >>> model, tokenizer = load("~/models/Llama-3.2-3B-Instruct-4bit")  # doctest: +SKIP

Models are never downloaded: ``path_or_hf_repo`` is a local HF-format directory (an MLX
community model saved with ``huggingface-cli download``, for one) or a ``.gguf`` file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from draftwise.errors import DraftwiseError
from draftwise.mlx_lm.tokenizer_utils import TokenizerWrapper


def load(
    path_or_hf_repo: str | os.PathLike[str] | None = None,
    tokenizer_config: Mapping[str, Any] | None = None,
    model_config: Mapping[str, Any] | None = None,
    adapter_path: str | None = None,
    lazy: bool = False,
    return_config: bool = False,
    revision: str | None = None,
    trust_remote_code: bool = False,
    *,
    backend: str = "auto",
    dtype: str | None = None,
    invariant: bool | str = "auto",
) -> tuple[Any, TokenizerWrapper] | tuple[Any, TokenizerWrapper, dict[str, Any]]:
    """Load a model and its tokenizer, as ``mlx_lm.load``. ``None`` (draftwise only) is the
    embedded default model. ``lazy`` and ``trust_remote_code`` change nothing here (no
    remote code is ever run); ``tokenizer_config`` may set ``eos_token``. ``backend``,
    ``dtype`` and ``invariant`` are ``draftwise.load``'s (the default backend is MLX on
    Apple Silicon, torch elsewhere)."""
    import draftwise
    from draftwise.models.resolve import read_config

    if adapter_path is not None:
        raise DraftwiseError(f"adapter_path={adapter_path!r}: LoRA adapters are not supported yet")
    if revision is not None:
        raise DraftwiseError(
            f"revision={revision!r} is not supported: a hub name loads its main revision "
            "(or give a local directory or .gguf file)"
        )
    if model_config:
        raise DraftwiseError(f"model_config={dict(model_config)!r} is not supported")
    extra = sorted(set(tokenizer_config or {}) - {"eos_token", "trust_remote_code"})
    if extra:
        raise DraftwiseError(
            f"tokenizer_config option {extra[0]!r} is not supported (known: eos_token)"
        )
    model = draftwise.load(path_or_hf_repo, backend=backend, dtype=dtype, invariant=invariant)
    tokenizer = TokenizerWrapper(model.tokenizer)
    if tokenizer_config and tokenizer_config.get("eos_token") is not None:
        tokenizer.add_eos_token(tokenizer_config["eos_token"])
    if return_config:
        return model, tokenizer, read_config(model.model_dir)
    return model, tokenizer
