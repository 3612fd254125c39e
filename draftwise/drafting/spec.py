"""The drafter spec grammar, parsed once: ``name[:key=value,...]`` parts joined by ``+``.

Every part may carry ``budget=N`` (a cap on that drafter's tree nodes); other options
stay text here and are typed and bounded against the drafter's declared options
(``draftwise.drafting.options``) when the spec is checked.

Example::

    >>> spec = parse_spec("cacheback:fl=2, budget=4 + ssd")
    >>> spec.parts[0]
    PartSpec(name='cacheback', options={'fl': '2'}, budget=4)
    >>> str(spec)                       # canonical text: parse(str(s)) == s
    'cacheback:fl=2,budget=4+ssd'
    >>> parse_spec("cacheback:fl")
    Traceback (most recent call last):
    ...
    draftwise.drafting.spec.SpecError: bad drafter option 'fl' in 'cacheback:fl' (write name:key=value,...)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from draftwise.errors import DraftwiseError

MAX_SPEC_CHARS = 512  # a spec is a short name; longer text is a mistake (or an attack)


class SpecError(DraftwiseError):
    """A drafter spec or option that is malformed, unknown, out of bounds or not allowed."""


@dataclass(frozen=True)
class PartSpec:
    """One drafter of a spec: its name, its options as text, and its tree cap."""

    name: str
    options: dict[str, str] = field(default_factory=dict)
    budget: int | None = None  # ``budget=N``: this drafter's trees capped at N nodes

    def __str__(self) -> str:
        items = [f"{k}={v}" for k, v in self.options.items()]
        if self.budget is not None:
            items.append(f"budget={self.budget}")
        return f"{self.name}:{','.join(items)}" if items else self.name


@dataclass(frozen=True)
class DrafterSpec:
    """A whole spec: one part, or several merged into one tree (``a+b``)."""

    parts: tuple[PartSpec, ...]

    def __str__(self) -> str:
        return "+".join(str(p) for p in self.parts)

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.parts]


def _budget(text: str, spec: str) -> int:
    try:
        cap = int(text)
    except ValueError:
        raise SpecError(f"drafter option budget must be an integer, got {text!r} in {spec!r}") from None
    if cap < 0:
        raise SpecError(f"drafter option budget must be >= 0, got {cap} in {spec!r}")
    return cap


def parse_part(text: str, spec: str) -> PartSpec:
    """Parse one ``name[:key=value,...]`` part of ``spec`` (for error messages)."""
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not name:
        raise SpecError(f"missing drafter name in {spec!r} (write name or name:key=value,...)")
    options: dict[str, str] = {}
    budget: int | None = None
    if sep:
        for item in rest.split(","):
            key, eq, val = (s.strip() for s in item.partition("="))
            if not eq or not key.isidentifier() or not val:
                raise SpecError(f"bad drafter option {item.strip()!r} in {spec!r} (write name:key=value,...)")
            if key in options or (key == "budget" and budget is not None):
                raise SpecError(f"drafter option {key!r} given twice in {spec!r}")
            if key == "budget":
                budget = _budget(val, spec)
            else:
                options[key] = val
    return PartSpec(name, options, budget)


def parse_spec(text: str) -> DrafterSpec:
    """Parse a drafter spec; raises ``SpecError`` naming the bad part."""
    if not isinstance(text, str):
        raise SpecError(f"a drafter spec must be text, got {type(text).__name__}")
    if len(text) > MAX_SPEC_CHARS:
        raise SpecError(f"drafter spec too long ({len(text)} characters, at most {MAX_SPEC_CHARS})")
    if not text.strip():
        raise SpecError("empty drafter spec: give a drafter name, e.g. 'auto' or 'cacheback'")
    parts = tuple(parse_part(p, text) for p in text.split("+"))
    names = [p.name for p in parts]
    if len(parts) > 1 and ("none" in names or "auto" in names or len(set(names)) != len(names)):
        raise SpecError(f"bad combined drafter {text!r}: list distinct drafters, not 'none' or 'auto'")
    return DrafterSpec(parts)
