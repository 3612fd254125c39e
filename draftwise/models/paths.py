"""Where draftwise keeps converted models and other cached files.

Example::

    >>> from draftwise.models.paths import cache_dir
    >>> cache_dir().name  # doctest: +SKIP
    'draftwise'
"""

from __future__ import annotations

from pathlib import Path

from draftwise.core.paths import cache_dir

__all__ = ["cache_dir", "models_dir"]


def models_dir() -> Path:
    """Return ``cache_dir()/models``, creating it if needed.

    Example::

        >>> models_dir().name  # doctest: +SKIP
        'models'
    """
    path = cache_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path
