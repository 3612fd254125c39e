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

from draftwise.backends.cuda.redrafter.net import ReDrafterNet
from draftwise.core.drafters.redrafter import FINGERPRINT_ROWS, embed_fingerprint
from draftwise.core.drafters.redrafter_ckpt import CONFIG, WEIGHTS, checked_weights
from draftwise.errors import DraftwiseError


def weights_fingerprint(embed: torch.Tensor) -> str:
    """The target's fingerprint (``core.drafters.redrafter.embed_fingerprint``): a
    drafter trained for other weights reads other hidden states."""
    rows = embed[:FINGERPRINT_ROWS].detach().float().cpu().numpy()
    return embed_fingerprint(rows, (int(embed.shape[0]), int(embed.shape[1])))


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same directory + rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a checkpoint is shareable
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_redrafter(
    net: ReDrafterNet, out_dir: str | os.PathLike[str], dtype: torch.dtype = torch.float32
) -> Path:
    """Write ``net``'s trained tensors and config to ``out_dir``; returns the directory.

    ``dtype``: the precision of the stored weights. Training writes float32 (its
    checkpoints resume bit for bit); the copy shipped in ``draftwise/data`` is bfloat16,
    the precision the drafting step computes in on CPU (its int8 weights are quantized
    from it at load), at half the size. Loading casts back to float32 either way."""
    from safetensors.torch import save

    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise DraftwiseError(f"ReDrafter weights are stored as float32, bfloat16 or float16, not {dtype}")
    out = Path(out_dir)
    tensors = {k: v.detach().to(dtype).cpu().contiguous() for k, v in net.state_dict().items()}
    tensors["vocab_ids"] = net.vocab_ids.cpu().to(torch.int64).contiguous()
    blob = save(tensors)
    atomic_write(out / WEIGHTS, blob)
    cfg = net.cfg.to_dict() | {"weights_sha256": hashlib.sha256(blob).hexdigest()}
    atomic_write(out / CONFIG, (json.dumps(cfg, indent=1, sort_keys=True) + "\n").encode())
    return out


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

    cfg, blob = checked_weights(ckpt_dir, tokenizer_id, fingerprint)
    wpath = Path(ckpt_dir) / WEIGHTS
    tensors = load(blob)
    ids = tensors.pop("vocab_ids")
    net = ReDrafterNet(cfg, embed.float(), ids)
    missing, unexpected = net.load_state_dict(tensors | {"vocab_ids": ids}, strict=False)
    if missing or unexpected:
        raise DraftwiseError(
            f"ReDrafter weights {wpath} do not match its config: {missing or unexpected}"
        )
    return net.to(embed.device)
