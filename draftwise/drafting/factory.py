"""One factory for every drafter: a spec (text) plus a drafting context -> a Drafter.

``check_spec`` validates a spec against the registry without building anything (the CLI
calls it before loading a model; a server calls it with ``remote=True`` on every request).
``build_drafter`` builds; ``make_drafter`` builds model-free drafters without a model.

Example::

    >>> check_spec("cacheback:fl=2+ssd").names
    ['cacheback', 'ssd']
    >>> make_drafter("cacheback:fl=2,budget=4").name
    'cacheback:budget=4'
    >>> check_spec("ssd:capacity=536870912", remote=True)
    Traceback (most recent call last):
    ...
    draftwise.drafting.spec.SpecError: ssd option capacity cannot be set by a request (a local-only option)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from draftwise.core.drafters.base import Drafter
from draftwise.core.drafters.compose import Capped, Combined
from draftwise.drafting.context import DraftingContext
from draftwise.drafting.options import check_options
from draftwise.drafting.registry import MAX_BUDGET, REGISTRY, DrafterEntry, drafter_names
from draftwise.drafting.spec import DrafterSpec, PartSpec, SpecError, parse_spec


def _entry(name: str, remote: bool) -> DrafterEntry:
    entry = REGISTRY.get(name)
    if entry is None or (remote and not entry.remote):
        names = [n for n in drafter_names() if not remote or REGISTRY[n].remote]
        raise SpecError(f"unknown drafter {name!r} (choose from: {', '.join(names)}, or combine with '+')")
    return entry


def check_spec(
    spec: str | DrafterSpec,
    *,
    remote: bool = False,
    max_budget: int = MAX_BUDGET,
    ready: Callable[[str], bool] | None = None,
    objects: dict[str, Any] | None = None,
) -> DrafterSpec:
    """The parsed spec, every name and option checked; raises ``SpecError`` naming the
    bad part. ``remote``: a network client's spec (only remote-safe names and options);
    ``max_budget``: the largest ``budget=N`` allowed; ``ready(asset)``: whether an asset
    is built (a remote spec needing one that is not is refused, never built)."""
    parsed = parse_spec(spec) if isinstance(spec, str) else spec
    if objects and len(parsed.parts) > 1:
        raise SpecError(f"options are not supported for a combined drafter ({str(parsed)!r})")
    for part in parsed.parts:
        entry = _entry(part.name, remote)
        check_options(part.name, entry.options, part.options, objects or {}, remote)
        if part.budget is not None and part.budget > max_budget:
            raise SpecError(f"drafter option budget must be <= {max_budget}, got {part.budget}")
        if remote and ready is not None:
            for asset in sorted(entry.assets):
                if not ready(asset):
                    raise SpecError(
                        f"drafter {part.name!r} is not available here: its {asset.replace('_', ' ')} "
                        f"is not built (start the server with --drafter {part.name} to build it)"
                    )
    return parsed


def _build_part(part: PartSpec, ctx: DraftingContext, objects: dict[str, Any]) -> Drafter:
    entry = REGISTRY[part.name]
    opts = check_options(part.name, entry.options, part.options, objects, remote=False)
    drafter = entry.build(ctx, opts)
    return Capped(drafter, part.budget) if part.budget is not None else drafter


def build_drafter(
    spec: str | DrafterSpec,
    ctx: DraftingContext,
    *,
    remote: bool = False,
    max_budget: int = MAX_BUDGET,
    **objects: Any,
) -> Drafter:
    """Build the drafter ``spec`` names; ``objects`` are options given as Python values
    (``table=BigramTable``, ``cost=CostModel``, ``k=5``) for a single-drafter spec."""
    ready = ctx.assets.ready if (remote and ctx.assets is not None) else None
    parsed = check_spec(spec, remote=remote, max_budget=max_budget, ready=ready, objects=objects)
    if len(parsed.parts) == 1:
        return _build_part(parsed.parts[0], ctx, objects)
    return Combined([_build_part(p, ctx, {}) for p in parsed.parts])


def make_drafter(spec: str | DrafterSpec, **objects: Any) -> Drafter:
    """A drafter without a model (model-free drafters, or ones given their tables)."""
    return build_drafter(spec, DraftingContext.standalone(), **objects)
