"""A GGUF file's tensor index and scalar metadata, read in a few milliseconds.

The 4bit mode reads the GGUF's own 4-bit codes at every load (``gguf_q4.py``). The gguf
package's ``GGUFReader`` builds a numpy view of every metadata value first, the
tokenizer's 49,152 tokens and 48,900 merges included: 3.3 s of the default model's 3.9 s
load on this project's CPU. The codes need only the tensor index (name, type, shape,
offset) and a few scalars (the architecture, head counts, alignment), so this walks the
metadata without building it: scalars and strings are kept, arrays skipped (an array of
strings is walked, one length at a time). Tensors come back as views of one read-only
memory map, shaped as ``GGUFReader`` shapes them (tested against it on the default
model's file). Little-endian GGUF version 2 and 3 files only.

Example::

    idx = GGUFIndex("model.Q4_1.gguf")
    idx.fields["general.architecture"]        # 'llama'
    t = idx.tensors[0]
    t.name, t.kind, t.shape    # ('token_embd.weight', 'Q8_0', (576, 49152))
    t.data.shape               # (49152, 612): rows of 18 Q8_0 blocks of 34 bytes
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import numpy as np

from draftwise.errors import DraftwiseError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# GGUF metadata value types (the spec's numbering): struct formats of the fixed-size ones
_FIXED = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
          11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# tensor types read as plain numbers (GGUFReader's dtypes); the others as bytes per row
_PLAIN = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8,
          "I16": np.int16, "I32": np.int32, "I64": np.int64}


@dataclass(frozen=True)
class IndexedTensor:
    """One tensor of the file: ``shape`` in GGUF order (the input dimension first, as
    ``GGUFReader.tensors[i].shape``); ``data`` a read-only view, (rows, bytes a row) uint8
    for block-quantized types, the values for plain ones (numpy order: dims reversed)."""

    name: str
    kind: str  # the ggml type's name: "Q4_1", "Q8_0", "F32", ...
    shape: tuple[int, ...]
    data: np.ndarray


class GGUFIndex:
    """The tensor index and scalar/string metadata of a GGUF file (see the module doc)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = str(path)
        try:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as e:
            raise DraftwiseError(f"cannot read GGUF file {self.path}: {e}") from None
        self._buf = memoryview(self._map)  # type: ignore[arg-type]
        self._pos = 0
        self.fields: dict[str, object] = {}
        self.tensors: list[IndexedTensor] = []
        try:
            self._read()
        except (struct.error, UnicodeDecodeError, ValueError, KeyError) as e:
            raise DraftwiseError(f"cannot read GGUF file {self.path}: {e}") from None

    # ----- the file's layout (GGUF spec: header, metadata, tensor infos, data) ---------
    def _read(self) -> None:
        if bytes(self._take(4)) != MAGIC:
            raise ValueError("not a GGUF file (bad magic)")
        (version,) = self._unpack("<I")
        if version not in VERSIONS:
            raise ValueError(f"GGUF version {version} (this reader takes {VERSIONS})")
        n_tensors, n_kv = self._unpack("<QQ")
        for _ in range(n_kv):
            key = self._string()
            (vtype,) = self._unpack("<I")
            value = self._value(vtype)
            if value is not _SKIPPED:
                self.fields[key] = value
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            (n_dims,) = self._unpack("<I")
            if n_dims > 8:
                raise ValueError(f"tensor {name!r} with {n_dims} dimensions")
            dims = self._unpack(f"<{n_dims}Q")
            ttype, offset = self._unpack("<IQ")
            infos.append((name, dims, ttype, offset))
        align = self.fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise ValueError(f"general.alignment {align!r} is not a power of two")
        start = -(-self._pos // align) * align
        seen: set[str] = set()
        for name, dims, ttype, offset in infos:
            if name in seen:
                raise ValueError(f"tensor {name!r} listed twice")
            seen.add(name)
            self.tensors.append(self._tensor(name, dims, ttype, start + offset))

    def _tensor(self, name: str, dims: tuple[int, ...], ttype: int, at: int) -> IndexedTensor:
        # imported here: a torch backend built from safetensors (the GPU machine) has no gguf
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        kind = GGMLQuantizationType(ttype)
        block, size = GGML_QUANT_SIZES[kind]
        n = int(np.prod(dims, dtype=np.int64)) if dims else 1
        shape = tuple(reversed(dims))  # numpy order
        plain = _PLAIN.get(kind.name)
        if plain is not None:
            nbytes = n * np.dtype(plain).itemsize
        else:
            if not shape or shape[-1] % block:
                raise ValueError(
                    f"tensor {name!r}: rows of {shape[-1:]} values, not whole {kind.name} blocks"
                )
            nbytes = n // block * size
            shape = (*shape[:-1], shape[-1] // block * size)
        if at < 0 or at + nbytes > self._map.size:
            raise ValueError(f"tensor {name!r} runs past the end of the file")
        raw = self._map[at : at + nbytes]
        data = (raw.view(plain) if plain is not None else raw).reshape(shape)
        return IndexedTensor(name, kind.name, tuple(int(d) for d in dims), data)

    # ----- primitives -------------------------------------------------------------------
    def _take(self, n: int) -> memoryview:
        if n < 0 or self._pos + n > len(self._buf):
            raise ValueError(f"the file ends inside its header (at byte {self._pos})")
        out = self._buf[self._pos : self._pos + n]
        self._pos += n
        return out

    def _unpack(self, fmt: str) -> tuple:
        size = struct.calcsize(fmt)
        if self._pos + size > len(self._buf):
            raise ValueError(f"the file ends inside its header (at byte {self._pos})")
        out = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += size
        return out

    def _string(self) -> str:
        (n,) = self._unpack("<Q")
        return bytes(self._take(n)).decode("utf-8")

    def _value(self, vtype: int) -> object:
        fmt = _FIXED.get(vtype)
        if fmt is not None:
            return self._unpack(fmt)[0]
        if vtype == _STRING:
            return self._string()
        if vtype != _ARRAY:
            raise ValueError(f"metadata value of unknown type {vtype}")
        etype, count = self._unpack("<IQ")
        fmt = _FIXED.get(etype)
        if fmt is not None:  # fixed-size elements: skipped at once
            self._take(struct.calcsize(fmt) * count)
        elif etype == _STRING:  # one length at a time (the tokenizer's vocabulary)
            buf, pos, end = self._buf, self._pos, len(self._buf)
            for _ in range(count):
                if pos + 8 > end:
                    raise ValueError(f"the file ends inside its header (at byte {pos})")
                pos += 8 + int.from_bytes(buf[pos : pos + 8], "little")
            if pos > end:
                raise ValueError(f"the file ends inside its header (at byte {pos})")
            self._pos = pos
        else:  # arrays of arrays: the spec allows them; no model file we read has one
            for _ in range(count):
                self._value(etype)
        return _SKIPPED


_SKIPPED = object()  # an array's value: not kept
