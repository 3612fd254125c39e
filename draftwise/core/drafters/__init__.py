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

from draftwise.core.autotune import AutoDrafter, CostModel
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


def _auto(cost: CostModel | None = None, max_budget: int = 64) -> Drafter:
    if cost is None:
        raise DraftwiseError(
            "the auto drafter needs this device's cost profile: use model.drafter('auto') "
            "(measures it on first use) or pass cost=CostModel"
        )
    return AutoDrafter([Cacheback(), SSD()], cost, max_budget)


REGISTRY["auto"] = _auto


def check_drafter_name(name: str) -> None:
    """Raise ``DraftwiseError`` unless ``name`` names a drafter or a combination."""
    parts = name.split("+")
    if len(parts) > 1 and ("none" in parts or "auto" in parts or len(set(parts)) != len(parts)):
        raise DraftwiseError(f"bad combined drafter {name!r}: list distinct drafters, not 'none' or 'auto'")
    for part in parts:
        if part not in REGISTRY:
            raise DraftwiseError(
                f"unknown drafter {part!r} (choose from: {', '.join(drafter_names())}, or combine with '+')"
            )


def make_drafter(name: str, **options: Any) -> Drafter:
    """Build the drafter called ``name``; ``a+b`` combines drafters into one tree
    (``Combined``). ``options`` go to the constructor of a single drafter (unknown options
    are an error naming them)."""
    check_drafter_name(name)
    if "+" in name:
        if options:
            raise DraftwiseError(f"options are not supported for a combined drafter ({name!r})")
        return Combined([make_drafter(p) for p in name.split("+")])
    factory = REGISTRY[name]
    try:
        return factory(**options)
    except TypeError as exc:
        raise DraftwiseError(f"bad option for drafter {name!r}: {exc}") from None


__all__ = ["SSD", "AutoDrafter", "Cacheback", "Combined", "check_drafter_name", "Drafter", "NoDrafter", "drafter_names", "make_drafter"]
