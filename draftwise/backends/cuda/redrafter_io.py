"""ReDrafter checkpoints: ``model.safetensors`` + ``config.json`` in one directory.

The config records the target's tokenizer identity, a fingerprint of its weights and the
sha256 of the tensor file, so another model's drafter, a truncated or corrupt file is
refused with one line naming the path, before any tensor is built. Both files are
written atomically (a temporary file, then a rename); the config goes last, so a
directory whose config exists always has its complete tensor file.

Example::

    save_redrafter(net, out_dir)
    net = load_redrafter(out_dir, embed, tokenizer_id=tok.identity(), fingerprint=fp)
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch

from draftwise.backends.cuda.redrafter import FORMAT_VERSION, ReDrafterConfig, ReDrafterNet
from draftwise.errors import DraftwiseError

WEIGHTS, CONFIG = "model.safetensors", "config.json"


def weights_fingerprint(embed: torch.Tensor) -> str:
    """A short hash of the target's embedding matrix (its shape and first 1024 rows in
    bfloat16): a drafter trained for other weights reads other hidden states."""
    # rounded to bfloat16 first: the same weights loaded in any dtype give one fingerprint
    rows = embed[:1024].detach().to(torch.bfloat16).float().cpu().contiguous()
    h = hashlib.sha256(f"{tuple(embed.shape)}".encode())
    h.update(rows.numpy().tobytes())
    return h.hexdigest()[:32]


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same directory + rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_redrafter(net: ReDrafterNet, out_dir: str | os.PathLike[str]) -> Path:
    """Write ``net``'s trained tensors and config to ``out_dir``; returns the directory."""
    from safetensors.torch import save

    out = Path(out_dir)
    tensors = {k: v.detach().float().cpu().contiguous() for k, v in net.state_dict().items()}
    tensors["vocab_ids"] = net.vocab_ids.cpu().to(torch.int64).contiguous()
    blob = save(tensors)
    atomic_write(out / WEIGHTS, blob)
    cfg = net.cfg.to_dict() | {"weights_sha256": hashlib.sha256(blob).hexdigest()}
    atomic_write(out / CONFIG, (json.dumps(cfg, indent=1, sort_keys=True) + "\n").encode())
    return out


def read_config(ckpt_dir: str | os.PathLike[str]) -> tuple[ReDrafterConfig, str]:
    """The checkpoint's config and the sha256 its tensor file must have."""
    path = Path(ckpt_dir) / CONFIG
    try:
        raw = json.loads(path.read_text())
        sha = str(raw.pop("weights_sha256"))
        cfg = ReDrafterConfig(**raw)
    except FileNotFoundError:
        raise DraftwiseError(f"no ReDrafter checkpoint at {ckpt_dir} ({CONFIG} missing)") from None
    except (ValueError, TypeError, KeyError) as exc:
        raise DraftwiseError(f"corrupt ReDrafter config {path}: {exc}") from None
    if cfg.format_version != FORMAT_VERSION:
        raise DraftwiseError(
            f"ReDrafter checkpoint {path} has format {cfg.format_version}, "
            f"expected {FORMAT_VERSION}"
        )
    return cfg, sha


def load_redrafter(
    ckpt_dir: str | os.PathLike[str],
    embed: torch.Tensor,
    tokenizer_id: str | None,
    fingerprint: str | None,
) -> ReDrafterNet:
    """The network stored in ``ckpt_dir`` for a target with embeddings ``embed`` (V, C);
    refused (one line naming the path) when made for another tokenizer or other weights,
    or when its tensor file is truncated or corrupt."""
    from safetensors.torch import load

    cfg, sha = read_config(ckpt_dir)
    wpath = Path(ckpt_dir) / WEIGHTS
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
    try:
        blob = wpath.read_bytes()
    except FileNotFoundError:
        raise DraftwiseError(f"ReDrafter weights missing: {wpath}") from None
    if hashlib.sha256(blob).hexdigest() != sha:
        raise DraftwiseError(f"corrupt or truncated ReDrafter weights: {wpath} (sha256 mismatch)")
    tensors = load(blob)
    ids = tensors.pop("vocab_ids")
    net = ReDrafterNet(cfg, embed.float(), ids)
    missing, unexpected = net.load_state_dict(tensors | {"vocab_ids": ids}, strict=False)
    if missing or unexpected:
        raise DraftwiseError(
            f"ReDrafter weights {wpath} do not match its config: {missing or unexpected}"
        )
    return net.to(embed.device)
