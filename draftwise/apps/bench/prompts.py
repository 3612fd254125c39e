"""Read a benchmark prompt file (JSONL: ``id``, ``category``, ``turns``) and pick items.

Each line is one JSON object; ``turns`` lists the user turns in order (2 for MT-Bench
items). ``--categories`` keeps only the named categories and ``--limit N`` keeps the
first ``N`` items of each category, in file order.

Example::

    >>> import json, tempfile, os
    >>> rows = [{"id": "a", "category": "qa", "turns": ["Hi?"]},
    ...         {"id": "b", "category": "qa", "turns": ["Why?"]},
    ...         {"id": "c", "category": "writing", "turns": ["Write.", "Shorter."]}]
    >>> path = os.path.join(tempfile.mkdtemp(), "p.jsonl")
    >>> _ = open(path, "w").write("\\n".join(json.dumps(r) for r in rows))
    >>> [i.id for i in select_items(read_prompts(path), categories=["qa"], limit=1)]
    ['a']
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from draftwise.errors import DraftwiseError


@dataclass(frozen=True)
class BenchItem:
    """One benchmark question: its user turns, asked in order in one conversation."""

    id: str
    category: str
    turns: tuple[str, ...]


def read_prompts(path: str | os.PathLike[str]) -> list[BenchItem]:
    """Parse a JSONL prompt file; a bad line raises DraftwiseError naming file and line.

    Example::

        >>> read_prompts("/no/such.jsonl")
        Traceback (most recent call last):
        ...
        draftwise.errors.DraftwiseError: prompts file not found: '/no/such.jsonl'
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DraftwiseError(f"prompts file not found: '{p}'") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DraftwiseError(f"cannot read prompts file '{p}': {exc}") from None
    items: list[BenchItem] = []
    seen: set[str] = set()
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        item = _parse_line(line, f"{p}:{lineno}")
        if item.id in seen:
            raise DraftwiseError(f"{p}:{lineno}: duplicate id {item.id!r}")
        seen.add(item.id)
        items.append(item)
    if not items:
        raise DraftwiseError(f"prompts file '{p}' has no items")
    return items


def _parse_line(line: str, where: str) -> BenchItem:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DraftwiseError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(row, dict):
        raise DraftwiseError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for key in ("id", "category", "turns"):
        if key not in row:
            raise DraftwiseError(f"{where}: missing field {key!r}")
    turns = row["turns"]
    if isinstance(turns, str):
        turns = [turns]
    if (
        not isinstance(turns, list)
        or not turns
        or not all(isinstance(t, str) and t.strip() for t in turns)
    ):
        raise DraftwiseError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
    if not isinstance(row["category"], str) or not row["category"]:
        raise DraftwiseError(f"{where}: 'category' must be a non-empty string")
    return BenchItem(id=str(row["id"]), category=row["category"], turns=tuple(turns))


def select_items(
    items: Sequence[BenchItem], categories: Sequence[str] | None = None, limit: int | None = None
) -> list[BenchItem]:
    """Items of ``categories`` (all when None), at most ``limit`` per category, file order.

    An unknown category raises DraftwiseError listing the categories the file has.
    """
    present = sorted({i.category for i in items})
    if categories:
        for c in categories:
            if c not in present:
                raise DraftwiseError(
                    f"unknown category {c!r} (the prompts file has: {', '.join(present)})"
                )
    if limit is not None and limit < 1:
        raise DraftwiseError(f"--limit must be >= 1, got {limit}")
    wanted = set(categories) if categories else set(present)
    counts: dict[str, int] = {}
    out: list[BenchItem] = []
    for item in items:
        if item.category not in wanted:
            continue
        if limit is not None and counts.get(item.category, 0) >= limit:
            continue
        counts[item.category] = counts.get(item.category, 0) + 1
        out.append(item)
    return out
