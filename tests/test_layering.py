"""The package's layering, enforced with import-linter (``.importlinter``): core imports
only numpy, the stdlib and draftwise.errors; backends never import apps; apps never import
a backend directly; no import cycles anywhere. The contracts are checked on the real tree
and shown to fail on a copy with a deliberate violation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")


def run_lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([lint, "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(lint is None, reason="import-linter is not installed (pip install -e '.[test]')")
def test_contracts_hold():
    out = run_lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 kept, 0 broken" in out.stdout


@pytest.mark.skipif(lint is None, reason="import-linter is not installed (pip install -e '.[test]')")
@pytest.mark.parametrize(
    "module, line, contract",
    [
        ("draftwise/core/tree.py", "import torch", "core imports only numpy"),
        ("draftwise/core/tree.py", "import draftwise.api", "layers:"),
        ("draftwise/backends/cuda/llama.py", "import draftwise.apps.cli", "layers:"),
        ("draftwise/apps/chat.py", "import draftwise.mlx_lm", "layers:"),
        ("draftwise/apps/generate.py", "import draftwise.backends.select", "use the public API, never a backend"),
        ("draftwise/core/drafters/base.py", "import draftwise.core.autotune", "no import cycles"),
    ],
)
def test_a_deliberate_violation_fails(tmp_path, module, line, contract):
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "draftwise", copy / "draftwise", ignore=shutil.ignore_patterns("__pycache__", "*.npz"))
    shutil.copy(ROOT / ".importlinter", copy / ".importlinter")
    with open(copy / module, "a") as f:
        f.write(f"\n{line}  # deliberate violation\n")
    out = run_lint(copy)
    assert out.returncode != 0
    assert "Broken contracts" in out.stdout, out.stdout
    broken = " ".join(out.stdout.split("Broken contracts")[1].split())  # unwrapped
    assert contract in broken and "deliberate violation" not in broken.split(contract)[0]


def test_every_module_imports_on_its_own():
    """No module works only because of another's import order (the old core cycle)."""
    for mod in ["draftwise.core.autotune", "draftwise.core.drafters", "draftwise.drafting",
                "draftwise.core.costprofile", "draftwise.apps.openai_schema"]:
        out = subprocess.run([sys.executable, "-c", f"import {mod}"], capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, f"{mod}: {out.stderr}"
