"""ReDrafter on the real default model is lossless: greedy output equals plain decoding
token for token, and a seeded T=0.8 sample is the same, with a random network (every
code path, most drafts rejected) and with the shipped trained one (drafts accepted)."""

from __future__ import annotations

import pytest

from tests.prompts import OWN_PROMPTS

pytestmark = [pytest.mark.slow, pytest.mark.torch]
torch = pytest.importorskip("torch")

from draftwise.backends.cuda.redrafter.checkpoint import save_redrafter, weights_fingerprint  # noqa: E402
from draftwise.backends.cuda.redrafter.net import ReDrafterNet  # noqa: E402
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


def _random_ckpt(torch_model, out, context_dim: int):  # type: ignore[no-untyped-def]
    embed = torch_model.backend.model.embed
    torch.manual_seed(0)
    cfg = ReDrafterConfig(
        int(embed.shape[1]),
        int(embed.shape[0]),
        2048,
        1,
        torch_model.drafting.tokenizer_id,
        weights_fingerprint(embed),
        context_dim=context_dim,
    )
    net = ReDrafterNet(cfg, embed.float(), torch.arange(2048))
    return save_redrafter(net, out)


@pytest.fixture(scope="module")
def random_ckpt(torch_model, tmp_path_factory):  # type: ignore[no-untyped-def]
    return _random_ckpt(torch_model, tmp_path_factory.mktemp("redrafter"), 0)


@pytest.fixture(scope="module")
def random_context_ckpt(torch_model, tmp_path_factory):  # type: ignore[no-untyped-def]
    """A network that also attends over (and copies from) the context."""
    return _random_ckpt(torch_model, tmp_path_factory.mktemp("redrafter-ctx"), 64)


@pytest.mark.parametrize("ckpt", ["random_ckpt", "random_context_ckpt"])
@pytest.mark.parametrize("prompt", OWN_PROMPTS[:2])
def test_random_redrafter_identical_to_plain(torch_model, ckpt, prompt, request):  # type: ignore[no-untyped-def]
    path = request.getfixturevalue(ckpt)
    plain = tokens_of(torch_model, prompt, "none")
    hot = tokens_of(torch_model, prompt, "none", temp=0.8, seed=5)
    d = torch_model.drafter(f"redrafter:bw=3,t=4,path={path}")
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


@pytest.mark.skipif(not (SHIPPED / "config.json").is_file(), reason="no shipped checkpoint")
def test_shipped_redrafter_drafts_with_int8_weights_on_cpu(torch_model):  # type: ignore[no-untyped-def]
    """On any CPU with torch's int8 matmul (not only one with bf16 dot products) the
    drafting step runs int8 weights on bfloat16 activations: on an AVX2-only CPU that cut
    drafting from 11.3 to 6.9 ms a step at bw=1, t=3 (float32 target)."""
    from draftwise.backends.cuda.redrafter.step import int8_supported

    if not int8_supported():
        pytest.skip("no int8 matmul in this torch")
    from draftwise.backends.cuda.redrafter.native import NativeRecurrentStep

    step = torch_model.drafter("redrafter").net
    assert step.dtype == torch.bfloat16
    if isinstance(step, NativeRecurrentStep):  # the compiled step: int8 codes of its own
        assert sum(t.dtype == torch.int8 for t in step._keep if isinstance(t, torch.Tensor)) >= 5
        with pytest.raises(RuntimeError, match="without torch layers"):
            step.layers  # noqa: B018  (none built: they would be 5 MB unused)
    else:
        assert step.layers.head.scale is not None  # the head's weights are int8


def test_redrafter_bf16_invariant_identical(  # type: ignore[no-untyped-def]
    default_model_dir, random_ckpt, random_context_ckpt
):
    """bfloat16 in batch-invariant mode: the float32-made checkpoint loads (one
    fingerprint for any dtype) and greedy output equals plain decoding."""
    import draftwise

    model = draftwise.load(default_model_dir, backend="torch", dtype="bfloat16")
    assert model.backend.invariant
    prompt = OWN_PROMPTS[0]
    plain = tokens_of(model, prompt, "none")
    for path in (random_ckpt, random_context_ckpt):
        assert tokens_of(model, prompt, f"redrafter:bw=3,t=4,path={path}") == plain


