"""``draftwise.mlx_lm`` on the torch backend with the real default model.

- mlx-lm's README examples run with only the import line changed (see readme_examples);
- the compatibility layer writes exactly draftwise's own API output (greedy, and seeded
  sampling at temperature 0.8, also against ``drafter="none"``);
- prompts read as mlx-lm reads them (string, token ids, pre-templated string);
- one response per token with mlx-lm's fields; bad input is a one-line DraftwiseError.
"""

from __future__ import annotations

import numpy as np
import pytest

import draftwise
from draftwise.errors import DraftwiseError
from draftwise.mlx_lm import TokenizerWrapper, generate, stream_generate
from draftwise.mlx_lm.sample_utils import make_logits_processors, make_sampler
from tests.mlx_lm.readme_examples import check_examples

pytestmark = [pytest.mark.slow, pytest.mark.torch]
pytest.importorskip("torch")

N = 24
MESSAGES = [{"role": "user", "content": "List three colours of the rainbow."}]


@pytest.fixture(scope="module")
def tokenizer(torch_model):  # type: ignore[no-untyped-def]
    return TokenizerWrapper(torch_model.tokenizer)


@pytest.fixture(scope="module")
def chat_ids(tokenizer):  # type: ignore[no-untyped-def]
    return tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)


def test_readme_examples(default_model_dir, capsys):  # type: ignore[no-untyped-def]
    check_examples(default_model_dir, "torch", "float32", 16, capsys)


@pytest.mark.parametrize("drafter", ["auto", "cacheback", "none"])
def test_greedy_equals_own_api(torch_model, tokenizer, chat_ids, drafter):  # type: ignore[no-untyped-def]
    responses = list(
        stream_generate(torch_model, tokenizer, chat_ids, max_tokens=N, drafter=drafter)
    )
    own = list(draftwise.stream_generate(torch_model, chat_ids, max_tokens=N, drafter="none"))
    assert [r.token for r in responses] == own[-1].token_ids
    assert "".join(r.text for r in responses) == "".join(r.text for r in own)


@pytest.mark.parametrize(
    "sampling, own",
    [
        (dict(sampler=make_sampler(temp=0.8)), dict(temp=0.8)),
        (
            dict(
                sampler=make_sampler(0.8, top_p=0.9, top_k=50),
                logits_processors=make_logits_processors(repetition_penalty=1.2),
            ),
            dict(temp=0.8, top_p=0.9, top_k=50, repetition_penalty=1.2, repetition_context=20),
        ),
    ],
)
def test_seeded_sampling_equals_own_api(torch_model, tokenizer, chat_ids, sampling, own):  # type: ignore[no-untyped-def]
    ours = generate(torch_model, tokenizer, chat_ids, max_tokens=N, seed=11, **sampling)
    for drafter in ("auto", "none"):
        assert ours == draftwise.generate(
            torch_model, chat_ids, max_tokens=N, seed=11, drafter=drafter, **own
        )
    # temperature= is the main API's other name for temp=
    assert ours == draftwise.generate(
        torch_model,
        chat_ids,
        max_tokens=N,
        seed=11,
        **{**own, "temperature": own["temp"], "temp": 0.0},
    )


def test_prompt_forms_read_as_mlx_lm(torch_model, tokenizer, chat_ids):  # type: ignore[no-untyped-def]
    templated = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert isinstance(templated, str) and templated.startswith(tokenizer.bos_token)
    as_ids = generate(torch_model, tokenizer, chat_ids, max_tokens=12)
    # a pre-templated string starts with BOS, so no special tokens are added again
    assert generate(torch_model, tokenizer, templated, max_tokens=12) == as_ids
    assert generate(torch_model, tokenizer, np.array(chat_ids), max_tokens=12) == as_ids
    # the chat template is the caller's job, as in mlx-lm: a plain string goes in raw
    raw = "The capital of France is"
    assert generate(torch_model, tokenizer, raw, max_tokens=8) == draftwise.generate(
        torch_model, raw, max_tokens=8, chat_template=False
    )


def test_responses_have_mlx_lm_fields(torch_model, tokenizer, chat_ids):  # type: ignore[no-untyped-def]
    rs = list(stream_generate(torch_model, tokenizer, chat_ids, max_tokens=N, drafter="cacheback"))
    assert [r.generation_tokens for r in rs] == list(range(1, len(rs) + 1))
    assert [r.finish_reason for r in rs[:-1]] == [None] * (len(rs) - 1)
    last = rs[-1]
    if last.finish_reason == "stop":  # mlx-lm: the EOS token comes last, with no text
        assert last.token in tokenizer.eos_token_ids and last.text == ""
    else:
        assert last.finish_reason == "length" and len(rs) == N
    for r in rs:
        assert isinstance(r.from_draft, bool) and r.logprobs is None
        assert r.prompt_tokens == len(chat_ids) and r.prompt_tps > 0 and r.generation_tps > 0
        assert r.peak_memory > 0


def test_stopping_early_keeps_the_model_consistent(torch_model, tokenizer, chat_ids):  # type: ignore[no-untyped-def]
    full = generate(torch_model, tokenizer, chat_ids, max_tokens=12)
    for r in stream_generate(torch_model, tokenizer, chat_ids, max_tokens=12):
        if r.generation_tokens == 3:
            break
    assert generate(torch_model, tokenizer, chat_ids, max_tokens=12) == full


