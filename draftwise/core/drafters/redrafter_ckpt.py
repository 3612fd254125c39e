"""ReDrafter checkpoint identity, checked without any tensor library.

A checkpoint directory holds ``model.safetensors`` and ``config.json``; the config
records the target's tokenizer identity, a fingerprint of its embedding weights
(``redrafter.embed_fingerprint``) and the sha256 of the tensor file. ``checked_weights``
returns the tensor file's bytes only when all three match, so every backend refuses
another model's drafter, a truncated or a corrupt file with one line naming the path.

Example::

    cfg, blob = checked_weights(ckpt_dir, tokenizer_id, fingerprint)
    # then load the tensors from ``blob`` with the backend's safetensors reader
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from draftwise.errors import DraftwiseError

FORMAT_VERSION = 1
WEIGHTS, CONFIG = "model.safetensors", "config.json"


@dataclass(frozen=True)
class ReDrafterConfig:
    """What a checkpoint records besides its tensors."""

    hidden: int  # C: the target's hidden size (and the RNN state size)
    vocab_size: int  # the target's vocabulary
    draft_vocab: int  # K: ids the head can draft
    resblocks: int  # ResBlocks on [h, s]
    tokenizer_id: str  # the target's tokenizer identity
    fingerprint: str  # the target's weights (redrafter.embed_fingerprint)
    model_name: str = ""
    format_version: int = FORMAT_VERSION
    # attention over the context (0: none, the plain seed 001 network): its width D and
    # heads; head 0's weights also copy the context's next tokens (a pointer mixture)
    context_dim: int = 0
    context_heads: int = 4

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_config(ckpt_dir: str | os.PathLike[str]) -> tuple[ReDrafterConfig, str]:
    """The checkpoint's config and the sha256 its tensor file must have."""
    path = Path(ckpt_dir) / CONFIG
    try:
        raw = json.loads(path.read_text())
        sha = str(raw.pop("weights_sha256"))
        cfg = ReDrafterConfig(**raw)
    except FileNotFoundError:
        raise DraftwiseError(f"no ReDrafter checkpoint at {ckpt_dir} ({CONFIG} missing)") from None
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise DraftwiseError(f"corrupt ReDrafter config {path}: {exc}") from None
    if cfg.format_version != FORMAT_VERSION:
        raise DraftwiseError(
            f"ReDrafter checkpoint {path} has format {cfg.format_version}, "
            f"expected {FORMAT_VERSION}"
        )
    return cfg, sha


def checked_weights(
    ckpt_dir: str | os.PathLike[str], tokenizer_id: str | None, fingerprint: str | None
) -> tuple[ReDrafterConfig, bytes]:
    """The config and the tensor file's bytes, after every identity check."""
    cfg, sha = read_config(ckpt_dir)
    if tokenizer_id is not None and cfg.tokenizer_id != tokenizer_id:
        raise DraftwiseError(
            f"ReDrafter checkpoint {ckpt_dir} was trained for another tokenizer "
            f"({cfg.tokenizer_id[:16]}, this model's is {tokenizer_id[:16]})"
        )
    if fingerprint is not None and cfg.fingerprint != fingerprint:
        raise DraftwiseError(
            f"ReDrafter checkpoint {ckpt_dir} was trained for other model weights "
            f"(fingerprint {cfg.fingerprint[:12]}, this model's is {fingerprint[:12]})"
        )
    wpath = Path(ckpt_dir) / WEIGHTS
    try:
        blob = wpath.read_bytes()
    except FileNotFoundError:
        raise DraftwiseError(f"ReDrafter weights missing: {wpath}") from None
    if hashlib.sha256(blob).hexdigest() != sha:
        raise DraftwiseError(f"corrupt or truncated ReDrafter weights: {wpath} (sha256 mismatch)")
    return cfg, blob
