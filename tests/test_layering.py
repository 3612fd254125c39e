"""The package's layering, enforced with import-linter (``.importlinter``): core imports
only numpy, the stdlib and draftwise.errors; backends never import apps; apps never import
a backend directly; the torch and MLX backends' rooms and the training package are layered;
no import cycles anywhere, at any package level or between modules, imports a type checker
alone sees included. The contracts are checked on the real tree and shown to fail on a copy
with a deliberate violation."""

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
    assert "8 kept, 0 broken" in out.stdout


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
        ("draftwise/backends/cuda/cpu/native.py", "import draftwise.backends.cuda.llama", "torch backend rooms"),
        ("draftwise/backends/cuda/gpu/streams.py", "import draftwise.backends.cuda.cpu.native", "torch backend rooms"),
        ("draftwise/backends/cuda/llama.py", "import draftwise.backends.mlx.llama", "backends: select"),
        ("draftwise/backends/mlx/load.py", "import draftwise.backends.mlx.backend", "mlx backend rooms"),
        ("draftwise/training/fit.py", "import draftwise.training.recipe", "training: recipe"),
        ("draftwise/drafting/registry.py", "import draftwise.training.recipe", "layers:"),
        (
            "draftwise/core/drafters/card.py",
            "if TYPE_CHECKING:\n    import draftwise.core.autotune",
            "no import cycles",
        ),
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


def module_cycles(graph) -> list[list[str]]:  # noqa: ANN001  (a grimp ImportGraph)
    """Every strongly connected set of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.find_modules_directly_imported_by(v)):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for m in sorted(graph.modules):
        if m not in index:
            visit(m)
    return found


def test_no_module_imports_itself_in_a_circle():
    """Module by module, ``if TYPE_CHECKING:`` imports included: no two modules import
    each other, directly or around a loop (``acyclic_siblings`` sees packages as wholes)."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("draftwise", exclude_type_checking_imports=False, cache_dir=None)
    assert module_cycles(graph) == []


def test_a_module_circle_is_found(tmp_path, monkeypatch):
    grimp = pytest.importorskip("grimp")
    pkg = tmp_path / "circ"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import circ.b\n")
    (pkg / "b.py").write_text("import circ.a\n")
    (pkg / "c.py").write_text("import circ.b\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("circ", exclude_type_checking_imports=False, cache_dir=None)
    assert module_cycles(graph) == [["circ.a", "circ.b"]]
