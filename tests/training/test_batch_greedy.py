"""Batched greedy continuations (distillation data): left-padded rows of different
lengths continue exactly as each prompt alone, and as transformers' greedy decoding, on
the real default model in float32; finished rows stop being valid."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from draftwise.backends.cuda.llama import Llama  # noqa: E402
from draftwise.errors import DraftwiseError  # noqa: E402
from draftwise.training.batch_greedy import (  # noqa: E402
    greedy_continuations,
    prompt_states,
)

N = 12


@pytest.fixture(scope="module")
def setup(default_model_dir):  # type: ignore[no-untyped-def]
    tok = transformers.AutoTokenizer.from_pretrained(default_model_dir)
    texts = ["Name three colours.", "What is 2 + 2? Answer briefly, please.", "Hi"]
    prompts = []
    for t in texts:
        x = tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
        prompts.append(list(x["input_ids"] if hasattr(x, "keys") else x))
    model = Llama.load(default_model_dir, torch.float32, torch.device("cpu"), max_cache_len=1)
    return default_model_dir, tok, prompts, model


def test_batch_equals_each_prompt_alone_and_transformers(setup):  # type: ignore[no-untyped-def]
    model_dir, tok, prompts, model = setup
    tokens, hidden, valid = greedy_continuations(model, prompts, N, eos=None, prefill_rows=2)
    assert tokens.shape == (3, N) and hidden.shape == (3, N, model.cfg.dim) and valid.all()
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    for r, p in enumerate(prompts):
        t1, h1, _ = greedy_continuations(model, [p], N, eos=None)
        assert t1[0].tolist() == tokens[r].tolist()
        np.testing.assert_allclose(h1[0].astype(np.float32), hidden[r].astype(np.float32),
                                   atol=2e-2)
        with torch.inference_mode():
            ids = torch.tensor([p])
            want = hf.generate(ids, max_new_tokens=N, do_sample=False, pad_token_id=0)[0, len(p) :]
            # hidden[j] predicted tokens[j]: the hidden state after the prompt's last token
            out = hf(ids, output_hidden_states=True)
        # (generate stops at the end-of-sequence token; eos=None above goes on)
        assert len(want) >= 4 and tokens[r, : len(want)].tolist() == want.tolist()
        np.testing.assert_allclose(
            hidden[r, 0].astype(np.float32), out.hidden_states[-1][0, -1].numpy(), atol=2e-2
        )


def test_rows_end_at_eos(setup):  # type: ignore[no-untyped-def]
    _, _, prompts, model = setup
    tokens, _, _ = greedy_continuations(model, prompts, N, eos=None)
    stop = int(tokens[1, 3])  # pretend row 1's fourth token ends it
    t2, _, valid = greedy_continuations(model, prompts, N, eos=stop)
    first = int(np.argmax(tokens[1] == stop))
    assert valid[1, : first + 1].all() and not valid[1, first + 1 :].any()
    for r in (0, 2):  # other rows go on unchanged (until they meet that token themselves)
        hit = np.flatnonzero(tokens[r] == stop)
        end = N if hit.size == 0 else int(hit[0]) + 1
        assert t2[r, :end].tolist() == tokens[r, :end].tolist() and valid[r, :end].all()


def test_bad_input(setup):  # type: ignore[no-untyped-def]
    _, _, prompts, model = setup
    with pytest.raises(DraftwiseError, match="non-empty prompts"):
        greedy_continuations(model, [prompts[0], []], 4, eos=None)
    with pytest.raises(DraftwiseError, match="gen_len must be at least 1, got 0"):
        greedy_continuations(model, prompts, 0, eos=None)


def test_prompt_states_in_the_continuation_layout(setup):  # type: ignore[no-untyped-def]
    """Right-aligned prompts; ``hidden[j]`` is the plain forward's state of the token
    before ``tokens[j]``; the first token is not valid; the last state is the
    continuation's first; a width shorter than a prompt keeps its end."""
    model_dir, _, prompts, model = setup
    w = max(len(p) for p in prompts) + 2
    tok, hid, valid, last = prompt_states(model, prompts, w, prefill_rows=2)
    _, cont, _ = greedy_continuations(model, prompts, 2, eos=None)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    for r, p in enumerate(prompts):
        n = len(p)
        assert tok[r, w - n :].tolist() == p and not tok[r, : w - n].any()
        assert valid[r].tolist() == [False] * (w - n + 1) + [True] * (n - 1)
        with torch.inference_mode():
            ref = hf(torch.tensor([p]), output_hidden_states=True).hidden_states[-1][0].numpy()
        np.testing.assert_allclose(hid[r, w - n + 1 :].astype(np.float32), ref[:-1], atol=2e-2)
        np.testing.assert_allclose(last[r].astype(np.float32), cont[r, 0].astype(np.float32),
                                   atol=2e-2)
    short, _, vshort, _ = prompt_states(model, prompts, 4)
    assert short[0].tolist() == prompts[0][-4:] and vshort[0].tolist() == [False] + [True] * 3
    with pytest.raises(DraftwiseError, match="non-empty prompts"):
        prompt_states(model, [[]], 4)


