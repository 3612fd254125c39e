"""Where draftwise keeps its cached files (converted models, tables, profiles, the
compiled attention kernel): one place for every layer.

Example::

    >>> from draftwise.core.paths import cache_dir
    >>> cache_dir().name  # doctest: +SKIP
    'draftwise'
"""

from __future__ import annotations

import os
from pathlib import Path

from draftwise.errors import DraftwiseError


def cache_dir() -> Path:
    """Return the draftwise cache directory, creating it if needed.

    ``$DRAFTWISE_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/draftwise``, else
    ``~/.cache/draftwise``.

    Example::

        >>> os.environ["DRAFTWISE_CACHE_DIR"] = "/tmp/dw-cache"  # doctest: +SKIP
        >>> cache_dir()  # doctest: +SKIP
        PosixPath('/tmp/dw-cache')
    """
    explicit = os.environ.get("DRAFTWISE_CACHE_DIR")
    if explicit:
        path = Path(explicit).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
        path = base / "draftwise"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DraftwiseError(
            f"cannot create the cache directory '{path}' ({exc.strerror}); set DRAFTWISE_CACHE_DIR"
        ) from exc
    return path
