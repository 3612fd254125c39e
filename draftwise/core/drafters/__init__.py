"""Drafters by name, so apps and the API build them from a string.

A name may carry constructor options after a colon, ``name:key=value,...`` (values are
read as int, float, true/false, else kept as text); ``a+b`` combines drafters, each part
with its own options.

Example::

    >>> parse_spec("ngrammys:k=5,w=4")
    ('ngrammys', {'k': 5, 'w': 4})
    >>> make_drafter("context-ngram:k=3").k
    3

    >>> make_drafter("cacheback", fl=2).name
    'cacheback'
    >>> make_drafter("none").name
    'none'
    >>> make_drafter("cacheback:fl=2,budget=4").name  # any drafter's trees capped at 4 nodes
    'cacheback:budget=4'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from draftwise.core.autotune import AutoDrafter, CostModel
from draftwise.core.drafters.base import Drafter, NoDrafter
from draftwise.core.drafters.cacheback import Cacheback
from draftwise.core.drafters.compose import Capped, Combined, split_budget
from draftwise.core.drafters.context_ngram import ContextNgram
from draftwise.core.drafters.ngrammys import Bigram, NGrammys
from draftwise.core.drafters.ssd import SSD
from draftwise.errors import DraftwiseError

REGISTRY: dict[str, Callable[..., Drafter]] = {
    "none": NoDrafter,
    "cacheback": Cacheback,
    "ssd": SSD,
    "context-ngram": ContextNgram,
    "bigram": Bigram,
    "ngrammys": NGrammys,
}
NEEDS_BIGRAM_TABLE = frozenset({"bigram", "ngrammys"})  # built from the model (api.py)


def drafter_names() -> list[str]:
    return sorted(REGISTRY)


def auto_members(broad: Drafter) -> list[Drafter]:
    """The members of ``auto``, most precise first. The acceptance model keeps statistics
    per member, so a node a 3-token leader vouches for (source 0) is judged apart from the
    many guesses of a 1-token leader; on a steep cost curve the few nodes ``auto`` can
    afford then come from the precise member (measured: fixed ``cacheback:ll=3`` trees beat
    the LL=1 ones on this CPU in float32, bench/results/auto-vs-grid)."""
    precise = Cacheback(ll=3, table="dynamic")
    precise.name = "cacheback-ll3"  # its own state file beside the others (save_members)
    return [precise, SSD(), broad]


def _auto(cost: CostModel | None = None, max_budget: int = 64) -> Drafter:
    if cost is None:
        raise DraftwiseError(
            "the auto drafter needs this device's cost profile: use model.drafter('auto') "
            "(measures it on first use) or pass cost=CostModel"
        )
    return AutoDrafter(auto_members(Cacheback()), cost, max_budget)


REGISTRY["auto"] = _auto


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split one drafter spec ``name:key=value,...`` into (name, options)."""
    name, sep, rest = spec.partition(":")
    options: dict[str, Any] = {}
    if sep:
        for item in rest.split(","):
            key, eq, val = item.partition("=")
            if not eq or not key.strip().isidentifier() or not val.strip():
                raise DraftwiseError(f"bad drafter option {item!r} in {spec!r} (write name:key=value,...)")
            if key.strip() in options:
                raise DraftwiseError(f"drafter option {key.strip()!r} given twice in {spec!r}")
            options[key.strip()] = _value(val.strip())
    return name.strip(), options


def check_drafter_name(name: str) -> None:
    """Raise ``DraftwiseError`` unless ``name`` names a drafter or a combination (each part
    possibly with ``:key=value`` options)."""
    parts = [parse_spec(p)[0] for p in name.split("+")]
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
    inner, cap = split_budget(name)
    if cap is not None:  # ``name:budget=N``
        return Capped(make_drafter(inner, **options), cap)
    name, spec_options = parse_spec(name)
    clash = sorted(set(spec_options) & set(options))
    if clash:
        raise DraftwiseError(f"drafter option {clash[0]!r} given both in {name!r} and as an argument")
    options = {**spec_options, **options}
    factory = REGISTRY[name]
    try:
        return factory(**options)
    except TypeError as exc:
        raise DraftwiseError(f"bad option for drafter {name!r}: {exc}") from None


__all__ = ["SSD", "AutoDrafter", "Bigram", "Cacheback", "ContextNgram", "NGrammys", "parse_spec", "Combined", "check_drafter_name", "Drafter", "NoDrafter", "drafter_names", "make_drafter"]
