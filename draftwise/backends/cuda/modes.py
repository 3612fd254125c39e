"""Which lossless compute mode the torch backend takes when the user names no dtype.

A mode is a dtype plus whether verification is batch-invariant. Speculative output equals
plain decoding *in the same mode*; the lossless candidates are float32 and bfloat16 with
batch-invariant verification (bf16 without it flips near-tied argmaxes with the row
count). Measured on this project's 2-core CPU (AMD EPYC, avx512_bf16, torch 2.13; ms per
verify at context 256, ``draftwise tune --modes``; see ``bench/results/modes-cpu``):
bfloat16-invariant costs less than float32 at every row count (1 row ~32 vs ~52 ms, 16
rows ~54 vs ~85 ms), because a CPU with bf16 dot-product instructions streams half the
bytes. So a CPU that has them (``avx512_bf16``, ``amx_bf16``) defaults to bfloat16
(invariant); any other CPU, and CUDA, to float32. ``draftwise tune --modes`` measures the
candidates on the machine at hand and records the faster one, which then wins over this
rule (see ``draftwise.drafting.assets.recorded_mode``).

Example::

    >>> default_dtype(torch.device("cuda"))
    'float32'
"""

from __future__ import annotations

import re

import torch

# (dtype, batch-invariant verification): the modes whose speculative output is plain
# decoding's, in the order a tie keeps.
LOSSLESS_MODES: tuple[tuple[str, bool], ...] = (("float32", False), ("bfloat16", True))
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (``/proc/cpuinfo``; empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            found = re.search(r"^flags\s*:\s*(.+)$", f.read(), re.MULTILINE)
    except OSError:
        return frozenset()
    return frozenset(found.group(1).split()) if found else frozenset()


def default_dtype(device: torch.device) -> str:
    """bfloat16 on a CPU with bf16 dot-product instructions, else float32."""
    if device.type == "cpu" and cpu_flags() & set(BF16_CPU_FLAGS):
        return "bfloat16"
    return "float32"


def mode_key(device: torch.device | None = None) -> str:
    """What a recorded mode choice is keyed by: device kind, name and thread count."""
    from draftwise.backends.cuda.backend import _pick_device
    from draftwise.core.device import cpu_name

    dev = device or _pick_device("auto")
    if dev.type == "cuda":
        return f"cuda|{torch.cuda.get_device_name(dev)}"
    return f"cpu|{cpu_name()}|x{torch.get_num_threads()}"


def pick_mode(ms: dict[str, dict[int, float]]) -> str:
    """The mode name (``dtype`` or ``dtype-invariant``) whose 1-row step plus 8-row verify
    costs least: a plain step and the tree size ``auto`` typically verifies.

    >>> pick_mode({"float32": {1: 52.0, 8: 71.0}, "bfloat16-invariant": {1: 32.0, 8: 43.0}})
    'bfloat16-invariant'
    """
    if not ms:
        raise ValueError("pick_mode needs at least one measured mode")
    return min(ms, key=lambda m: ms[m][1] + ms[m][8])


def mode_name(dtype: str, invariant: bool) -> str:
    return dtype + ("-invariant" if invariant else "")
