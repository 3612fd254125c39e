"""``draftwise.mlx_lm`` on the MLX backend with the real default model (float32).

mlx-lm's README examples run with only the import line changed, and write what
draftwise's own API writes; greedy text equals real mlx-lm's ``generate`` on the same
weights, so switching the import changes nothing but the speed. MLX on a Linux CPU is
slow (~250 ms per token), so generations here are 8 tokens.
"""

from __future__ import annotations

import pytest

from tests.mlx_lm.readme_examples import check_examples

pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

pytestmark = [pytest.mark.slow, pytest.mark.mlx]

N = 8


@pytest.fixture
def flat_profile(monkeypatch):  # type: ignore[no-untyped-def]
    """``auto`` (the default drafter) plans with a given flat cost curve instead of
    measuring this device's (9 minutes on mlx[cpu]): the plan changes what is drafted,
    never what is emitted, and these tests compare emitted text."""
    from draftwise.core.costmodel import CostModel
    from draftwise.drafting.assets import Assets

    flat = CostModel(rows=[1, 64], ms=[10.0, 11.0])
    monkeypatch.setattr(Assets, "cost_profile", lambda self, quiet=False, reps=3, sampling=False: flat)


def test_readme_examples(default_model_dir, capsys, flat_profile):  # type: ignore[no-untyped-def]
    check_examples(default_model_dir, "mlx", "float32", N, capsys)


def test_same_text_as_mlx_lm(default_model_dir):  # type: ignore[no-untyped-def]
    import mlx_lm

    import draftwise.mlx_lm as compat

    messages = [{"role": "user", "content": "Name three primes."}]
    model, tokenizer = compat.load(default_model_dir, backend="mlx", dtype="float32")
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    # mlx-lm 0.32 reads rope_theta only at the top level of config.json, where
    # transformers 5 no longer writes it (draftwise's MLX loader reads rope_parameters)
    rope = {"rope_theta": model.backend.model.module.args.rope_theta}
    theirs_model, theirs_tokenizer = mlx_lm.load(str(default_model_dir), model_config=rope)
    theirs_prompt = theirs_tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert list(prompt) == list(theirs_prompt)
    ours = compat.generate(model, tokenizer, prompt, max_tokens=N, drafter="cacheback")
    assert ours == mlx_lm.generate(theirs_model, theirs_tokenizer, theirs_prompt, max_tokens=N)
