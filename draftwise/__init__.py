"""draftwise: lossless speculative decoding for local LLMs.

    >>> import draftwise                                   # doctest: +SKIP
    >>> model = draftwise.load()                           # doctest: +SKIP
    >>> draftwise.generate(model, "Name three primes.")   # doctest: +SKIP

The API is imported lazily so that ``import draftwise.core`` stays numpy-only.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = [
    "CancelToken", "DraftwiseError", "GenerationResponse", "Model", "Session", "generate", "load",
    "stream_generate",
]

from draftwise.errors import DraftwiseError


def __getattr__(name: str) -> Any:
    if name in ("GenerationResponse", "Model", "generate", "load", "stream_generate"):
        from draftwise import api

        return getattr(api, name)
    if name in ("CancelToken", "Session"):
        from draftwise import session

        return getattr(session, name)
    raise AttributeError(f"module 'draftwise' has no attribute {name!r}")