def test_sampled_continuations_follow_the_model_at_each_row_s_own_uniforms(setup):  # type: ignore[no-untyped-def]
    """``temperature`` > 0: each token is the CDF inverse (id order) of the returned
    state's softmax(logits / T) at the row's uniform; the same seed gives the same
    tokens, in any batch; another seed other ones; a tiny temperature is greedy."""
    _, _, prompts, model = setup
    t = 0.8
    tokens, hidden, valid = greedy_continuations(model, prompts, N, eos=None, temperature=t, seed=3)
    assert valid.all()
    again, _, _ = greedy_continuations(model, prompts, N, eos=None, temperature=t, seed=3)
    assert again.tolist() == tokens.tolist()
    first, _, _ = greedy_continuations(model, prompts[:1], N, eos=None, temperature=t, seed=3)
    assert first[0].tolist() == tokens[0].tolist()  # row 0's uniforms, whatever the batch
    other, _, _ = greedy_continuations(model, prompts, N, eos=None, temperature=t, seed=4)
    assert other.tolist() != tokens.tolist()
    greedy, _, _ = greedy_continuations(model, prompts, N, eos=None)
    cold, _, _ = greedy_continuations(model, prompts, N, eos=None, temperature=1e-4, seed=3)
    assert cold.tolist() == greedy.tolist()
    assert tokens.tolist() != greedy.tolist()  # sampling at 0.8 leaves the greedy path
    for r in range(len(prompts)):
        u = np.random.default_rng([3, r]).random(N)
        with torch.inference_mode():
            logits = model.logits(torch.from_numpy(hidden[r].astype(np.float32))).double()
        cdf = torch.softmax(logits / t, -1).cumsum(-1).numpy()  # (N, V)
        for j in range(N):  # the token's CDF interval holds the uniform (state rounded
            lo = cdf[j, tokens[r, j] - 1] if tokens[r, j] else 0.0  # to float16: a margin)
            assert lo - 2e-2 <= u[j] * cdf[j, -1] <= cdf[j, tokens[r, j]] + 2e-2


def test_a_negative_or_nan_temperature_is_refused(setup):  # type: ignore[no-untyped-def]
    _, _, prompts, model = setup
    for bad in (-0.5, float("nan")):
        with pytest.raises(DraftwiseError, match="temperature must be a finite number >= 0"):
            greedy_continuations(model, prompts, 4, eos=None, temperature=bad)


def test_sample_first_samples_a_start_then_continues_greedily(setup):  # type: ignore[no-untyped-def]
    """``sample_first`` = K: the first K tokens are those of sampling at the same seed,
    the rest the greedy continuation of the prompt with them appended."""
    _, _, prompts, model = setup
    k, t = 4, 0.8
    sampled, _, _ = greedy_continuations(model, prompts, N, eos=None, temperature=t, seed=3)
    mixed, _, valid = greedy_continuations(
        model, prompts, N, eos=None, temperature=t, seed=3, sample_first=k
    )
    assert valid.all() and mixed[:, :k].tolist() == sampled[:, :k].tolist()
    assert mixed.tolist() != sampled.tolist()  # (0.8 leaves the greedy path in 12 tokens)
    for r, p in enumerate(prompts):
        rest, _, _ = greedy_continuations(model, [p + mixed[r, :k].tolist()], N - k, eos=None)
        assert mixed[r, k:].tolist() == rest[0].tolist()
    with pytest.raises(DraftwiseError, match="sample_first must be >= 0, got -1"):
        greedy_continuations(model, prompts, 4, eos=None, temperature=t, sample_first=-1)