def test_extra_eos_token(torch_model, default_model_dir):  # type: ignore[no-untyped-def]
    tok = TokenizerWrapper(torch_model.tokenizer)
    ids = tok.encode("1, 2, 3, 4, 5, 6,")
    text = generate(torch_model, tok, ids, max_tokens=N)
    first = torch_model.tokenizer.encode(text)[0]
    tok.add_eos_token(first)
    rs = list(stream_generate(torch_model, tok, ids, max_tokens=N))
    assert len(rs) == 1 and rs[0].token == first and rs[0].finish_reason == "stop"


def test_tokenizer_wrapper(tokenizer):  # type: ignore[no-untyped-def]
    assert tokenizer.eos_token_id == 2 and tokenizer.eos_token_ids == {2}
    assert tokenizer.decode(tokenizer.encode("Hello world")) == "Hello world"
    assert tokenizer.decode(tokenizer.eos_token_id) == "<|im_end|>"
    assert tokenizer.has_chat_template and len(tokenizer) == tokenizer.vocab_size
    ids = tokenizer.apply_chat_template(MESSAGES)  # transformers' default: token ids
    assert ids == tokenizer.encode(
        tokenizer.apply_chat_template(MESSAGES, tokenize=False), add_special_tokens=False
    )


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(sampler=lambda logprobs: logprobs.argmax()), "cannot reproduce an arbitrary sampler"),
        (dict(temp=0.7), "unknown keyword 'temp': use sampler=make_sampler(temp=...)"),
        (dict(temperature=0.7), "use sampler=make_sampler(temp=...)"),
        (dict(max_kv_size=512), "max_kv_size=512: a rotating KV cache is not supported"),
        (
            dict(draft_model="/models/draft"),
            "model not found: '/models/draft'",
        ),
        (dict(max_tokens=-1), "max_tokens must be >= 1, got -1"),
        (dict(drafter="bogus"), "unknown drafter 'bogus'"),
        (dict(frobnicate=1), "unknown keyword 'frobnicate'"),
    ],
)
def test_bad_options_one_line_error(torch_model, tokenizer, chat_ids, kwargs, needle):  # type: ignore[no-untyped-def]
    with pytest.raises(DraftwiseError) as exc:
        generate(torch_model, tokenizer, chat_ids, **kwargs)
    assert needle in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


@pytest.mark.parametrize(
    "prompt, needle",
    [
        ("   ", "the prompt is empty"),
        ([], "non-empty list of token ids"),
        (MESSAGES, "render them first with tokenizer.apply_chat_template"),
        ([1, 10**9], "token id 1000000000 is outside the vocabulary"),
        (["a", "b"], "string or a non-empty list of token ids"),
    ],
)
def test_bad_prompts(torch_model, tokenizer, prompt, needle):  # type: ignore[no-untyped-def]
    with pytest.raises(DraftwiseError) as exc:
        generate(torch_model, tokenizer, prompt, max_tokens=4)
    assert needle in str(exc.value)


def test_wrong_objects(torch_model, tokenizer, chat_ids):  # type: ignore[no-untyped-def]
    with pytest.raises(DraftwiseError, match="model must come from draftwise.mlx_lm.load"):
        generate(object(), tokenizer, chat_ids)
    with pytest.raises(DraftwiseError, match="tokenizer must come from draftwise.mlx_lm.load"):
        generate(torch_model, object(), chat_ids)


def test_main_api_keywords(torch_model):  # type: ignore[no-untyped-def]
    with pytest.raises(DraftwiseError, match="unknown keyword 'max_new_tokens': use max_tokens="):
        draftwise.generate(torch_model, "Hi", max_new_tokens=4)
    with pytest.raises(DraftwiseError, match="did you mean top_p="):
        draftwise.generate(torch_model, "Hi", topp=0.5)
    with pytest.raises(DraftwiseError, match="give the temperature once"):
        draftwise.generate(torch_model, "Hi", temp=0.5, temperature=0.7)
    assert draftwise.generate(
        torch_model, "Hi", temperature=0.0, max_tokens=4
    ) == draftwise.generate(torch_model, "Hi", max_tokens=4)


def test_draft_model_drafts_a_chain(torch_model, tokenizer, chat_ids, default_model_dir):  # type: ignore[no-untyped-def]
    """mlx-lm's ``draft_model=`` (a path or a loaded model) and ``num_draft_tokens=``:
    the draft drafts a greedy chain; the text equals plain decoding."""
    plain = generate(torch_model, tokenizer, chat_ids, max_tokens=12, drafter="none")
    responses = list(stream_generate(torch_model, tokenizer, chat_ids, max_tokens=12,
                                     draft_model=str(default_model_dir), num_draft_tokens=3))
    assert "".join(r.text for r in responses) == plain
    assert any(r.from_draft for r in responses)  # the model drafting for itself is right
    loaded = generate(torch_model, tokenizer, chat_ids, max_tokens=12, draft_model=torch_model)
    assert loaded == plain
    with pytest.raises(DraftwiseError, match="draft_model must be a path or a model from load"):
        generate(torch_model, tokenizer, chat_ids, draft_model=3.5)