@pytest.mark.skipif(not (SHIPPED / "config.json").is_file(), reason="no shipped checkpoint")
def test_auto_takes_the_shipped_redrafter_as_a_member(torch_model):  # type: ignore[no-untyped-def]
    """``auto`` drafts with the shipped ReDrafter too (its nodes carry the network's own
    probabilities, calibrated online) and stays lossless; by default it takes it only
    where this device's plain step is slow enough for its drafting to pay."""
    from draftwise.core.costmodel import CostModel
    from draftwise.drafting.redrafter import (
        MEMBER_STEP_RATIO,
        NATIVE_DRAFT_MS,
        TORCH_DRAFT_MS,
        member_pays,
    )

    d = torch_model.drafter("auto:redrafter=on")
    assert d.members[-1].name == "redrafter"
    # priced as the compiled CPU step's drafting where that is what it runs
    draft_ms = NATIVE_DRAFT_MS if getattr(d.members[-1].net, "compiled", False) else TORCH_DRAFT_MS
    default = torch_model.drafter("auto")
    names = [m.name for m in default.members]
    assert ("redrafter" in names) == member_pays(default.greedy_cost, draft_ms)
    edge = MEMBER_STEP_RATIO * draft_ms  # the plain step it needs
    slow, fast = CostModel([1, 16], [30.0, 40.0]), CostModel([1, 16], [0.5 * edge, 5.0])
    assert torch_model.drafter("auto", cost=slow).members[-1].name == "redrafter"
    assert "redrafter" not in [m.name for m in torch_model.drafter("auto", cost=fast).members]
    off = torch_model.drafter("auto:redrafter=off", cost=slow)
    assert "redrafter" not in [m.name for m in off.members]
    prompt = OWN_PROMPTS[1]
    assert tokens_of(torch_model, prompt, d) == tokens_of(torch_model, prompt, "none")
    assert d.members[-1].stats()["proposals"] > 0


