"""Turn what the user typed for ``--model`` into a local HF-format model directory.

The argument is the default model, a local directory with ``config.json``, a local
``.gguf`` file (converted once into the cache), or a Hugging Face Hub name ``ORG/NAME``
(the hub cache first; a download only where allowed: ``hub.py``).

Example::

    >>> from draftwise.models.resolve import resolve_model, read_config, check_architecture
    >>> model_dir = resolve_model(None)  # doctest: +SKIP
    >>> check_architecture(read_config(model_dir), {"llama"})  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from collections.abc import Set
from pathlib import Path
from typing import Any

from draftwise.errors import DraftwiseError
from draftwise.models.convert import Progress, convert_gguf
from draftwise.models.default import ensure_default_model
from draftwise.models.hub import is_hub_name, resolve_hub

#: Names that select the embedded default model.
DEFAULT_MODEL_ALIASES = frozenset({"default", "smollm2"})

_HINT = "give a local HF-format model directory, a .gguf file or a Hugging Face Hub name ORG/NAME"


def resolve_model(
    model: str | os.PathLike[str] | None, progress: Progress | None = None, download: bool = True
) -> Path:
    """Return the HF-format directory for ``model``, converting a GGUF file if needed.

    ``None``, ``"default"`` or ``"smollm2"`` give the embedded default model; an existing
    directory must hold ``config.json``; an existing ``.gguf`` file is converted once; any
    other ``ORG/NAME`` is a Hugging Face Hub name (``hub.resolve_hub``: the hub cache, or
    a download unless ``download`` is False or ``HF_HUB_OFFLINE`` is set).

    Example::

        >>> resolve_model("default")  # doctest: +SKIP
        PosixPath('/home/me/.cache/draftwise/models/SmolLM2-135M-Instruct')
        >>> try:
        ...     resolve_model("/x/y")
        ... except DraftwiseError as exc:
        ...     print(exc)  # doctest: +ELLIPSIS
        model not found: '/x/y' (give a local HF-format model directory, a .gguf file or ...)
    """
    if model is None or (isinstance(model, str) and model.strip().lower() in DEFAULT_MODEL_ALIASES):
        return ensure_default_model(progress)
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise DraftwiseError(
                f"model directory '{path}' has no config.json (expected a HF-format model dir)"
            )
        return path.resolve()
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return convert_gguf(path, progress)
        raise DraftwiseError(f"not a model: '{path}' ({_HINT})")
    if isinstance(model, str) and is_hub_name(model):
        return resolve_hub(model, download)
    raise DraftwiseError(f"model not found: '{os.fspath(model)}' ({_HINT})")


def read_config(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and return ``model_dir/config.json`` as a dict.

    The dict also gets ``"_config_path"`` (where it was read from), which
    :func:`check_architecture` names in its error message.

    Example::

        >>> read_config(resolve_model(None))["model_type"]  # doctest: +SKIP
        'llama'
    """
    path = Path(model_dir) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DraftwiseError(f"config file not found: '{path}'") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DraftwiseError(f"cannot read config file '{path}': {exc}") from exc
    if not isinstance(data, dict):
        raise DraftwiseError(f"config file '{path}' does not hold a JSON object")
    data.setdefault("_config_path", str(path))
    return data


def check_architecture(config: dict[str, Any], supported: Set[str]) -> None:
    """Raise DraftwiseError unless ``config["model_type"]`` is in ``supported``.

    Example::

        >>> check_architecture({"model_type": "llama"}, {"llama"})
        >>> try:
        ...     check_architecture({"model_type": "gpt2"}, {"llama"})
        ... except DraftwiseError as exc:
        ...     print(exc)
        unsupported architecture 'gpt2' in config.json (supported: llama)
    """
    model_type = config.get("model_type")
    if model_type in supported:
        return
    where = config.get("_config_path", "config.json")
    names = ", ".join(sorted(supported)) or "none"
    if model_type is None:
        raise DraftwiseError(f"no model_type in {where} (supported: {names})")
    raise DraftwiseError(f"unsupported architecture {model_type!r} in {where} (supported: {names})")
