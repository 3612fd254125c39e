"""Atomic file writes: whatever the user saved is never left half-written.

Everything goes to a temporary file in the target's folder, is flushed to disk, and only
then renamed over the target (``os.replace`` is atomic on POSIX and Windows). On any
error the temporary file is removed and the old target is untouched.

Example::

    >>> import json, tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> with atomic_file(os.path.join(d, "x.json"), "w") as f:
    ...     json.dump({"a": 1}, f)
    >>> open(os.path.join(d, "x.json")).read()
    '{"a": 1}'
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; moved into place if the block succeeds.
    The folder must exist (a missing one raises ``FileNotFoundError``)."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; these files are not secrets
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO[Any]]:
    """Open a temporary file for writing; flushed, fsynced and renamed onto ``path``."""
    with atomic_path(path) as tmp, open(tmp, mode) as f:
        yield f
        f.flush()
        os.fsync(f.fileno())
