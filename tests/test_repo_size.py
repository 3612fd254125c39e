"""The repository stays light: no tracked file over 8 MB, the tracked files under 30 MB.

A clone should be quick, and the device tool carries the working tree to a GPU machine
under a 64 MiB limit. Bench records go in as ``results.json.gz``, superseded runs leave
the tree (git history keeps them), shipped data is stored in the precision it is used in.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE = 8 * 2**20
MAX_TOTAL = 30 * 2**20


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def tracked_sizes() -> dict[str, int]:
    """Size in bytes of every file git tracks in this checkout (those present on disk)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed: cannot list the tracked files")
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout
    except subprocess.CalledProcessError as e:
        pytest.skip(f"not inside a git checkout ({e.stderr.decode(errors='replace').strip()})")
    sizes = {}
    for raw in out.split(b"\0"):
        if not raw:
            continue
        name = raw.decode("utf-8", errors="surrogateescape")
        path = ROOT / name
        if path.is_file() and not path.is_symlink():  # a deleted, unstaged file is not here
            sizes[name] = path.stat().st_size
    return sizes


def test_no_tracked_file_over_8_mb() -> None:
    big = {n: s for n, s in tracked_sizes().items() if s > MAX_FILE}
    assert not big, f"tracked files over {_mb(MAX_FILE)}: " + ", ".join(
        f"{n} ({_mb(s)})" for n, s in sorted(big.items(), key=lambda x: -x[1])
    )


def test_tracked_files_under_30_mb() -> None:
    sizes = tracked_sizes()
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda x: -x[1])[:10]
    assert total <= MAX_TOTAL, (
        f"the tracked files add up to {_mb(total)}, over {_mb(MAX_TOTAL)}; the largest: "
        + ", ".join(f"{n} ({_mb(s)})" for n, s in largest)
    )
