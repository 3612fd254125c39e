"""Pick and build a backend by name: ``auto``, ``torch`` (alias ``cuda``) or ``mlx``.

``auto`` takes MLX on Apple Silicon (when mlx is installed), torch with CUDA where CUDA
exists, and torch on the CPU otherwise.

Example::

    backend = make_backend("auto", model_dir, dtype=None)
"""

from __future__ import annotations

import importlib.util
import platform
import sys
from pathlib import Path

from draftwise.core.backend import Backend
from draftwise.errors import DraftwiseError

BACKENDS = ("auto", "torch", "cuda", "mlx")


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def resolve_backend_name(name: str) -> str:
    """Map ``auto``/``cuda`` to a concrete backend name: ``torch`` or ``mlx``."""
    if name not in BACKENDS:
        raise DraftwiseError(f"unknown backend {name!r} (choose from: {', '.join(BACKENDS)})")
    if name == "cuda":
        return "torch"
    if name != "auto":
        return name
    apple = sys.platform == "darwin" and platform.machine() == "arm64"
    if apple and _installed("mlx"):
        return "mlx"
    if _installed("torch"):
        return "torch"
    if _installed("mlx"):
        return "mlx"
    raise DraftwiseError(
        "no backend installed: pip install 'draftwise[torch]' (or 'draftwise[mlx]' on a Mac)"
    )


def make_backend(
    name: str, model_dir: Path, dtype: str | None = None, invariant: bool | str = "auto"
) -> Backend:
    """Load the model in ``model_dir`` on the named backend (``dtype`` None = its default).
    ``invariant``: batch-invariant (bit-exact) verification; "auto" = where it is cheap."""
    concrete = resolve_backend_name(name)
    if concrete == "torch":
        if not _installed("torch"):
            raise DraftwiseError("backend 'torch' needs torch: pip install 'draftwise[torch]'")
        from draftwise.backends.cuda.backend import TorchBackend, _pick_device
        from draftwise.backends.cuda.modes import default_dtype

        # no dtype named: the device's fastest lossless mode (see backends/cuda/modes.py)
        dtype = dtype or default_dtype(_pick_device("auto"), model_dir)
        return TorchBackend.from_pretrained(model_dir, dtype=dtype, invariant=invariant)
    if not _installed("mlx"):
        raise DraftwiseError("backend 'mlx' needs mlx: pip install 'draftwise[mlx]'")
    from draftwise.backends.mlx.backend import MLXBackend  # type: ignore[import-not-found]

    return MLXBackend.from_pretrained(model_dir, dtype=dtype, invariant=invariant)  # type: ignore[no-any-return]
