"""Typed drafter options with bounds, and whether a remote request may set them.

Each drafter declares its options once (``draftwise.drafting.registry``); the factory
checks a spec against them before anything is built, so a mistake names the option and
the ones the drafter accepts, and a server can refuse what a client must not set
(paths, capacities, anything that allocates or reads files: ``remote=False``).

Example::

    >>> fl = Option("fl", int, 3, "follower length", low=1, high=16)
    >>> fl.parse("4", "cacheback")
    4
    >>> fl.parse("40", "cacheback")
    Traceback (most recent call last):
    ...
    draftwise.drafting.spec.SpecError: cacheback option fl must be <= 16, got 40
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from draftwise.drafting.spec import SpecError

#: option kinds besides int, float, bool and str
PATH, OBJECT = "path", "object"


@dataclass(frozen=True)
class Option:
    """One constructor option of a drafter."""

    name: str
    kind: type | str  # int, float, bool, str, PATH (a file: local only) or OBJECT (Python only)
    default: Any
    help: str
    low: float | None = None  # inclusive bounds for numbers
    high: float | None = None
    choices: tuple[str, ...] | None = None  # allowed values for str options
    remote: bool = True  # may a network client set it?

    def __post_init__(self) -> None:
        if self.kind in (PATH, OBJECT) and self.remote:
            raise ValueError(f"option {self.name}: paths and objects are never remote-settable")

    def describe(self) -> str:
        if self.choices:
            return f"{self.name} ({'|'.join(self.choices)})"
        if self.low is not None or self.high is not None:
            lo = "" if self.low is None else _num(self.low)
            hi = "" if self.high is None else _num(self.high)
            return f"{self.name} ({lo}..{hi})"
        return self.name

    def parse(self, text: str, drafter: str) -> Any:
        """The value of ``text`` (from a spec) as this option's type, checked."""
        if self.kind == OBJECT:
            raise SpecError(f"{drafter} option {self.name} cannot be given in a spec (Python only)")
        value: Any
        try:
            if self.kind is bool:
                low = text.lower()
                if low not in ("true", "false", "1", "0"):
                    raise ValueError
                value = low in ("true", "1")
            elif self.kind is int:
                value = int(text)
            elif self.kind is float:
                value = float(text)
            else:
                value = text
        except ValueError:
            kind = self.kind if isinstance(self.kind, str) else self.kind.__name__
            raise SpecError(f"{drafter} option {self.name} must be {kind}, got {text!r}") from None
        return self.check(value, drafter)

    def check(self, value: Any, drafter: str) -> Any:
        """``value`` if it has this option's type and lies within its bounds."""
        if self.kind == OBJECT:
            return value
        if self.kind is int:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise SpecError(f"{drafter} option {self.name} must be an integer, got {value!r}")
            value = int(value)
        elif self.kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
                raise SpecError(f"{drafter} option {self.name} must be a number, got {value!r}")
            value = float(value)
            if not np.isfinite(value):
                raise SpecError(f"{drafter} option {self.name} must be finite, got {value!r}")
        elif self.kind is bool:
            if not isinstance(value, bool):
                raise SpecError(f"{drafter} option {self.name} must be true or false, got {value!r}")
        elif not isinstance(value, str):
            raise SpecError(f"{drafter} option {self.name} must be text, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise SpecError(
                f"{drafter} option {self.name} must be one of {', '.join(self.choices)}, got {value!r}"
            )
        if self.low is not None and value < self.low:
            raise SpecError(f"{drafter} option {self.name} must be >= {_num(self.low)}, got {value!r}")
        if self.high is not None and value > self.high:
            raise SpecError(f"{drafter} option {self.name} must be <= {_num(self.high)}, got {value!r}")
        return value


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def check_options(
    drafter: str,
    declared: tuple[Option, ...],
    text: Mapping[str, str],
    objects: Mapping[str, Any],
    remote: bool,
) -> dict[str, Any]:
    """Typed options for ``drafter`` from spec ``text`` and Python ``objects``.

    Unknown options name the accepted ones; with ``remote`` an option that a client may
    not set is refused. Options not given are left out (the builder applies defaults)."""
    by_name = {o.name: o for o in declared}
    accepted = ", ".join(o.describe() for o in declared) or "none"
    clash = sorted(set(text) & set(objects))
    if clash:
        raise SpecError(f"drafter option {clash[0]!r} given both in the spec and as an argument")
    out: dict[str, Any] = {}
    for key, val in [*text.items(), *objects.items()]:
        opt = by_name.get(key)
        if opt is None:
            raise SpecError(f"unknown option {key!r} for drafter {drafter!r} (it accepts: {accepted}, budget)")
        if remote and not opt.remote:
            raise SpecError(f"{drafter} option {key} cannot be set by a request (a local-only option)")
        out[key] = opt.parse(val, drafter) if key in text else opt.check(val, drafter)
    return out
