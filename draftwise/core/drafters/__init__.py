"""Drafters by name, so apps and the API build them from a string.

Example::

    >>> make_drafter("cacheback", fl=2).name
    'cacheback'
    >>> make_drafter("none").name
    'none'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from draftwise.core.drafters.base import Drafter, NoDrafter
from draftwise.core.drafters.cacheback import Cacheback
from draftwise.core.drafters.compose import Combined
from draftwise.core.drafters.ssd import SSD
from draftwise.errors import DraftwiseError

REGISTRY: dict[str, Callable[..., Drafter]] = {
    "none": NoDrafter,
    "cacheback": Cacheback,
    "ssd": SSD,
}


def drafter_names() -> list[str]:
    return sorted(REGISTRY)


def make_drafter(name: str, **options: Any) -> Drafter:
    """Build the drafter called ``name``; ``a+b`` combines drafters into one tree
    (``Combined``). ``options`` go to the constructor of a single drafter (unknown options
    are an error naming them)."""
    if "+" in name:
        parts = name.split("+")
        if options:
            raise DraftwiseError(f"options are not supported for a combined drafter ({name!r})")
        if "none" in parts or len(set(parts)) != len(parts):
            raise DraftwiseError(f"bad combined drafter {name!r}: list distinct drafters, not 'none'")
        return Combined([make_drafter(p) for p in parts])
    factory = REGISTRY.get(name)
    if factory is None:
        raise DraftwiseError(
            f"unknown drafter {name!r} (choose from: {', '.join(drafter_names())}, or combine with '+')"
        )
    try:
        return factory(**options)
    except TypeError as exc:
        raise DraftwiseError(f"bad option for drafter {name!r}: {exc}") from None


__all__ = ["SSD", "Cacheback", "Combined", "Drafter", "NoDrafter", "drafter_names", "make_drafter"]
