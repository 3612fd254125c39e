"""The 4-bit codes of a GGUF file's Q4_0 / Q4_1 linear weights, exactly as stored.

A GGUF converted into the cache holds float32 weights; its Q4_0 / Q4_1 tensors were
``scale * (code - 8) + zero`` per block of 32 inputs before that (Q4_1: ``d * q + m``,
so ``scale = d``, ``zero = m + 8 d``; Q4_0: ``d * (q - 8)``, ``zero = 0``). The torch
backend's ``4bit`` mode computes with these codes directly (``backends/cuda/cpu/int4.py``),
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from draftwise.backends.gguf_index import GGUFIndex
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
# block-linear types whose weights are exactly 4-bit codes with a scale and zero per 32
Q4_KINDS = ("Q4_0", "Q4_1", "Q4_K")


@dataclass(frozen=True)
class FourBit:
    """What the ``4bit`` mode computes with: a GGUF's codes by Hugging Face name, and
    whether linears without codes are rounded to nearest (a model with no GGUF) rather
    than kept dense (the Q6_K tensors of a Q4_K_M file)."""

    codes: dict[str, Q4]
    round_missing: bool = False


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


def q4_linear_count(model_dir: Path) -> int:
    """How many block linears of ``model_dir``'s source GGUF are 4-bit (``Q4_KINDS``), from
    the types ``source.json`` records; 0 when unknown or the file is gone."""
    if gguf_source(model_dir) is None:
        return 0
    try:
        types = json.loads((Path(model_dir) / SOURCE_FILE).read_text()).get("types", {})
    except (OSError, ValueError, AttributeError):
        return 0
    if not isinstance(types, dict):
        return 0
    return sum(
        1
        for name, kind in types.items()
        if kind in Q4_KINDS and (hit := _BLK.match(str(name))) and hit.group(2) in _NAMES
    )


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


def _unpack_q4k(raw: np.ndarray, k: int) -> Q4:
    """(N, K/256 * 144) Q4_K super-blocks -> codes (N, K), scale and zero (N, K/32).

    A super-block of 256 holds f16 ``d`` and ``dmin``, 12 bytes of 6-bit sub-block scales
    ``sc`` and mins ``mn`` (8 each) and 128 bytes of nibbles: in each 64-weight chunk the
    first 32 weights are the low nibbles of its 32 bytes, the next 32 the high ones.
    Weight = ``d sc q - dmin mn``: per 32-block ``scale = d sc``, ``zero = 8 scale - dmin mn``.
    """
    n = raw.shape[0]
    nb = k // 256
    blocks = raw.reshape(n, nb, 144)  # (N, nb, bytes)
    d = blocks[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)  # (N, nb)
    dmin = blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)  # (N, nb)
    sm = blocks[:, :, 4:16].reshape(n, nb, 3, 4)  # the 12 scale bytes as 3 x 4
    lo, hi, mix = sm[:, :, 0], sm[:, :, 1], sm[:, :, 2]  # (N, nb, 4) each
    sc = np.concatenate([lo & 0x3F, (mix & 0x0F) | ((lo >> 2) & 0x30)], axis=2)  # (N, nb, 8)
    mn = np.concatenate([hi & 0x3F, (mix >> 4) | ((hi >> 2) & 0x30)], axis=2)  # (N, nb, 8)
    qs = blocks[:, :, 16:].reshape(n, nb, 4, 1, 32)  # (N, nb, chunk, 1, 32)
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=3).reshape(n, k)  # (N, K)
    scale = (d[..., None] * sc.astype(np.float32)).reshape(n, k // GROUP)  # (N, K/32)
    mins = (dmin[..., None] * mn.astype(np.float32)).reshape(n, k // GROUP)
    return codes, scale, np.float32(8) * scale - mins


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
    """Every Q4_0 / Q4_1 / Q4_K block linear of a llama-family GGUF, keyed by its Hugging
    Face name (see the module docstring), and the output head as ``HEAD`` when it is Q8_0
    or Q4_0 / Q4_1 (a Q8_0 one split by ``split_q8``); other tensors (norms, the Q6_K
    tensors of a Q4_K_M file) are left out: they stay dense."""
    index = GGUFIndex(path)  # the tensor index only: ~3 s less than gguf's reader
    fields = index.fields
    arch = str(fields.get("general.architecture", "llama"))
    heads = int(fields.get(f"{arch}.attention.head_count", 0))  # type: ignore[call-overload]
    kv_heads = int(fields.get(f"{arch}.attention.head_count_kv", heads))  # type: ignore[call-overload]
    out: dict[str, Q4] = {}
    names = {t.name for t in index.tensors}
    head_name = "output.weight" if "output.weight" in names else "token_embd.weight"
    for t in index.tensors:
        kind = t.kind
        if t.name == head_name and kind in ("Q8_0", "Q4_0", "Q4_1"):
            k = int(t.shape[0])
            raw = np.asarray(t.data)
            if kind == "Q8_0":
                out[HEAD] = split_q8(*_q8_blocks(raw, k))
            else:
                out[HEAD] = _unpack(raw, kind, k)
            continue
        hit = _BLK.match(t.name)
        if kind not in Q4_KINDS or hit is None or hit.group(2) not in _NAMES:
            continue
        k = int(t.shape[0])  # GGUF lists the input (fastest) dimension first
        if k % GROUP:
            raise DraftwiseError(f"{path}: {t.name} has {k} inputs, not a multiple of {GROUP}")
        raw = np.asarray(t.data)
        q4 = _unpack_q4k(raw, k) if kind == "Q4_K" else _unpack(raw, kind, k)
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


