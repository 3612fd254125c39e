"""Cacheback tables on disk: ``.npz`` files of plain arrays, no pickle, atomic, checked.

A table file is a zip of numeric arrays plus 0-d metadata arrays: ``format`` (the
version), ``kind`` (``"frozen"`` or ``"lru"``), ``tokenizer`` (the identity of the
tokenizer whose ids the table holds) and integer fields such as ``ll`` and ``fl``.
Writing goes to a temporary file in the same directory, then ``os.replace``: a crash
never leaves half a file, and a file that fails to load is never touched. Loading runs
``np.load(..., allow_pickle=False)``, refuses another kind, version or tokenizer, and
names the file in every error.

Example::

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "t.npz")
    >>> write_table(p, "lru", "tok-1", {"ll": 1}, {"x": np.arange(3, dtype=np.int32)})
    >>> meta, arrays = read_table(p, "lru", "tok-1", ["ll"], ["x"])
    >>> meta["ll"], arrays["x"].tolist()
    (1, [0, 1, 2])
    >>> read_table(p, "lru", "tok-2", ["ll"], ["x"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    draftwise.errors.DraftwiseError: table file '...t.npz' was built for tokenizer tok-1...
"""

from __future__ import annotations

import os
import zipfile
import zlib
from collections.abc import Mapping, Sequence

import numpy as np

from draftwise.core.atomic import atomic_file
from draftwise.errors import DraftwiseError

FORMAT_VERSION = 1
_RESERVED = ("format", "kind", "tokenizer")


def write_table(
    path: str | os.PathLike[str],
    kind: str,
    tokenizer_id: str,
    meta: Mapping[str, int],
    arrays: Mapping[str, np.ndarray],
    compress: bool = True,
) -> None:
    """Write ``arrays`` and integer ``meta`` to ``path`` atomically (temp file + rename)."""
    if not isinstance(tokenizer_id, str) or not tokenizer_id:
        raise DraftwiseError(f"a table needs a tokenizer identity string, got {tokenizer_id!r}")
    target = os.path.abspath(os.fspath(path))
    fields: dict[str, np.ndarray] = {
        "format": np.array(FORMAT_VERSION, np.int64),
        "kind": np.array(kind),
        "tokenizer": np.array(tokenizer_id),
    }
    fields.update({k: np.array(int(v), np.int64) for k, v in meta.items()})
    fields.update({k: np.ascontiguousarray(a) for k, a in arrays.items()})
    try:
        with atomic_file(target, "wb") as f:
            (np.savez_compressed if compress else np.savez)(f, **fields)  # type: ignore[arg-type]
    except OSError as exc:
        raise DraftwiseError(f"cannot write table file '{target}': {exc}") from None


def read_table(
    path: str | os.PathLike[str],
    kind: str,
    tokenizer_id: str,
    meta_names: Sequence[str],
    array_names: Sequence[str],
) -> tuple[dict[str, int], dict[str, np.ndarray]]:
    """Read a table file written by :func:`write_table`; returns (meta ints, arrays).

    Raises DraftwiseError naming ``path`` when the file is missing, corrupt, truncated, of
    another kind or version, or built for a tokenizer other than ``tokenizer_id``.
    """
    where = os.fspath(path)
    try:
        z = np.load(where, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise ValueError("not an .npz archive")
        with z:
            data = {name: z[name] for name in z.files}
    except FileNotFoundError:
        raise DraftwiseError(f"table file not found: '{where}'") from None
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as exc:
        raise DraftwiseError(
            f"cannot read table file '{where}' (corrupt or truncated?): {exc}"
        ) from None
    if any(n not in data for n in _RESERVED):
        raise DraftwiseError(f"'{where}' is not a draftwise table file")
    try:
        version = int(data["format"])
        found_kind = str(data["kind"])
        found_tok = str(data["tokenizer"])
    except (TypeError, ValueError) as exc:
        raise DraftwiseError(f"table file '{where}' has bad metadata: {exc}") from None
    if version != FORMAT_VERSION:
        raise DraftwiseError(
            f"table file '{where}' has format version {version}; this draftwise reads "
            f"version {FORMAT_VERSION} (rebuild the table)"
        )
    if found_kind != kind:
        raise DraftwiseError(f"table file '{where}' holds a {found_kind!r} table, not {kind!r}")
    if found_tok != tokenizer_id:
        raise DraftwiseError(
            f"table file '{where}' was built for tokenizer {found_tok[:12]}..., but this "
            f"model's tokenizer is {str(tokenizer_id)[:12]}... (rebuild it with build-table)"
        )
    missing = [n for n in (*meta_names, *array_names) if n not in data]
    if missing:
        raise DraftwiseError(f"table file '{where}' is incomplete (missing {missing})")
    try:
        meta = {n: int(data[n]) for n in meta_names}
    except (TypeError, ValueError) as exc:
        raise DraftwiseError(f"table file '{where}' has bad metadata: {exc}") from None
    arrays = {n: data[n] for n in array_names}
    for name, a in arrays.items():
        if a.dtype.kind not in "iu":
            raise DraftwiseError(f"table file '{where}': array {name!r} is not integer")
    return meta, arrays


def check(cond: bool, path: str | os.PathLike[str], what: str) -> None:
    """Raise DraftwiseError about an inconsistent table file unless ``cond``."""
    if not cond:
        raise DraftwiseError(f"table file '{os.fspath(path)}' is inconsistent: {what}")
