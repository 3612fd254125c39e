"""Shared pytest fixtures, and which tests run only in the full run.

The default run (``bash scripts/test.sh``, what CI runs) keeps at least one real-model
identity test per mode and drafter family; ``FULL_ONLY`` lists the slower duplicates
(more prompts of the same check, a second mode of the same backend, the same drafter
through a second entry point). They get the ``full`` marker and run with
``bash scripts/test.sh --full`` (or ``pytest -m full``); nothing in them is skipped there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# node id prefixes; each line says what still covers the same ground on the default path
FULL_ONLY = (
    # float32 identity: test_identical_own_prompts[List ...] (cacheback, ssd, +, auto)
    "tests/test_identity.py::test_identical_specbench",
    "tests/test_identity.py::test_identical_own_prompts[Explain",
    "tests/test_identity.py::test_identical_own_prompts[Write",
    # MLX cacheback: test_cacheback_lossless_and_accepts_like_torch[Repeat ...], 4bit: test_4bit_lossless
    "tests/backends/mlx/test_mlx_default_model.py::test_cacheback_lossless_and_accepts_like_torch[Write",
    "tests/backends/mlx/test_mlx_default_model.py::test_cacheback_lossless_and_accepts_like_torch[Explain",
    "tests/backends/mlx/test_mlx_default_model.py::test_cli_generate_4bit",
    "tests/backends/mlx/test_mlx_invariant.py::test_cacheback_equals_plain[4bit]",
    # MLX redrafter: tests/backends/mlx/test_mlx_redrafter.py (the MLX step against torch's)
    "tests/backends/mlx/test_mlx_default_model.py::test_shipped_redrafter_and_auto_lossless",
    # torch redrafter: the shipped checkpoint on own prompts, random networks on one prompt
    "tests/backends/cuda/redrafter/test_redrafter_identity.py::test_shipped_redrafter_context_vocabulary_on_specbench",
    "tests/backends/cuda/redrafter/test_redrafter_identity.py::test_random_redrafter_identical_to_plain[Write",
    # bf16 invariant: test_bf16_cacheback_equals_plain_own_prompts
    "tests/backends/cuda/test_invariant.py::test_bf16_cacheback_equals_plain_on_specbench",
    # draft model and CARD: the same test on the first prompt
    "tests/backends/cuda/test_draft_lm.py::test_draft_model_and_card_identical_to_plain[Write",
    # the GPU kernels under Triton's interpreter (test_rowinv.py's child run, which gets the
    # parent's -m): every bucket with the default step's switches ([1:64:0:0:1]: the
    # attention kernel in chunks, the Triton RMSNorm); SDPA by the float32 step test's
    # [llama3-0]; that test keeps every family and each option at least once
    "tests/backends/cuda/gpu/test_rowinv.py::test_a_row_is_bit_equal_in_every_bucket_and_greedy_drafting_is_lossless[0]",
    # one attention program a kv head; the norms in the GEMMs with split-K (both off by
    # default; the step test [qwen2-1:0:1:16] keeps them): 45 s and 137 s on a Zen 3
    "tests/backends/cuda/gpu/test_rowinv.py::test_a_row_is_bit_equal_in_every_bucket_and_greedy_drafting_is_lossless[1]",
    "tests/backends/cuda/gpu/test_rowinv.py::test_a_row_is_bit_equal_in_every_bucket_and_greedy_drafting_is_lossless[1:64:1:16]",
    "tests/backends/cuda/gpu/test_rowinv.py::test_a_row_is_bit_equal_in_every_bucket_and_greedy_drafting_is_lossless[1:0:1]",
    # chunks of 64, and the norms inside the GEMMs: again with split-K in [1:64:1:16]
    "tests/backends/cuda/gpu/test_rowinv.py::test_a_row_is_bit_equal_in_every_bucket_and_greedy_drafting_is_lossless[1:64]",
    "tests/backends/cuda/gpu/test_rowinv.py::test_the_step_computes_what_the_torch_fixed_step_does[gemma2-1:64]",
    "tests/backends/cuda/gpu/test_rowinv.py::test_the_step_computes_what_the_torch_fixed_step_does[qwen2-1:0:1]",
    # the Triton RMSNorm: its kernel test, the step test [gemma2-1:256:0:0:1] and every
    # bucket's [1:64:0:0:1] stay
    "tests/backends/cuda/gpu/test_rowinv.py::test_the_step_computes_what_the_torch_fixed_step_does[qwen3-1:256:0:0:1]",
    "tests/backends/cuda/gpu/test_rowinv.py::test_the_step_computes_what_the_torch_fixed_step_does[qwen3-0]",
    "tests/backends/cuda/gpu/test_rowinv.py::test_the_step_computes_what_the_torch_fixed_step_does[gemma2-1:0:1]",
    "tests/backends/cuda/gpu/test_rowinv.py::test_the_step_computes_what_the_torch_fixed_step_does[gemma2-0]",
    "tests/backends/cuda/gpu/test_rowinv.py::test_the_step_computes_what_the_torch_fixed_step_does[qwen2-0]",
    # GGUF files against transformers' reading of them (~40 s each on a Zen 3, most of it
    # transformers dequantising): each family and each quantisation once, [llama-Q4_K]
    # and [qwen3-Q8_0]; the 4bit test keeps all four files
    "tests/models/test_gguf_families.py::test_a_gguf_decodes_as_transformers_reads_it[llama-Q8_0]",
    "tests/models/test_gguf_families.py::test_a_gguf_decodes_as_transformers_reads_it[qwen3-Q4_K]",
)


def pytest_configure(config: pytest.Config) -> None:
    """The tests get a cache directory of their own (``DRAFTWISE_CACHE_DIR``, inherited
    by the CLI and server subprocesses), so the cost profiles, tables and drafter state
    they measure and write never land in the user's cache (a curve timed while the suite
    loads the machine would steer the user's ``auto``). Its ``models`` and ``kernels``
    are links to the user's: the default model is converted and the kernels compiled
    once, not per run."""
    import os
    import tempfile

    from draftwise.core.paths import cache_dir

    real = cache_dir()
    own = Path(tempfile.mkdtemp(prefix="draftwise-test-cache-"))
    for shared in ("models", "kernels"):
        (real / shared).mkdir(parents=True, exist_ok=True)
        (own / shared).symlink_to(real / shared, target_is_directory=True)
    os.environ["DRAFTWISE_CACHE_DIR"] = str(own)
    config.add_cleanup(lambda: _remove_cache(own))


def _remove_cache(path: Path) -> None:
    """Remove the tests' cache directory; the links go, not what they point to."""
    import shutil

    for shared in ("models", "kernels"):
        link = path / shared
        if link.is_symlink():
            link.unlink()
    shutil.rmtree(path, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith(FULL_ONLY):
            item.add_marker(pytest.mark.full)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """HF-format directory of the embedded default model (converted once into the cache)."""
    from draftwise.models import ensure_default_model

    return ensure_default_model()


@pytest.fixture(scope="session")
def torch_model(default_model_dir: Path):  # type: ignore[no-untyped-def]
    """The default model on the torch backend, float32 (loaded once per test session)."""
    pytest.importorskip("torch")
    import draftwise

    return draftwise.load(default_model_dir, backend="torch", dtype="float32")
