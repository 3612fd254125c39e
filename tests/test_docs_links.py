"""Every relative link in the README, docs/ and the bench runs' READMEs leads somewhere:
to a file or folder of this checkout and, with a ``#fragment`` into a Markdown file, to one
of its headings. A run removed from bench/results/ or a page renamed in docs/ breaks no
page silently."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def pages() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found += sorted((ROOT / "bench" / "results").glob("**/README.md"))
    return [p for p in found if p.is_file()]


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every Markdown link outside fenced code blocks."""
    out, in_code = [], False
    for no, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if in_code:
            continue
        line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link
        for m in LINK.finditer(line):
            out.append((no, m.group(1) or m.group(2)))
    return out


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out, in_code = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            title = re.sub(r"[^\w\- ]", "", title.replace("`", ""))
            out.add(title.replace(" ", "-"))
    return out


def broken(page: Path) -> list[str]:
    bad = []
    for no, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        path_part, _, fragment = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        where = f"{page.relative_to(ROOT)}:{no}: {target}"
        if not dest.exists():
            bad.append(f"{where} (no such path)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            bad.append(f"{where} (no heading #{fragment})")
    return bad


def test_the_pages_exist() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in pages()}
    assert {"README.md", "bench/results/README.md", "docs/layout.md"} <= names


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    assert not broken(page), "\n".join(broken(page))


def test_the_readme_stays_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 260, f"README.md has {len(lines)} lines; deep material goes in docs/"


def test_every_speed_table_number_links_to_a_committed_run() -> None:
    """The README's speed table: each tok/s cell links to the bench run it comes from."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Speed", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| ") and "---" not in r][1:]
    assert rows
    for row in rows:
        tok_s = row.split("|")[2]
        m = re.search(r"\]\((bench/results/[^)#]+)\)", tok_s)
        assert m, f"no run linked for: {row}"
        assert (ROOT / m.group(1)).exists(), m.group(1)
