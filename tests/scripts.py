"""Load a file of the repository's ``scripts/`` folder as a module, for the tests of its
functions (the folder is not a package: the scripts run as files).

Example::

    mod = load_script("seeded_coupling")   # scripts/seeded_coupling.py
    mod.agreement(p, q)
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` imported afresh under the module name ``name``."""
    path = SCRIPTS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None or not path.is_file():
        raise FileNotFoundError(f"no script {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
