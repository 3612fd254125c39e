"""ReDrafter on the real default model is lossless: greedy output equals plain decoding
token for token, and a seeded T=0.8 sample is the same, with a random network (every
code path, most drafts rejected) and with the shipped trained one (drafts accepted)."""

from __future__ import annotations

import pytest

from tests.prompts import OWN_PROMPTS

pytestmark = [pytest.mark.slow, pytest.mark.torch]
torch = pytest.importorskip("torch")

from draftwise.backends.cuda.redrafter import ReDrafterNet  # noqa: E402
from draftwise.backends.cuda.redrafter_io import save_redrafter, weights_fingerprint  # noqa: E402
from draftwise.core.drafters.redrafter_ckpt import ReDrafterConfig  # noqa: E402
from draftwise.drafting.redrafter import SHIPPED  # noqa: E402
from draftwise.errors import DraftwiseError  # noqa: E402

MAX_TOKENS = 40


def tokens_of(model, prompt, drafter, **kw):  # type: ignore[no-untyped-def]
    import draftwise

    last = None
    for r in draftwise.stream_generate(model, prompt, drafter=drafter, max_tokens=MAX_TOKENS, **kw):
        last = r
    return last.token_ids


@pytest.fixture(scope="module")
def random_ckpt(torch_model, tmp_path_factory):  # type: ignore[no-untyped-def]
    embed = torch_model.backend.model.embed
    torch.manual_seed(0)
    cfg = ReDrafterConfig(
        int(embed.shape[1]),
        int(embed.shape[0]),
        2048,
        1,
        torch_model.drafting.tokenizer_id,
        weights_fingerprint(embed),
    )
    net = ReDrafterNet(cfg, embed.float(), torch.arange(2048))
    return save_redrafter(net, tmp_path_factory.mktemp("redrafter"))


@pytest.mark.parametrize("prompt", OWN_PROMPTS[:2])
def test_random_redrafter_identical_to_plain(torch_model, random_ckpt, prompt):  # type: ignore[no-untyped-def]
    plain = tokens_of(torch_model, prompt, "none")
    hot = tokens_of(torch_model, prompt, "none", temp=0.8, seed=5)
    d = torch_model.drafter(f"redrafter:bw=3,t=4,path={random_ckpt}")
    assert tokens_of(torch_model, prompt, d) == plain
    assert tokens_of(torch_model, prompt, d, temp=0.8, seed=5) == hot
    assert d.unpacked > 0 and 0 < d.packed <= d.unpacked


def test_refuses_a_checkpoint_for_other_weights(torch_model, tmp_path):  # type: ignore[no-untyped-def]
    embed = torch_model.backend.model.embed
    cfg = ReDrafterConfig(
        int(embed.shape[1]), int(embed.shape[0]), 16, 1, torch_model.drafting.tokenizer_id, "0" * 32
    )
    save_redrafter(ReDrafterNet(cfg, embed.float(), torch.arange(16)), tmp_path)
    with pytest.raises(DraftwiseError, match=f"{tmp_path}.*other model weights"):
        torch_model.drafter(f"redrafter:path={tmp_path}")


@pytest.mark.skipif(not (SHIPPED / "config.json").is_file(), reason="no shipped checkpoint")
@pytest.mark.parametrize("prompt", OWN_PROMPTS)
def test_shipped_redrafter_identical_and_accepting(torch_model, prompt):  # type: ignore[no-untyped-def]
    import draftwise

    plain = tokens_of(torch_model, prompt, "none")
    d = torch_model.drafter("redrafter")
    steps = list(draftwise.stream_generate(torch_model, prompt, drafter=d, max_tokens=MAX_TOKENS))
    assert steps[-1].token_ids == plain
    assert steps[-1].mean_accepted > 1.1, steps[-1].mean_accepted  # the drafts are used
    assert tokens_of(torch_model, prompt, d, temp=0.8, seed=5) == tokens_of(
        torch_model, prompt, "none", temp=0.8, seed=5
    )


def test_redrafter_bf16_invariant_identical(default_model_dir, random_ckpt):  # type: ignore[no-untyped-def]
    """bfloat16 in batch-invariant mode: the float32-made checkpoint loads (one
    fingerprint for any dtype) and greedy output equals plain decoding."""
    import draftwise

    model = draftwise.load(default_model_dir, backend="torch", dtype="bfloat16")
    assert model.backend.invariant
    prompt = OWN_PROMPTS[0]
    spec = f"redrafter:bw=3,t=4,path={random_ckpt}"
    assert tokens_of(model, prompt, spec) == tokens_of(model, prompt, "none")


@pytest.mark.skipif(not (SHIPPED / "config.json").is_file(), reason="no shipped checkpoint")
def test_auto_takes_the_shipped_redrafter_as_a_member(torch_model):  # type: ignore[no-untyped-def]
    """``auto`` drafts with the shipped ReDrafter too (its nodes carry the network's own
    probabilities, calibrated online) and stays lossless; by default it is left out."""
    d = torch_model.drafter("auto:redrafter=on")
    assert d.members[-1].name == "redrafter"
    assert "redrafter" not in [m.name for m in torch_model.drafter("auto").members]
    prompt = OWN_PROMPTS[1]
    assert tokens_of(torch_model, prompt, d) == tokens_of(torch_model, prompt, "none")
    assert d.members[-1].stats()["proposals"] > 0
