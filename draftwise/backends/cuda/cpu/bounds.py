"""Argument checks at the Python-C boundary: nothing out of range ever reaches a kernel.

The compiled kernels (``csrc/``) trust their arguments: a slot index past the cache's
``tmax`` reads or writes the next head's (or layer's) memory, silently. Every ctypes entry
point in ``native.py`` and ``fused.py`` calls these first; a violation raises
``ValueError`` naming the value, before C runs.

Cost: the shape, dtype and contiguity checks are attribute reads (a few microseconds a
call). The slot-range check is one small reduction over the plan's (T, E) slot table;
the same table serves every layer and head of a step, so it is checked once per table
object and version (``torch.Tensor._version`` changes on every in-place write; inference
tensors have none, and the plans made under ``inference_mode`` are never written after
they are built), not once per layer: one check per step.

Example::

    check_slots(extra, n_extra, rows=4, tmax=8192)      # raises on a slot >= 8192
    check_write(start=8190, n_write=4, tmax=8192)        # raises: 8194 > 8192
"""

from __future__ import annotations

import threading

import numpy as np
import torch

_seen = threading.local()  # the last slot table found in range, per thread


def check_tensor(
    name: str, t: torch.Tensor, dtype: torch.dtype, ndim: int, contiguous: bool = True
) -> None:
    """``t`` is a CPU tensor of ``dtype`` with ``ndim`` dimensions (and contiguous)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch tensor, got {type(t).__name__}")
    if not t.is_cpu:  # (``device.type`` builds a string through a C++ stream: ~5 us cold)
        raise ValueError(f"{name} must be on the CPU, got {t.device}")
    if t.dtype != dtype:
        raise ValueError(f"{name} must be {dtype}, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


# the K/V caches the compiled attention reads: float32, and bfloat16 (the 4bit mode's: half
# the bytes a step streams; 1,024 tokens of SmolLM2's cache: 46 MB a step in float32)
KV_DTYPES = (torch.float32, torch.bfloat16)


def check_cache(name: str, cache: torch.Tensor, ndim: int) -> None:
    """``cache`` is a contiguous CPU tensor of a ``KV_DTYPES`` dtype with ``ndim`` dims."""
    check_tensor(name, cache, cache.dtype, ndim)
    if cache.dtype not in KV_DTYPES:
        raise ValueError(f"{name} must be float32 or bfloat16, got {cache.dtype}")


def check_write(start: int, n_write: int, tmax: int, rows: int | None = None) -> None:
    """Cache slots ``start .. start + n_write - 1`` exist (and ``n_write <= rows``)."""
    if start < 0 or n_write < 0:
        raise ValueError(f"cache write start={start}, n_write={n_write}: both must be >= 0")
    if start + n_write > tmax:
        raise ValueError(f"cache write start={start} + n_write={n_write} exceeds its {tmax} slots")
    if rows is not None and n_write > rows:
        raise ValueError(f"n_write={n_write} exceeds the call's {rows} rows")


def check_slots(
    extra: torch.Tensor, n_extra: torch.Tensor, rows: int, tmax: int, committed: int = 0
) -> None:
    """``extra`` (rows, E) int64 and ``n_extra`` (rows,) int32, contiguous; every count in
    ``0..E`` and every counted slot in ``0..tmax-1``; ``committed`` in ``0..tmax``."""
    check_tensor("extra", extra, torch.int64, 2)
    check_tensor("n_extra", n_extra, torch.int32, 1)
    _check_table_rows(extra.shape[0], n_extra.shape[0], rows, tmax, committed)
    key = (_version(extra), _version(n_extra), tmax)
    seen = getattr(_seen, "last", None)
    if seen is not None and seen[0] is extra and seen[1] is n_extra and seen[2] == key:
        return  # this table, unchanged, was checked for this cache size (another layer)
    # numpy views of the CPU tensors: a per-step path, where each small torch op cost
    # several microseconds more than numpy's
    _check_slot_values(extra.numpy(), n_extra.numpy(), tmax)
    _seen.last = (extra, n_extra, key)  # holds them: their ids cannot be reused meanwhile


def check_slot_arrays(
    extra: np.ndarray, n_extra: np.ndarray, rows: int, tmax: int, committed: int = 0
) -> None:
    """``check_slots`` for numpy tables (``FusedForward.step``): ``extra`` (rows, E) int64
    and ``n_extra`` (rows,) int32, C-contiguous; every count in ``0..E``, every counted
    slot in ``0..tmax-1``, ``committed`` in ``0..tmax``. Checked on every call (the
    tables are made per step).

    Example::

        >>> check_slot_arrays(np.array([[3, 9]]), np.array([1], np.int32), 1, tmax=8)
        >>> check_slot_arrays(np.array([[3, 9]]), np.array([2], np.int32), 1, tmax=8)
        Traceback (most recent call last):
        ...
        ValueError: slot extra[0, 1] = 9 outside the cache's 0..7
    """
    tables = (("extra", extra, np.int64, 2), ("n_extra", n_extra, np.int32, 1))
    for name, a, dtype, ndim in tables:
        if not isinstance(a, np.ndarray) or a.dtype != dtype or a.ndim != ndim:
            kind = np.dtype(dtype).name
            raise ValueError(f"{name} must be a {ndim}-d {kind} array, got {a!r:.60}")
        if not a.flags.c_contiguous:
            raise ValueError(f"{name} must be contiguous")
    _check_table_rows(extra.shape[0], n_extra.shape[0], rows, tmax, committed)
    _check_slot_values(extra, n_extra, tmax)


def _check_table_rows(t: int, n: int, rows: int, tmax: int, committed: int) -> None:
    """Slot tables of ``t`` and ``n`` rows serve a call of ``rows`` rows; ``committed``
    is in ``0..tmax``."""
    if t != rows or n != rows:
        raise ValueError(f"slot tables of {t} and {n} rows for a call of {rows} rows")
    if not 0 <= committed <= tmax:
        raise ValueError(f"committed={committed} outside the cache's 0..{tmax} slots")


def _check_slot_values(slots: np.ndarray, counts: np.ndarray, tmax: int) -> None:
    """Every count of ``counts`` (T,) in ``0..E`` and every counted slot of ``slots`` (T, E)
    in ``0..tmax-1``; the first bad slot in row-major order is named. A verify's few rows
    in plain Python (each numpy call costs more right after a forward), many in numpy."""
    t, e = slots.shape
    if not t:
        return
    if t * e <= 1024:  # a verify's few rows
        cl = counts.tolist()
        if min(cl) < 0 or max(cl) > e:
            raise ValueError(f"n_extra holds counts outside 0..{e}")
        for i, (c, row) in enumerate(zip(cl, slots.tolist(), strict=True)):
            for j, v in enumerate(row[:c]):
                if not 0 <= v < tmax:
                    raise ValueError(
                        f"slot extra[{i}, {j}] = {v} outside the cache's 0..{tmax - 1}"
                    )
        return
    if int(counts.min()) < 0 or int(counts.max()) > e:
        raise ValueError(f"n_extra holds counts outside 0..{e}")
    if e:
        used = np.arange(e) < counts[:, None]  # (T, E)
        bad = used & ((slots < 0) | (slots >= tmax))
        if bad.any():
            i, j = (int(v) for v in np.argwhere(bad)[0])
            raise ValueError(
                f"slot extra[{i}, {j}] = {int(slots[i, j])} outside the cache's 0..{tmax - 1}"
            )


def _version(t: torch.Tensor) -> int:
    """The in-place write counter; -1 for inference tensors, which have none (the plans
    built under ``torch.inference_mode`` are made per step and never written after)."""
    if t.is_inference():  # asking raises, and an exception costs ~20 us a call
        return -1
    try:
        return t._version
    except RuntimeError:
        return -1
