"""What a backend runs on, described by the backend itself.

Cost profiles are measured per device, so their file names and the bench reports are
keyed by this description; nothing in draftwise guesses the device from a backend's
name string.

Example::

    >>> d = DeviceInfo(kind="cpu", name="Intel Xeon", dtype="bfloat16", mode="invariant", threads=2)
    >>> d.key()
    'cpu|Intel Xeon|bfloat16|invariant|x2'
    >>> d.describe()
    'Intel Xeon x2'
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class DeviceInfo:
    """The device a backend computes on, and how."""

    kind: str  # "cpu", "cuda", "mlx-gpu", "mlx-cpu"
    name: str  # e.g. "Intel(R) Xeon(R) Platinum 8488C", "NVIDIA H100", "Apple M3"
    dtype: str  # compute dtype: "float32", "bfloat16", "4bit", ...
    mode: str  # "normal" or "invariant" (batch-invariant verification)
    threads: int  # CPU threads the backend computes with (1 on a GPU)
    # the compiled kernels in use, when the backend has any ("" otherwise): a new build
    # (another draftwise, compiler or CPU) gets its own cost profile
    kernels: str = ""

    def key(self) -> str:
        """A stable identity for caches keyed by device (cost profiles)."""
        key = f"{self.kind}|{self.name}|{self.dtype}|{self.mode}|x{self.threads}"
        return f"{key}|{self.kernels}" if self.kernels else key

    def describe(self) -> str:
        """A short human-readable description, as the bench reports print it."""
        return f"{self.name} x{self.threads}" if self.kind == "cpu" else self.name

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            found = re.search(r"model name\s*:\s*(.+)", f.read())
        if found:
            return found.group(1).strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (``/proc/cpuinfo``; empty where there is none).

    Example::

        >>> "avx2" in cpu_flags() or True
        True
    """
    try:
        with open("/proc/cpuinfo") as f:
            found = re.search(r"^flags\s*:\s*(.+)$", f.read(), re.MULTILINE)
    except OSError:
        return frozenset()
    return frozenset(found.group(1).split()) if found else frozenset()


def cpu_threads() -> int:
    return os.cpu_count() or 1
