"""Which lossless compute mode the torch backend takes when the user names no dtype.

A mode is a dtype plus whether verification is batch-invariant. Speculative output equals
plain decoding *in the same mode*; the lossless candidates are float32, bfloat16 with
batch-invariant verification (bf16 without it flips near-tied argmaxes with the row
count) and, for a model converted from a Q4_0 / Q4_1 GGUF, ``4bit``: the file's own 4-bit
codes through the compiled int4 kernel (int8-quantised activations; torch's int4 CPU
kernel with bfloat16 activations where it cannot build), batch-invariant (``int4.py``).
Measured on this project's 2-core CPU (AMD EPYC, avx512_bf16, torch 2.13;
ms per verify at context 256, ``draftwise tune --modes``, ``bench/results/modes-cpu``):
1 row float32 34.3, bfloat16-invariant 22.4, 4bit-invariant 12.5; 16 rows 70.7 / 42.1 /
36.8. On an AVX2-only AMD EPYC Zen 3 (2026-11-27), with the compiled kernel's AVX2 path:
1 row float32 36.5, 4bit-invariant 11.0 (the torch int4 kernel: 28.6). So a CPU with the
compiled 4-bit kernel (AVX-512 VNNI, or AVX2 with FMA) or bf16 dot-product instructions
(``avx512_bf16``, ``amx_bf16``) defaults to 4bit for a Q4 GGUF's model; for any other
model a CPU with bf16 instructions defaults to bfloat16 (invariant), other CPUs, and
CUDA, to float32 (on a CPU batch-invariant too, its matmuls, with AVX2 and FMA, the
compiled, row-invariant ``csrc/f32.c``: ``f32.py``). 4bit is never a default for a model
that is not a Q4 GGUF's: there it would round the weights, a different model.
``draftwise tune --modes`` measures the candidates on the machine at hand and records the
fastest, which then wins over this rule (see ``draftwise.drafting.assets.recorded_mode``).

Example::

    >>> default_dtype(torch.device("cuda"))
    'float32'
"""

from __future__ import annotations

from pathlib import Path

import torch

from draftwise.core.device import cpu_flags

# (dtype, batch-invariant verification): the modes whose speculative output is plain
# decoding's, in the order a tie keeps. On a CPU float32 needs the mode too: without it
# a row's logits differ with the verify's row count by ~3e-5, enough to flip a seeded
# sample (``backend.INVARIANT_AUTO``). On CUDA the step is exact another way (fixed-shape
# graph steps on row-invariant kernels, ``docs/cuda.md``): not changed here.
LOSSLESS_MODES: tuple[tuple[str, bool], ...] = (("float32", False), ("bfloat16", True))
CPU_LOSSLESS_MODES: tuple[tuple[str, bool], ...] = (("float32", True), ("bfloat16", True))
FOUR_BIT_MODE = ("4bit", True)
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def exact_4bit(model_dir: Path | None, device: torch.device) -> bool:
    """Whether ``4bit`` computes with the model's own weights here: a CPU with the 4-bit
    kernel and a model converted from a GGUF whose block linears are Q4_0 / Q4_1 / Q4_K
    (then the codes are the file's, exactly, and its other tensors stay dense; for any
    other model ``4bit`` rounds the weights, a choice the user must make)."""
    from draftwise.backends.cuda.cpu.int4 import int4_available
    from draftwise.backends.gguf_q4 import q4_linear_count

    if model_dir is None or device.type != "cpu" or not int4_available():
        return False
    return q4_linear_count(Path(model_dir)) > 0


def lossless_modes(model_dir: Path | None, device: torch.device) -> tuple[tuple[str, bool], ...]:
    """The candidate modes for this model and device: ``CPU_LOSSLESS_MODES`` on a CPU,
    else ``LOSSLESS_MODES``, and ``4bit`` (batch-invariant) where it is exact
    (``exact_4bit``)."""
    base = CPU_LOSSLESS_MODES if device.type == "cpu" else LOSSLESS_MODES
    extra = (FOUR_BIT_MODE,) if exact_4bit(model_dir, device) else ()
    return base + extra


def native_4bit() -> bool:
    """Whether the compiled 4-bit kernel (``csrc/int4.c``: AVX-512 VNNI, or AVX2) runs here."""
    from draftwise.backends.cuda.cpu import native

    return native.int4_lib() is not None


def native_bf16() -> bool:
    """Whether this CPU has bfloat16 instructions (``BF16_CPU_FLAGS``): without them
    torch emulates bfloat16, several times slower than float32."""
    return bool(cpu_flags() & set(BF16_CPU_FLAGS))


def default_dtype(device: torch.device, model_dir: Path | None = None) -> str:
    """On a CPU: ``4bit`` for a model converted from a Q4 GGUF (its own weights, a quarter
    of the bytes) where the compiled 4-bit kernel or bf16 dot-product instructions are;
    else bfloat16 with those instructions, float32 without. Elsewhere float32."""
    if device.type != "cpu":
        return "float32"
    bf16 = native_bf16()
    if (bf16 or native_4bit()) and exact_4bit(model_dir, device):
        return "4bit"
    return "bfloat16" if bf16 else "float32"


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
