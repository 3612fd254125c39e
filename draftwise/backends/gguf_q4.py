"""The 4-bit codes of a GGUF file's Q4_0 / Q4_1 linear weights, exactly as stored.

A GGUF converted into the cache holds float32 weights; its Q4_0 / Q4_1 tensors were
``scale * (code - 8) + zero`` per block of 32 inputs before that (Q4_1: ``d * q + m``,
so ``scale = d``, ``zero = m + 8 d``; Q4_0: ``d * (q - 8)``, ``zero = 0``). The torch
backend's ``4bit`` mode computes with these codes directly (``backends/cuda/int4.py``),
so a 4-bit GGUF model runs on the weights it was published with, in a quarter of the
bytes. Rows of ``attn_q`` / ``attn_k`` are put back in Hugging Face order (llama.cpp's
converter interleaves the RoPE halves; transformers undoes it the same way).

Example::

    >>> q = read_q4_linears(gguf_source(model_dir))  # doctest: +SKIP
    >>> codes, scale, zero = q["model.layers.0.mlp.up_proj.weight"]  # doctest: +SKIP
    >>> codes.shape, scale.shape  # (N, K) uint8 in 0..15, (N, K / 32) float32  # doctest: +SKIP
    ((1536, 576), (1536, 18))
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

from draftwise.errors import DraftwiseError

GROUP = 32  # inputs per block: one scale and one zero each
Q4 = tuple[np.ndarray, np.ndarray, np.ndarray]  # codes (N, K) uint8, scale, zero (N, K/32) f32
# which GGUF a converted model dir came from: written by ``models/convert.py`` (the same
# name there: models and backends are sibling layers)
SOURCE_FILE = "source.json"

_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLK = re.compile(r"^blk\.(\d+)\.(\w+)\.weight$")
# The output head's codes: a Q4 head as is; a Q8_0 head (the embedded model's tied
# token_embd) split exactly into two 4-bit halves along the inputs (``split_q8``): its
# codes are (V, 2 C) and the head reads the hidden state twice, ``[x, x]``.
HEAD = "lm_head.weight"


def gguf_source(model_dir: Path) -> Path | None:
    """The GGUF file ``model_dir`` was converted from, if it is recorded (the converter's
    ``source.json``; ``models.default`` adds it to a default-model cache made before) and
    still there."""
    rec = Path(model_dir) / SOURCE_FILE
    if not rec.is_file():
        return None
    try:
        path = Path(json.loads(rec.read_text())["gguf"])
    except (ValueError, KeyError, TypeError, OSError):
        return None
    return path if path.is_file() else None


def _unpack(raw: np.ndarray, kind: str, k: int) -> Q4:
    """(N, K/32 * bytes) GGUF blocks -> codes (N, K) uint8, scale and zero (N, K/32)."""
    n = raw.shape[0]
    head = 4 if kind == "Q4_1" else 2  # f16 d (and f16 m), then 16 bytes of nibbles
    blocks = raw.reshape(n, k // GROUP, head + GROUP // 2)  # (N, B, bytes)
    d = blocks[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # (N, B)
    qs = blocks[:, :, head:]  # (N, B, 16): element j low nibble, element j + 16 high
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(n, k)  # (N, K)
    if kind == "Q4_1":
        m = blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)  # (N, B)
        return codes, d, m + np.float32(8) * d
    return codes, d, np.zeros_like(d)


def split_q8(q8: np.ndarray, d: np.ndarray) -> Q4:
    """Q8_0 weights ``d * q8`` (q8 (N, K) int8, d (N, K/32)) as exact 4-bit codes over
    doubled inputs: with ``u = q8 + 128 = 16 a + b``, ``d q8 = 16 d (a - 8) + d (b - 8) + 8 d``,
    so codes ``[a | b]`` (N, 2K), scales ``[16 d | d]``, zeros ``[0 | 8 d]``."""
    u = (q8.astype(np.int16) + 128).astype(np.uint8)  # (N, K) in 0..255
    codes = np.concatenate([u >> 4, u & 0x0F], axis=1)  # (N, 2K)
    scale = np.concatenate([np.float32(16) * d, d], axis=1)  # (N, 2K/32)
    zero = np.concatenate([np.zeros_like(d), np.float32(8) * d], axis=1)
    return codes, scale, zero


def _q8_blocks(raw: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, K/32 * 34) Q8_0 blocks -> q8 (N, K) int8, d (N, K/32) float32."""
    n = raw.shape[0]
    blocks = raw.reshape(n, k // GROUP, 2 + GROUP)  # (N, B, f16 d + 32 int8)
    d = blocks[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # (N, B)
    q8 = blocks[:, :, 2:].copy().view(np.int8).reshape(n, k)  # (N, K)
    return q8, d


def _hf_rows(a: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row interleave (as transformers' ``_reverse_permute_weights``)."""
    dim = a.shape[0] // heads // 2
    return a.reshape(heads, dim, 2, *a.shape[1:]).swapaxes(2, 1).reshape(a.shape)


def read_q4_linears(path: str | os.PathLike[str]) -> dict[str, Q4]:
    """Every Q4_0 / Q4_1 block linear of a llama-family GGUF, keyed by its Hugging Face
    name (see the module docstring), and the output head as ``HEAD`` when it is Q8_0 or
    Q4 (a Q8_0 one split by ``split_q8``); other tensors (norms, a Q6_K head) are left out."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as e:
        raise DraftwiseError(f"cannot read GGUF file {path}: {e}") from None
    arch = _field(reader, "general.architecture", "llama")
    heads = int(_field(reader, f"{arch}.attention.head_count", 0))
    kv_heads = int(_field(reader, f"{arch}.attention.head_count_kv", heads))
    out: dict[str, Q4] = {}
    names = {t.name for t in reader.tensors}
    head_name = "output.weight" if "output.weight" in names else "token_embd.weight"
    for t in reader.tensors:
        kind = t.tensor_type.name
        if t.name == head_name and kind in ("Q8_0", "Q4_0", "Q4_1"):
            k = int(t.shape[0])
            raw = np.asarray(t.data)
            if kind == "Q8_0":
                out[HEAD] = split_q8(*_q8_blocks(raw, k))
            else:
                out[HEAD] = _unpack(raw, kind, k)
            continue
        hit = _BLK.match(t.name)
        if kind not in ("Q4_0", "Q4_1") or hit is None or hit.group(2) not in _NAMES:
            continue
        k = int(t.shape[0])  # GGUF lists the input (fastest) dimension first
        if k % GROUP:
            raise DraftwiseError(f"{path}: {t.name} has {k} inputs, not a multiple of {GROUP}")
        q4 = _unpack(np.asarray(t.data), kind, k)
        part = hit.group(2)
        if part in ("attn_q", "attn_k") and heads:
            h = heads if part == "attn_q" else kv_heads
            q4 = (_hf_rows(q4[0], h), _hf_rows(q4[1], h), _hf_rows(q4[2], h))
        out[f"model.layers.{hit.group(1)}.{_NAMES[part]}.weight"] = q4
    return out


def dequantize(q4: Q4, inputs: int | None = None) -> np.ndarray:
    """(N, K) float32 weights of ``q4``: ``scale * (code - 8) + zero`` per block. With
    ``inputs`` = K / r (a split head, read over r copies of the input), the r parts summed:
    (N, inputs)."""
    codes, scale, zero = q4
    n, k = codes.shape
    c = codes.reshape(n, k // GROUP, GROUP).astype(np.float32) - np.float32(8)  # (N, B, 32)
    w = (c * scale[..., None] + zero[..., None]).reshape(n, k)
    if inputs is not None and inputs != k:
        w = w.reshape(n, k // inputs, inputs).sum(axis=1)  # (N, inputs)
    return w


def _field(reader: object, key: str, default: object) -> object:
    f = reader.fields.get(key)  # type: ignore[attr-defined]
    if f is None:
        return default
    val = f.parts[f.data[0]]
    if val.dtype == np.uint8:  # a string
        return bytes(val).decode()
    return val[0].item()
