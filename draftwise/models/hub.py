"""Hugging Face Hub names (``ORG/NAME``) as ``--model``, as mlx-lm and transformers take them.

The local hub cache first (what ``huggingface-cli download`` or any transformers or
mlx-lm run left there); a download only when the user allows it: not with
``HF_HUB_OFFLINE=1`` nor with ``download=False`` (the CLI's ``--no-download``). Only what
the model needs is fetched (config, safetensors weights, tokenizer and chat template),
with huggingface_hub's progress bars. A name that is neither cached nor downloadable is
one line naming it.

Example::

    >>> is_hub_name("Qwen/Qwen2.5-1.5B-Instruct"), is_hub_name("./models/x"), is_hub_name("a/b/c")
    (True, False, False)
    >>> resolve_hub("Qwen/Qwen2.5-1.5B-Instruct", download=False)  # doctest: +SKIP
    PosixPath('/home/me/.cache/huggingface/hub/models--Qwen--Qwen2.5-1.5B-Instruct/snapshots/...')
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from draftwise.errors import DraftwiseError

# the Hub's repository id rules: letters, digits, '-', '_', '.', at most 96 per part
HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
# what a model directory needs; never pickles, never the other formats' copies
PATTERNS = [
    "config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "chat_template.jinja", "chat_template.json", "tokenizer.model",
]  # fmt: skip


def is_hub_name(text: str) -> bool:
    """``ORG/NAME`` shaped (the caller checks first that no such local path exists)."""
    return bool(HUB_NAME.match(text)) and ".." not in text


def hub_cache() -> Path:
    """The hub cache, from the environment at call time (``HF_HUB_CACHE``, ``HF_HOME``)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() in ("1", "true", "yes", "on")


def resolve_hub(name: str, download: bool = True) -> Path:
    """The local snapshot directory of hub model ``name``: cached, or downloaded now when
    allowed. Raises ``DraftwiseError`` (one line) when it is neither."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            LocalEntryNotFoundError,
            OfflineModeIsEnabled,
            RepositoryNotFoundError,
        )
    except ImportError:
        raise DraftwiseError(
            f"'{name}' looks like a Hugging Face Hub name; reading the hub cache needs "
            "huggingface_hub (pip install huggingface_hub)"
        ) from None
    cache = hub_cache()
    try:
        path = Path(snapshot_download(name, cache_dir=cache, allow_patterns=PATTERNS,
                                      local_files_only=True))
    except (LocalEntryNotFoundError, OfflineModeIsEnabled, FileNotFoundError, OSError):
        path = None
    if path is not None and (path / "config.json").is_file():
        return path
    if not download or offline():
        raise DraftwiseError(
            f"model not found: '{name}' (not in the Hugging Face cache {cache}, and downloads "
            "are off: HF_HUB_OFFLINE=1 or --no-download)"
        )
    print(f"draftwise: downloading {name} from the Hugging Face Hub into {cache}", file=sys.stderr)
    try:
        path = Path(snapshot_download(name, cache_dir=cache, allow_patterns=PATTERNS))
    except (RepositoryNotFoundError, GatedRepoError):
        raise DraftwiseError(
            f"model not found: '{name}' (no such model on the Hugging Face Hub, or it is "
            "gated: log in with huggingface-cli login)"
        ) from None
    except Exception as exc:  # HTTP, connection (httpx), disk: one line, whatever the cause
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DraftwiseError(f"cannot download '{name}': {first}") from None
    if not (path / "config.json").is_file():
        raise DraftwiseError(f"'{name}' has no config.json: not a transformers-format model")
    return path
