"""The batch-invariant mode's attention as one small C function per layer (CPU).

``csrc/attention.c`` computes each (row, head) start to end in one thread, over the row's
logical key list (the committed cache, then its tree ancestors and itself) in a fixed
order, so a row's bits never depend on the other rows: invariant by construction, in one
call per layer instead of the ~45 torch ops of ``invariant.block_attention``. Measured on
this project's CPU: see ``tests/backends/cuda/test_native.py`` and the README.

It is compiled once per machine with the system C compiler (``cc``, ``-O3 -march=native
-fopenmp``, well under a second) into ``cache_dir()/kernels/`` (temp file, then rename)
and called through ``ctypes``. Without a compiler, or with ``DRAFTWISE_NATIVE=0``, the
backend keeps ``block_attention`` (other bits, equally invariant; one backend never mixes
the two).

Example::

    lib = attention_lib()                      # None: no compiler here
    o = native_attention(lib, q, kv, committed, extra, n_extra)   # (T, H D) float32
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from draftwise.core.device import cpu_flags, cpu_name
from draftwise.core.paths import cache_dir
from draftwise.errors import DraftwiseError

SOURCE = Path(__file__).resolve().parent / "csrc" / "attention.c"
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11")
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False


def _compiler() -> str | None:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


def _build(cc: str) -> Path | None:
    """Compile the kernel (once per source, flags and machine) and return the .so path."""
    try:
        src = SOURCE.read_bytes()
    except OSError:  # an install without the C source
        return None
    # -march=native: one build per CPU model and feature set (a shared home directory may
    # see several machines; a binary with instructions a CPU lacks would crash it)
    machine = " ".join((cpu_name(), *sorted(cpu_flags())))
    key = hashlib.sha256(src + " ".join((cc, *FLAGS, machine)).encode())
    try:
        out = cache_dir() / "kernels" / f"attention-{key.hexdigest()[:16]}.so"
        if out.is_file():
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".attention-", suffix=".so", dir=out.parent)
        os.close(fd)
    except (OSError, DraftwiseError):  # a read-only cache
        return None
    try:
        done = subprocess.run(
            [cc, *FLAGS, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, timeout=120
        )
        if done.returncode != 0:
            return None
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
        return out
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def attention_lib() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None where it cannot be (no compiler,
    a failed build, ``DRAFTWISE_NATIVE=0``)."""
    global _lib, _tried
    if os.environ.get("DRAFTWISE_NATIVE", "1") == "0":
        return None
    with _lock:
        if not _tried:
            _tried = True
            cc = _compiler()
            path = _build(cc) if cc else None
            if path is not None:
                try:
                    lib = ctypes.CDLL(str(path))
                    fn = lib.dw_attention
                    fn.restype = ctypes.c_int
                    fn.argtypes = [
                        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int,
                        ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_void_p,
                        ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                        ctypes.c_int,
                    ]
                    _lib = lib
                except OSError:
                    _lib = None
        return _lib


def native_attention(
    lib: ctypes.CDLL,
    q: torch.Tensor,
    kv: torch.Tensor,
    committed: int,
    extra: torch.Tensor,
    n_extra: torch.Tensor,
) -> torch.Tensor:
    """Attention of ``q`` (H, T, D) over one layer's float32 cache ``kv`` (2, H_kv,
    T_max, D): row i sees slots ``0 .. committed-1`` then ``extra[i, :n_extra[i]]``
    ((T, E) int64, (T,) int32). Returns (T, H D) float32. Rows of ``q`` beyond
    ``extra``'s are padding and get row 0's output (as ``block_attention``)."""
    h, t_all, d = q.shape
    t, e = extra.shape
    hkv, tmax = kv.shape[1], kv.shape[2]
    if kv.dtype != torch.float32 or not kv.is_contiguous() or q.device.type != "cpu":
        raise ValueError("native attention needs a contiguous float32 CPU cache")
    qs = (q[:, :t].float() * d**-0.5).transpose(0, 1).contiguous()  # (T, H, D)
    out = torch.empty((t, h, d), dtype=torch.float32)  # (T, H, D)
    failed = lib.dw_attention(
        qs.data_ptr(), kv.data_ptr(), tmax, h, hkv, d, committed, extra.data_ptr(),
        n_extra.data_ptr(), t, e, out.data_ptr(), torch.get_num_threads(),
    )
    if failed:
        raise MemoryError("native attention could not allocate its score buffer")
    o = out.view(t, h * d)  # (T, H D)
    if t < t_all:
        o = torch.cat([o, o[:1].expand(t_all - t, -1)])  # (T_all, H D)
    return o