def _as_rounded(step, net):  # type: ignore[no-untyped-def]
    """``net`` with the key and value layers as the compiled step rounds them, where it
    holds them in 4-bit values with a scale per 32 inputs (``step.GROUPED``): a copy."""
    import copy

    from draftwise.backends.cuda.redrafter.step import GROUP, quantize_groups

    lin = getattr(step, "_lin", {})
    if "wk" not in lin or not lin["wk"].gs:
        return net
    net = copy.deepcopy(net)
    with torch.no_grad():
        for layer in (net.wk, net.wv):
            codes, gs = quantize_groups(layer.weight)  # (n, k), (n, k / GROUP)
            n, k = codes.shape
            w = codes.float().reshape(n, k // GROUP, GROUP) * gs.float()[..., None]
            layer.weight.copy_(w.reshape(n, k))
    return net


def test_context_entries_after_generation_equal_a_fresh_prefill(torch_model, random_context_ckpt):  # type: ignore[no-untyped-def]
    """The context network's entries, built step by step from the rows each commit kept
    (branches, rejections), equal the entries computed from one plain prefill of the
    whole text: its hidden-state input is the target's, position by position."""
    import numpy as np

    prompt = OWN_PROMPTS[2]
    d = torch_model.drafter(f"redrafter:bw=3,t=4,path={random_context_ckpt}")
    out = tokens_of(torch_model, prompt, d)
    step = d.net
    seq = np.array(torch_model.encode_prompt(prompt) + list(out), np.int64)
    be = torch_model.backend
    be.reset()
    be.prefill(seq[:-1])
    first, g = be.hidden_rows(0)
    assert first == 0 and g.shape[0] == seq.size - 1
    pos = torch.from_numpy(step._book.pos)  # the entries held at the last proposal
    assert pos.numel() == step._m > len(out) // 2
    net = _as_rounded(step, step.net)
    with torch.inference_mode():
        x = torch.from_numpy(seq)
        k, v, cols = net.context_entries(
            g[pos - 1].to(net.embed.dtype), x[pos], x[pos + 1], g[pos].to(net.embed.dtype)
        )
    keys, values = (b[: step._m] for b in step._kvc)
    # every entry's copy column is its next token's: a fixed column where it has one,
    # else an extra column of the context vocabulary (``extend``, the default)
    fixed = cols >= 0
    held = torch.as_tensor(np.array(step._cols))  # (m,): numpy in the compiled step
    assert held[fixed].tolist() == cols[fixed].tolist()
    assert step.vocab_ids[held.numpy()].tolist() == seq[pos.numpy() + 1].tolist()
    assert not fixed.all()  # the extra columns were exercised
    torch.testing.assert_close(keys.float(), k.float(), rtol=0.05, atol=0.05)
    torch.testing.assert_close(values.float(), v.float(), rtol=0.05, atol=0.05)


# a prompt whose answer copies words outside the shipped draft vocabulary
COPY_PROMPT = (
    "Repeat this sentence exactly, then translate it into French: 'Quokkas near Fremantle "
    "were photographed by Ngozi Okonkwo with a Hasselblad.'"
)


def _with_and_without_extension(model, prompt, max_tokens):  # type: ignore[no-untyped-def]
    """Greedy tokens of plain decoding and, per ``extend``, of the shipped drafter
    (bw=4, t=5): its MAT and the size of its last proposal's draft vocabulary. The
    drafters exist before the first prefill (so the backend keeps every position's
    hidden row for their context entries) and every generation prefills its whole
    prompt, as the bench does."""
    import draftwise

    drafters = {e: model.drafter(f"redrafter:bw=4,t=5,extend={str(e).lower()}") for e in (1, 0)}

    def run(d):  # type: ignore[no-untyped-def]
        model.backend.reset()
        return list(draftwise.stream_generate(model, prompt, drafter=d, max_tokens=max_tokens))[-1]

    plain = run("none").token_ids
    out = {}
    for extend, d in drafters.items():
        d.reset()
        last = run(d)
        assert last.token_ids == plain, f"extend={extend}"
        out[bool(extend)] = (last.mean_accepted, d.net.vocab_ids.size, d.net._vocab.base.size)
    return out


@pytest.mark.skipif(not (SHIPPED / "config.json").is_file(), reason="no shipped checkpoint")
def test_shipped_redrafter_with_the_context_vocabulary_identical(torch_model):  # type: ignore[no-untyped-def]
    """The context's ids outside the draft vocabulary join it (the default): identical
    output, and the drafter's vocabulary did grow; without ``extend`` it stays fixed."""
    got = _with_and_without_extension(torch_model, COPY_PROMPT, MAX_TOKENS)
    _, size, base = got[True]
    assert size > base
    assert got[False][1] == got[False][2]


@pytest.mark.skipif(not (SHIPPED / "config.json").is_file(), reason="no shipped checkpoint")
def test_shipped_redrafter_context_vocabulary_on_specbench(torch_model):  # type: ignore[no-untyped-def]
    """Spec-Bench translation, rag and extraction (a third, a quarter and a sixth of their
    greedy tokens lie outside the fixed draft vocabulary): identical output with and
    without the extension, and with it more tokens accepted a step over the three
    (bench/results/specbench-context-vocab: MAT 2.10 -> 3.08, 2.22 -> 2.83 and 2.71 ->
    3.23 over these categories' bench turns)."""
    from tests.prompts import bench_prompts, one_per_category

    rows = one_per_category(bench_prompts(), ["translation", "rag", "extraction"])
    mats = {r["category"]: _with_and_without_extension(torch_model, r["turns"][0], 64)
            for r in rows}
    print("(MAT, vocabulary, fixed) with / without the extension:", mats)
    assert sum(m[True][0] for m in mats.values()) > sum(m[False][0] for m in mats.values())


def test_a_context_drafter_built_after_a_plain_generation_sees_the_prompt(  # type: ignore[no-untyped-def]
    default_model_dir, random_context_ckpt
):
    """Plain decoding of a prompt first (its positions cached without hidden rows), then
    a context drafter on the same prompt: identical output, and its entries start at
    position 1, the prompt's included (``CacheBook.keep_hidden_rows`` empties such a
    cache). A model of its own: the session's has kept rows since its first drafter."""
    import draftwise

    model = draftwise.load(default_model_dir, backend="torch", dtype="float32")
    prompt = OWN_PROMPTS[1]
    plain = tokens_of(model, prompt, "none")
    d = model.drafter(f"redrafter:bw=3,t=4,path={random_context_ckpt}")
    assert tokens_of(model, prompt, d) == plain
    n_prompt = len(model.encode_prompt(prompt))
    assert d.net._book.pos[0] == 1 and d.net._m > n_prompt
