import subprocess
import sys


def test_core_imports_no_framework():
    code = (
        "import sys, draftwise.core, draftwise.core.decode, draftwise.core.drafters.cacheback;"
        "bad = [m for m in ('torch', 'mlx', 'transformers') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
