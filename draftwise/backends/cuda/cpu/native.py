"""Compiled CPU kernels: the batch-invariant attention, the 4bit mode's matmul and, on CPUs
with AVX2 and FMA, the float32 mode's matmul.

``csrc/attention.c`` computes each (row, head) start to end in one thread, over the row's
logical key list (the committed cache, then its tree ancestors and itself) in a fixed
order, so a row's bits never depend on the other rows: invariant by construction, in one
call per layer instead of the ~45 torch ops of ``invariant.block_attention``. Measured on
this project's CPU: see ``tests/backends/cuda/test_native.py`` and the README.

``csrc/int4.c`` multiplies 4-bit weights by int8-quantised activations (per row and block
of 32) with avx512_vnni dot products, or AVX2's ``vpmaddubsw`` where AVX-512 VNNI is
missing (the same bits), each output element start to end in one thread: row-invariant
too (see ``int4.py``); on a CPU with neither it reports itself unavailable
(``int4_lib()`` is None) and the 4bit mode keeps torch's kernel.

``csrc/f32.c`` multiplies float32 activations by a packed float32 weight with AVX2 FMAs,
each output element one lane's chain in input order: row-invariant; 2.5-6x faster than
torch's matmul at 1 to 16 rows on an AMD EPYC Zen 1 (AVX2 only), and a whole float32 verify
2.5-3.5x faster at 1 to 16 rows on a Zen 4 (AVX-512; see ``f32.py``); the float32 mode takes
it wherever it exists (``f32_lib()``).

``csrc/argmax.c`` is the greedy verify's argmax over bfloat16 or float32 logits, as
torch's (first index of the maximum, or of the first NaN), without a float32 copy.

``csrc/sample.c`` samples each row at temperature > 0 (the penalty, the temperature, a
float64 softmax, the CDF inverted at the row's uniform) in place of numpy's copies: the
token ``core.sampling.next_token`` gives, but at a CDF step's rounding (see the file).

``csrc/redrafter.c`` is the ReDrafter drafting step in one call (the cell, the context
attention and copy gate, the ResBlocks and the draft head, int8 weights, float32
activations): see ``backends/cuda/redrafter/native.py``.

All are compiled into one library, once per machine, with the system C compiler (``cc``,
``-O3 -march=native -fopenmp``, about 3 s on this project's CPU) into ``cache_dir()/kernels/`` (temp file,
then rename) and called through ``ctypes``. Without a compiler, or with
``DRAFTWISE_NATIVE=0``, the backend keeps ``block_attention`` and torch's int4 kernel
(other bits, equally invariant; the choice is made once per process, so one backend never
mixes the two); a build that fails warns once (``RuntimeWarning``, the compiler's first
error).

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
import warnings
from pathlib import Path

import numpy as np
import torch

from draftwise.backends.cuda.cpu.bounds import KV_DTYPES, check_slots, check_tensor
from draftwise.core.device import cpu_flags, cpu_name
from draftwise.core.paths import cache_dir
from draftwise.core.sampling import SamplingParams
from draftwise.errors import DraftwiseError

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = tuple(
    CSRC / f
    for f in ("attention.c", "int4.c", "forward.c", "f32.c", "redrafter.c", "argmax.c", "sample.c")
)
HEADERS = (CSRC / "vec.h",)  # not compiled on their own, but part of the build's key
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11")
# DRAFTWISE_SANITIZE=1 (scripts/test.sh --sanitize): AddressSanitizer and UBSan, any
# finding fatal; a build of its own (the flags are part of the key). The process must
# preload the sanitizer runtimes (the script does: LD_PRELOAD=libasan.so libubsan.so).
SANITIZE_FLAGS = ("-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                  "-fno-omit-frame-pointer", "-g")
INT4_TILE_BYTES = 320  # one 16 x 32 tile of int4.c's 4-bit layout (codes, scales, mins)
Q8_TILE_BYTES = 576  # one 16 x 32 tile of its Q8_0 layout (codes, scales, code sums)
_lock = threading.Lock()
_threads = threading.local()  # the calling thread's kernel thread count (kernel_threads)
_lib: ctypes.CDLL | None = None
_tried = False


def kernel_threads() -> int:
    """Threads the compiled kernels run with in the calling Python thread: what
    ``set_kernel_threads`` chose there, else torch's count. Every kernel gives a row the
    same bits at any count (tests/backends/cuda/cpu), so this changes speed only."""
    n = getattr(_threads, "n", None)
    return n if n is not None else torch.get_num_threads()


def set_kernel_threads(n: int | None) -> None:
    """The calling thread's kernel thread count (None: torch's again)."""
    if n is not None and n < 1:
        raise ValueError(f"kernel threads must be >= 1, got {n}")
    _threads.n = n


def _compiler() -> str | None:
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


def build_flags() -> tuple[str, ...]:
    """The compiler flags of this process's build (``DRAFTWISE_SANITIZE=1`` adds the
    sanitizers)."""
    choice = os.environ.get("DRAFTWISE_SANITIZE", "0")
    if choice not in ("0", "1"):
        raise DraftwiseError(f"DRAFTWISE_SANITIZE must be 0 or 1, got {choice!r}")
    return FLAGS + SANITIZE_FLAGS if choice == "1" else FLAGS


def _build(cc: str) -> Path | None:
    """Compile the kernels (once per source, flags and machine) and return the .so path."""
    try:
        src = b"".join(f.read_bytes() for f in (*SOURCES, *HEADERS))
    except OSError:  # an install without the C sources
        return None
    # -march=native: one build per CPU model and feature set (a shared home directory may
    # see several machines; a binary with instructions a CPU lacks would crash it)
    machine = " ".join((cpu_name(), *sorted(cpu_flags())))
    flags = build_flags()
    key = hashlib.sha256(src + " ".join((cc, *flags, machine)).encode())
    try:
        out = cache_dir() / "kernels" / f"native-{key.hexdigest()[:16]}.so"
        if out.is_file():
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".native-", suffix=".so", dir=out.parent)
        os.close(fd)
    except (OSError, DraftwiseError):  # a read-only cache
        return None
    try:
        # the sanitizer build is slower (debug information, instrumentation): 106 s on
        # an AMD EPYC Zen 3 against 15 s
        limit = 600 if flags != FLAGS else 120
        done = subprocess.run(
            [cc, *flags, *map(str, SOURCES), "-o", tmp, "-lm"], capture_output=True, timeout=limit
        )
        if done.returncode != 0:
            # say so once: without the kernels every mode runs slower (the 4bit default
            # falls back to float32), which a user would otherwise never learn why
            lines = done.stderr.decode(errors="replace").splitlines()
            first = next((ln for ln in lines if "error" in ln), lines[0] if lines else "")
            warnings.warn(
                f"draftwise: the compiled CPU kernels did not build with {cc} "
                f"({first.strip()[:200]}); running without them, slower "
                "(DRAFTWISE_NATIVE=0 skips the build)",
                RuntimeWarning, stacklevel=2,
            )
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
    """The compiled kernels, built on first use; None where they cannot be (no compiler,
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
                    lib.dw_int4_ok.restype = ctypes.c_int
                    lib.dw_int4_ok.argtypes = []
                    mm = lib.dw_int4_mm
                    mm.restype = ctypes.c_int
                    mm.argtypes = [
                        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                        ctypes.c_int64, ctypes.c_void_p, ctypes.c_int,
                    ]
                    q8 = lib.dw_q8_mm
                    q8.restype = ctypes.c_int
                    q8.argtypes = mm.argtypes
                    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
                    lib.dw_f32_ok.restype = ctypes.c_int
                    lib.dw_f32_ok.argtypes = []
                    f32 = lib.dw_f32_mm
                    f32.restype = ctypes.c_int
                    f32.argtypes = mm.argtypes
                    fw = lib.dw_forward
                    fw.restype = ctypes.c_int
                    fw.argtypes = [
                        i32, i32, i32, i32, i32, i32, ctypes.c_float,  # sizes, eps
                        p, i32, p, p,  # x_in, t, cos, sin
                        p, p, p, p, p, p, p,  # weights, norms, final norm
                        p, i32, i64, i64,  # cache, kv_bf16, layer stride, tmax
                        i64, i32,  # start, n_write
                        i64, p, p, i32,  # committed, extra, n_extra, e
                        p, p, i32,  # last_x, xn, threads
                    ]
                    kv = lib.dw_attention_kv  # dw_attention with a cache dtype flag after it
                    kv.restype = ctypes.c_int
                    kv.argtypes = [fn.argtypes[0], p, i32, *fn.argtypes[2:]]
                    # the tests' switches of how the work is split (never the bits)
                    for name in ("dw_attention_runs", "dw_attention_pv16", "dw_forward_split_rows",
                                 "dw_int4_split_rows"):
                        getattr(lib, name).restype = ctypes.c_int
                        getattr(lib, name).argtypes = [i32]
                    lib.dw_argmax_ok.restype = ctypes.c_int
                    lib.dw_argmax_ok.argtypes = []
                    lib.dw_argmax.restype = ctypes.c_int
                    lib.dw_argmax.argtypes = [p, i32, i64, i64, p]
                    lib.dw_sample_ok.restype = ctypes.c_int
                    lib.dw_sample_ok.argtypes = []
                    lib.dw_sample_rows.restype = ctypes.c_int
                    lib.dw_sample_rows.argtypes = [p, i32, i64, i64, ctypes.c_double,
                                                   ctypes.c_float, p, i64, p, p, p, p]
                    lib.dw_rd_ok.restype = ctypes.c_int
                    lib.dw_rd_ok.argtypes = []
                    rd = lib.dw_rd_step  # argtypes: redrafter/native.py (its structs)
                    rd.restype = ctypes.c_int
                    _lib = lib
                except OSError:
                    _lib = None
        return _lib


def int4_lib() -> ctypes.CDLL | None:
    """The compiled 4-bit matmul, or None (no compiler, ``DRAFTWISE_NATIVE=0``, or a CPU
    with neither AVX-512 VNNI and BF16 nor AVX2, FMA and F16C)."""
    lib = attention_lib()
    return lib if lib is not None and lib.dw_int4_ok() == 1 else None


def redrafter_lib() -> ctypes.CDLL | None:
    """The compiled ReDrafter drafting step (``csrc/redrafter.c``), or None: no compiler,
    ``DRAFTWISE_NATIVE=0``, or a CPU without AVX2 and FMA."""
    lib = attention_lib()
    return lib if lib is not None and lib.dw_rd_ok() == 1 else None


def f32_kernel() -> ctypes.CDLL | None:
    """The compiled float32 matmul (``csrc/f32.c``), or None: no compiler,
    ``DRAFTWISE_NATIVE=0``, or a CPU without AVX2 and FMA."""
    lib = attention_lib()
    return lib if lib is not None and lib.dw_f32_ok() == 1 else None


def f32_lib() -> ctypes.CDLL | None:
    """``f32_kernel()`` where the float32 mode takes it: by default wherever it exists
    (measured faster than torch's matmul at 1 to 32 rows on an AVX2-only Zen 1 and an
    AVX-512 Zen 4, see ``f32.py``); ``DRAFTWISE_F32_KERNEL=0`` keeps torch's matmul,
    ``1`` (or ``auto``, the default) takes the kernel."""
    choice = os.environ.get("DRAFTWISE_F32_KERNEL", "auto")
    if choice not in ("auto", "0", "1"):
        raise DraftwiseError(f"DRAFTWISE_F32_KERNEL must be auto, 0 or 1, got {choice!r}")
    return None if choice == "0" else f32_kernel()


def native_f32_mm(lib: ctypes.CDLL, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """(T, K) float32 times a packed (N / 16, K, 16) float32 weight (``f32.pack``):
    (T, N) float32."""
    check_tensor("packed float32 weight", packed, torch.float32, 3)
    check_tensor("x", x, x.dtype, 2, contiguous=False)
    t, k = x.shape
    tiles, kk, width = packed.shape
    if width != 16 or kk != k or x.dtype != torch.float32 or not x.is_cpu:
        raise ValueError(
            f"native float32 matmul needs (T, {kk}) float32 on CPU, got {tuple(x.shape)} {x.dtype}"
        )
    x = x.contiguous()
    y = torch.empty((t, tiles * 16), dtype=torch.float32)  # (T, N)
    if t:
        lib.dw_f32_mm(x.data_ptr(), t, k, packed.data_ptr(), tiles * 16, y.data_ptr(),
                      kernel_threads())
    return y


def argmax_lib() -> ctypes.CDLL | None:
    """The compiled row argmax (``csrc/argmax.c``), or None: no compiler,
    ``DRAFTWISE_NATIVE=0``, or a CPU without AVX-512 or AVX2. (On an AMD EPYC Zen 3, AVX2:
    23 / 61 / 101 us for 1 / 4 / 8 rows of 49,152 bfloat16 logits, torch's copy and argmax
    142 / 295 / 540.)"""
    lib = attention_lib()
    return lib if lib is not None and lib.dw_argmax_ok() == 1 else None


def native_argmax(lib: ctypes.CDLL, logits: torch.Tensor) -> np.ndarray:
    """(T, V) bfloat16 or float32 logits on CPU -> (T,) int64: what
    ``logits.argmax(-1)`` gives (first index of the maximum; a row with a NaN, its first
    NaN), read in place.

    Example::

        >>> native_argmax(lib, torch.tensor([[1.0, 3.0, 3.0]]))   # doctest: +SKIP
        array([1])
    """
    check_tensor("logits", logits, logits.dtype, 2)
    if logits.dtype not in (torch.bfloat16, torch.float32) or not logits.is_cpu:
        raise ValueError(
            f"native argmax needs bfloat16 or float32 logits on CPU, got {logits.dtype}"
        )
    t, v = logits.shape
    out = np.empty(t, np.int64)  # (T,)
    if lib.dw_argmax(logits.data_ptr(), int(logits.dtype == torch.bfloat16), t, v, out.ctypes.data):
        raise ValueError(f"native argmax takes rows of fewer than 2^31 logits, got {v}")
    return out


def sample_lib() -> ctypes.CDLL | None:
    """The compiled sampler (``csrc/sample.c``), or None: no compiler,
    ``DRAFTWISE_NATIVE=0``, or a CPU with neither AVX-512 nor AVX2 and FMA (there numpy
    samples)."""
    lib = attention_lib()
    return lib if lib is not None and lib.dw_sample_ok() == 1 else None


def native_sampling_takes(params: SamplingParams) -> bool:
    """Whether ``native_sample`` computes ``params``' tokens: a temperature, with or
    without a repetition penalty (top-k, top-p and min-p take the numpy path)."""
    return (not params.greedy and params.top_k == 0 and params.top_p >= 1.0
            and params.min_p == 0.0)


def native_sample(
    lib: ctypes.CDLL, logits: torch.Tensor, recent: np.ndarray, u: np.ndarray, params: SamplingParams
) -> np.ndarray:
    """(R, V) bfloat16 or float32 logits on CPU, (R, W) penalty windows and (R,) uniforms
    -> (R,) int64: each row's ``core.sampling.next_token`` (up to a CDF step's rounding),
    read in place. ``params`` must be ``native_sampling_takes``'.

    Example::

        >>> native_sample(lib, torch.tensor([[0.1, 2.0, 0.5]]), np.zeros((1, 0), np.int64),
        ...               np.array([0.3]), SamplingParams(temperature=1.0))   # doctest: +SKIP
        array([1])
    """
    check_tensor("logits", logits, logits.dtype, 2)
    if logits.dtype not in (torch.bfloat16, torch.float32) or logits.device.type != "cpu":
        raise ValueError(f"native sampling needs bfloat16 or float32 logits on CPU, got {logits.dtype}")
    if not native_sampling_takes(params):
        raise ValueError(f"native sampling takes a temperature and a penalty only, got {params}")
    r, v = logits.shape
    recent = np.ascontiguousarray(recent, np.int64)
    u = np.ascontiguousarray(u, np.float64)
    if recent.ndim != 2 or recent.shape[0] != r or u.shape != (r,):
        raise ValueError(f"native sampling of {r} rows got windows {recent.shape} and uniforms {u.shape}")
    out = np.empty(r, np.int64)  # (R,)
    x = np.empty(v, np.float32)  # the row as float32 (penalised)
    blocks = np.empty(v // 16 + 1, np.float64)  # its block sums
    pen = params.repetition_penalty if recent.shape[1] else 1.0
    rc = lib.dw_sample_rows(logits.data_ptr(), int(logits.dtype == torch.bfloat16), r, v,
                            float(params.temperature), float(pen), recent.ctypes.data,
                            recent.shape[1], u.ctypes.data, out.ctypes.data, x.ctypes.data,
                            blocks.ctypes.data)
    if rc:
        raise ValueError("native sampling: " + ("a penalty window id outside the vocabulary"
                                                if rc == 2 else f"rows of {v} logits not taken"))
    return out


def native_int4_mm(lib: ctypes.CDLL, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """(T, K) bfloat16 times a packed weight: 4-bit (N / 16, K / 32, 320) uint8 or Q8_0
    (N / 16, K / 32, 576) (see ``int4.pack_native``, ``int4.pack_q8``): (T, N) bfloat16."""
    check_tensor("packed 4-bit weight", packed, torch.uint8, 3)
    check_tensor("x", x, x.dtype, 2, contiguous=False)
    t, k = x.shape
    tiles, blocks, nbytes = packed.shape
    if nbytes not in (INT4_TILE_BYTES, Q8_TILE_BYTES):
        raise ValueError(f"not a packed native weight: tiles of {nbytes} bytes")
    fn = lib.dw_int4_mm if nbytes == INT4_TILE_BYTES else lib.dw_q8_mm
    if x.dtype != torch.bfloat16 or x.device.type != "cpu" or blocks * 32 != k:
        raise ValueError(f"native int4 needs (T, {blocks * 32}) bfloat16 on CPU, got {tuple(x.shape)} {x.dtype}")
    x = x.contiguous()
    y = torch.empty((t, tiles * 16), dtype=torch.bfloat16)  # (T, N)
    if t and fn(
        x.data_ptr(), t, k, packed.data_ptr(), tiles * 16, y.data_ptr(), kernel_threads()
    ):
        raise MemoryError("native int4 could not allocate its quantised rows")
    return y


def attention_pv16(lib: ctypes.CDLL) -> bool:
    """Whether ``lib``'s attention takes p @ V over a bfloat16 cache with vdpbf16ps, its
    softmax weights rounded to bfloat16 (``csrc/attention.c``, ``att_pv16``: head sizes 64,
    96 and 128 where the CPU has avx512_bf16)."""
    return bool(lib.dw_attention_pv16(-1))


def native_attention(
    lib: ctypes.CDLL,
    q: torch.Tensor,
    kv: torch.Tensor,
    committed: int,
    extra: torch.Tensor,
    n_extra: torch.Tensor,
) -> torch.Tensor:
    """Attention of ``q`` (H, T, D) over one layer's float32 or bfloat16 cache ``kv``
    (2, H_kv, T_max, D): row i sees slots ``0 .. committed-1`` then
    ``extra[i, :n_extra[i]]`` ((T, E) int64, (T,) int32). Returns (T, H D) float32. Rows
    of ``q`` beyond ``extra``'s are padding and get row 0's output (as
    ``block_attention``). A bfloat16 cache is attended as a bfloat16 model would (with
    avx512_bf16: the scaled query rounded to bfloat16 for the scores, exact float32
    products and sums; see ``csrc/attention.c``)."""
    if kv.dtype not in KV_DTYPES or not kv.is_contiguous() or q.device.type != "cpu":
        raise ValueError("native attention needs a contiguous float32 or bfloat16 CPU cache")
    check_tensor("kv", kv, kv.dtype, 4)
    check_tensor("q", q, q.dtype, 3, contiguous=False)
    h, t_all, d = q.shape
    if kv.shape[0] != 2 or kv.shape[3] != d:
        raise ValueError(f"kv of shape {tuple(kv.shape)} for queries of head size {d}")
    hkv, tmax = kv.shape[1], kv.shape[2]
    if hkv < 1 or h % hkv:
        raise ValueError(f"{h} query heads over {hkv} key/value heads")
    t = extra.shape[0] if extra.dim() == 2 else -1
    if not 0 <= t <= t_all:
        raise ValueError(f"slot tables of {t} rows for {t_all} query rows")
    check_slots(extra, n_extra, t, tmax, committed)
    e = extra.shape[1]
    qs = (q[:, :t].float() * d**-0.5).transpose(0, 1).contiguous()  # (T, H, D)
    out = torch.empty((t, h, d), dtype=torch.float32)  # (T, H, D)
    failed = lib.dw_attention_kv(
        qs.data_ptr(), kv.data_ptr(), int(kv.dtype == torch.bfloat16), tmax, h, hkv, d,
        committed, extra.data_ptr(), n_extra.data_ptr(), t, e, out.data_ptr(), kernel_threads(),
    )
    if failed:
        raise MemoryError("native attention could not allocate its score buffer")
    o = out.view(t, h * d)  # (T, H D)
    if t < t_all:
        o = torch.cat([o, o[:1].expand(t_all - t, -1)])  # (T_all, H D)
    return o
