"""The compiled kernels build for every x86-64 feature set they have paths for, not only
this machine's, and a build that fails says so.

``native.py`` compiles all of ``csrc/`` into one library with ``-march=native``: a source
that does not compile on some CPU leaves that CPU without any kernel (the 4bit default
mode falls back to float32). Each target is checked with ``-fsyntax-only`` (the
compiler's front end: types and intrinsics, well under a second a target): the x86-64
baseline (no kernel paths), Haswell (AVX2, FMA, F16C: the Zen 1-3 paths), Skylake-SP
(AVX-512 F/BW/VL without VNNI: 16-lane float helpers beside AVX2's int8 products),
Knights Landing (AVX-512 F without BW/VL), Cascade Lake (VNNI without BF16), Sapphire
Rapids (BF16, VNNI, AMX) and Zen 3. Skylake-SP failed until 2026-11-29
(``redrafter.c``'s AVX2 products summed their 8-lane accumulators with the 16-lane
``vsum``).
"""

from __future__ import annotations

import platform
import subprocess

import pytest

pytest.importorskip("torch")

from draftwise.backends.cuda.cpu import native  # noqa: E402

TARGETS = [
    "x86-64", "haswell", "skylake-avx512", "knl", "cascadelake", "sapphirerapids", "znver3",
]


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 targets")
@pytest.mark.parametrize("march", TARGETS)
def test_kernels_compile_for_each_x86_target(march: str) -> None:
    cc = native._compiler()
    if cc is None:
        pytest.skip("no C compiler here")
    flags = [f for f in native.FLAGS if f not in ("-march=native", "-shared", "-fPIC")]
    done = subprocess.run(
        [cc, "-fsyntax-only", f"-march={march}", *flags, *map(str, native.SOURCES)],
        capture_output=True, text=True, timeout=120,
    )
    if done.returncode != 0 and ("march" in done.stderr and "bad value" in done.stderr):
        pytest.skip(f"{cc} does not know -march={march}")
    assert done.returncode == 0, f"-march={march}:\n{done.stderr[:2000]}"


def test_a_failed_build_warns_and_leaves_no_library(tmp_path, monkeypatch) -> None:
    """A compiler that fails: one RuntimeWarning naming it and its error, no library (the
    backend then keeps its torch paths), nothing left in the cache."""
    cc = tmp_path / "broken-cc"
    cc.write_text("#!/bin/sh\necho 'redrafter.c:1:1: error: something went wrong' >&2\nexit 1\n")
    cc.chmod(0o755)
    monkeypatch.setenv("DRAFTWISE_CACHE_DIR", str(tmp_path / "cache"))
    want = r"did not build with .*broken-cc.*something went wrong"
    with pytest.warns(RuntimeWarning, match=want):
        assert native._build(str(cc)) is None
    kernels = tmp_path / "cache" / "kernels"
    assert not kernels.exists() or not any(kernels.iterdir())
