"""The MLX backend on the real default model (SmolLM2-135M-Instruct).

- plain greedy equals mlx-lm's own ``generate_step`` on the same weights;
- lossless: ``drafter="cacheback"`` emits exactly the ``drafter="none"`` tokens (float32,
  and briefly in 4-bit), and every step accepts as many drafts as the torch backend's
  step on the same context;
- ``draftwise generate --backend mlx --dtype 4bit`` works end to end.

On a CPU, MLX's pip wheel multiplies matrices with a reference BLAS, so a 16-row verify
costs several plain steps; the speculative runs use a draft budget of 8 to stay short.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.prompts import OWN_PROMPTS

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

pytestmark = [pytest.mark.slow, pytest.mark.mlx]

MAX_TOKENS = 64
BUDGET = 8
# two of our own prompts and two repetitive ones: MLX on a CPU is slow (~60 s a prompt);
# the torch identity tests cover every own prompt
PROMPTS = OWN_PROMPTS[:2] + [
    "Repeat this sentence three times: the quick brown fox jumps over the lazy dog.",
    "Write a Python function that returns the squares of the numbers 1 to 10, then call it.",
]


def run(model, prompt, drafter: str, max_tokens: int = MAX_TOKENS):  # type: ignore[no-untyped-def]
    """(emitted ids, per-step (tokens emitted, drafts accepted)) of one greedy generation."""
    import draftwise

    if drafter != "none":
        model.drafter(drafter).reset()  # each prompt starts from an empty table
    steps, ids = [], []
    for r in draftwise.stream_generate(
        model, prompt, drafter=drafter, max_tokens=max_tokens, budget=BUDGET
    ):
        steps.append((len(r.tokens), r.from_draft))
        ids += r.tokens
    return ids, steps


def first_difference(a: list[int], b: list[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


@pytest.fixture(scope="module")
def mlx_model(default_model_dir: Path):  # type: ignore[no-untyped-def]
    import draftwise

    return draftwise.load(default_model_dir, backend="mlx", dtype="float32")


def test_plain_equals_mlx_lm_generate(mlx_model) -> None:  # type: ignore[no-untyped-def]
    from mlx_lm.generate import generate_step

    ids = mlx_model.encode_prompt(OWN_PROMPTS[0])
    ours, _ = run(mlx_model, OWN_PROMPTS[0], "none", max_tokens=16)
    module = mlx_model.backend.model.module
    theirs = [int(t) for t, _ in generate_step(mx.array(ids), module, max_tokens=16)]
    assert ours == theirs[: len(ours)]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_cacheback_lossless_and_accepts_like_torch(mlx_model, torch_model, prompt) -> None:  # type: ignore[no-untyped-def]
    plain, _ = run(mlx_model, prompt, "none")
    spec, steps = run(mlx_model, prompt, "cacheback")
    assert spec == plain, f"first difference at token {first_difference(spec, plain)}"
    # torch's cacheback output equals torch's plain output (tests/test_identity.py), so
    # the steps inside the prefix both backends agree on must accept the same drafts.
    torch_spec, torch_steps = run(torch_model, prompt, "cacheback")
    agree = first_difference(spec, torch_spec)
    ends = np.cumsum([n for n, _ in steps])
    same = int(np.searchsorted(ends, agree, side="right"))  # steps wholly inside the prefix
    assert steps[:same] == torch_steps[:same]
    assert same >= len(steps) // 2, f"backends diverge early: at token {agree}"


def test_4bit_lossless(default_model_dir: Path) -> None:
    import draftwise

    model = draftwise.load(default_model_dir, backend="mlx", dtype="4bit")
    assert model.backend.name.endswith("4bit")
    plain, _ = run(model, PROMPTS[3], "none", max_tokens=12)
    spec, _ = run(model, PROMPTS[3], "cacheback", max_tokens=12)
    assert spec == plain


def test_cli_generate_4bit(default_model_dir: Path) -> None:
    args = "generate --backend mlx --dtype 4bit --prompt hi --max-tokens 8".split()
    r = subprocess.run(
        [sys.executable, "-m", "draftwise", *args], capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()


def test_shipped_redrafter_and_auto_lossless(mlx_model, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The shipped ReDrafter checkpoint runs in MLX (its forward in MLX) and, alone or as
    ``auto``'s member, keeps MLX float32 output equal to plain decoding. ``auto`` plans
    with a given flat cost curve: measured live on mlx[cpu] (reference BLAS, a busy CI
    machine) the curve can make every one of 32 steps plain, and then nothing is drafted
    to check (seen once in CI)."""
    import draftwise
    from draftwise.core.costmodel import CostModel
    from draftwise.drafting.assets import Assets
    from draftwise.drafting.redrafter import SHIPPED

    flat = CostModel(rows=[1, 64], ms=[10.0, 11.0])
    monkeypatch.setattr(Assets, "cost_profile", lambda self, quiet=False, reps=3, sampling=False: flat)

    if not (SHIPPED / "config.json").is_file():
        pytest.skip("no shipped ReDrafter checkpoint")
    prompt = OWN_PROMPTS[0]
    plain, _ = run(mlx_model, prompt, "none", max_tokens=32)
    for spec in ("redrafter", "auto:redrafter=on"):
        out, steps = run(mlx_model, prompt, spec, max_tokens=32)
        assert out == plain, f"{spec}: first difference at token {first_difference(out, plain)}"
        assert sum(a for _, a in steps) > 0, f"{spec} accepted no drafts"
    assert mlx_model.drafter("auto:redrafter=on").members[-1].name == "redrafter"
    kw = dict(max_tokens=24, temp=0.8, top_p=0.95, seed=3, budget=BUDGET)
    hot = [r.tokens for r in draftwise.stream_generate(mlx_model, prompt, drafter="none", **kw)]
    spec_hot = [r.tokens for r in draftwise.stream_generate(mlx_model, prompt, drafter="redrafter", **kw)]
    assert sum(hot, []) == sum(spec_hot, [])
