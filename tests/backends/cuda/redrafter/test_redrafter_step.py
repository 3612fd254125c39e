"""The torch drafting step computes ``ReDrafterNet``'s log-probs (with ``h``'s halves of
the layers precomputed once per proposal), and its int8 weights stay close to them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from draftwise.backends.cuda import TorchBackend  # noqa: E402
from draftwise.backends.cuda.redrafter.checkpoint import weights_fingerprint  # noqa: E402
from draftwise.backends.cuda.redrafter.net import ReDrafterNet  # noqa: E402
from draftwise.backends.cuda.redrafter.step import (  # noqa: E402
    GROUP,
    StepLinear,
    TorchRecurrentStep,
    int8_supported,
    quantize_groups,
)
from draftwise.core.drafters.context_vocab import EXTRA_BIAS_QUANTILE  # noqa: E402
from draftwise.core.drafters.redrafter_ckpt import ReDrafterConfig  # noqa: E402
from tests.backends.cuda.test_torch_backend import V, _save_tiny  # noqa: E402

K = 80  # draft vocabulary: >= 64 rows, so the int8 step packs the head too
needs_int8 = pytest.mark.skipif(not int8_supported(), reason="no int8 matmul in this torch")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):  # type: ignore[no-untyped-def]
    model_dir, _ = _save_tiny(tmp_path_factory.mktemp("tiny"), "llama")
    return TorchBackend.from_pretrained(model_dir, device="cpu", invariant=False)


def _net(tb, context_dim: int, noise: float = 0.3) -> ReDrafterNet:  # type: ignore[no-untyped-def]
    embed = tb.model.embed
    torch.manual_seed(3)
    cfg = ReDrafterConfig(
        int(embed.shape[1]), V, K, 2, "tok", weights_fingerprint(embed), context_dim=context_dim
    )
    net = ReDrafterNet(cfg, embed.float(), torch.arange(K) + 10)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * noise)
    return net.eval()


def _two_steps(step: TorchRecurrentStep, tb: TorchBackend, ctx: np.ndarray) -> list[np.ndarray]:
    tb.reset()
    tb.prefill(ctx[:-1])
    assert step.start(ctx.size - 1, ctx)
    a = step.step(ctx[-1:], np.array([-1]))  # (1, K)
    b = step.step(np.array([12, 30, 44]), np.array([0, 0, 0]))  # (3, K)
    return [a, b]


@pytest.mark.parametrize("context_dim", [0, 64])
def test_dense_step_equals_the_network(tiny, context_dim):  # type: ignore[no-untyped-def]
    """Two beam steps of the float32 step give ``ReDrafterNet``'s own log-probs (cell,
    head, attention over the step's entries, copy mixture), and its entries are
    ``context_entries`` of the backend's hidden rows."""
    net = _net(tiny, context_dim)
    step = TorchRecurrentStep(net, tiny)
    ctx = np.random.default_rng(0).integers(0, V, 12)
    got = _two_steps(step, tiny, ctx)
    with torch.inference_mode():
        h = tiny.last_hidden().float()[None]  # (1, C)
        s0 = net.cell(torch.tensor(ctx[-1:]), net.zero_state(1))  # (1, C)
        s1 = net.cell(torch.tensor([12, 30, 44]), s0.expand(3, -1))  # (3, C)
        if not context_dim:
            want = [net.head(h.expand(s.shape[0], -1), s).log_softmax(-1) for s in (s0, s1)]
        else:
            first, g = tiny.hidden_rows(0)
            pos = torch.from_numpy(step._book.pos)  # entries: positions 1 .. cache_len - 1
            assert first == 0 and pos.tolist() == list(range(1, ctx.size - 1))
            x = torch.from_numpy(ctx)
            k, v, cols = net.context_entries(g[pos - 1], x[pos], x[pos + 1], g[pos])
            assert step._kvc is not None
            torch.testing.assert_close(step._kvc[0][: step._m], k, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(step._kvc[1][: step._m], v, rtol=1e-5, atol=1e-5)
            want = [
                net.context_logp(
                    h.expand(s.shape[0], -1)[None], s[None], t[None], k[None], v[None],
                    cols[None], None,
                )[0]
                for s, t in ((s0, torch.tensor(ctx[-1:])), (s1, torch.tensor([12, 30, 44])))
            ]
    for g_, w_ in zip(got, want, strict=True):
        np.testing.assert_allclose(g_, w_.numpy(), atol=1e-4)


@pytest.mark.parametrize("context_dim", [0, 64])
def test_extended_step_equals_a_network_with_the_extra_ids(tiny, context_dim):  # type: ignore[no-untyped-def]
    """``extend``: each proposal's draft vocabulary is the fixed ids, then the context's
    other ids in order of first appearance; the step's log-probs over them equal those
    of a ``ReDrafterNet`` whose vocabulary holds those ids with the one extra bias (the
    same head on the target's embedding rows, copy columns for every context token)."""
    net = _net(tiny, context_dim)
    step = TorchRecurrentStep(net, tiny, extend=True)
    ctx = np.array([3, 40, 95, 3, 11, 96, 50, 95, 40, 2, 96, 7])  # 3, 95, 96, 2, 7: not in 10..89
    got = _two_steps(step, tiny, ctx)
    extra = [3, 95, 96, 2, 7]
    assert step.vocab_ids.tolist() == list(range(10, 10 + K)) + extra
    assert got[0].shape == (1, K + len(extra))
    b0 = float(np.quantile(net.bias.detach().numpy().astype(np.float64), EXTRA_BIAS_QUANTILE))
    ids = torch.tensor(step.vocab_ids)
    ref = ReDrafterNet(
        dataclasses.replace(net.cfg, draft_vocab=ids.numel()), net.embed, ids
    ).eval()
    state = {k: v for k, v in net.state_dict().items() if k not in ("bias", "vocab_ids")}
    ref.load_state_dict(state, strict=False)
    with torch.no_grad():
        ref.bias.copy_(torch.cat([net.bias, torch.full((len(extra),), b0)]))
    ref_step = TorchRecurrentStep(ref, tiny)  # the fixed vocabulary = the extended one
    want = _two_steps(ref_step, tiny, ctx)
    for g_, w_ in zip(got, want, strict=True):
        np.testing.assert_allclose(g_, w_, atol=1e-4)
    if context_dim:  # copy mass reaches the extra ids (here more than their head share)
        assert np.exp(got[0][0, K:]).sum() > 0
    # a new prompt: the extra columns follow its context
    tiny.reset()
    tiny.prefill(np.array([10, 11, 12]))
    assert step.start(3, np.array([10, 11, 12, 4]))
    assert step.vocab_ids.tolist() == list(range(10, 10 + K)) + [4]


@needs_int8
@pytest.mark.parametrize("context_dim", [0, 64])
def test_int8_step_is_close_to_float32(tiny, context_dim, monkeypatch):  # type: ignore[no-untyped-def]
    """int8 weights on bfloat16 activations: the same draft distributions up to a small
    error (drafts may differ only at near-ties). Every layer int8 (``FOUR_BIT`` empty):
    the shipped network's 4-bit layers are checked on it
    (``test_redrafter_native.py::test_shipped_network_native_drafts_equal_the_torch_step``)."""
    monkeypatch.setattr("draftwise.backends.cuda.redrafter.step.FOUR_BIT", ())
    net = _net(tiny, context_dim, noise=0.2)  # top draft probabilities 0.4-0.8
    ctx = np.random.default_rng(1).integers(0, V, 12)
    dense = _two_steps(TorchRecurrentStep(net, tiny), tiny, ctx)
    step8 = TorchRecurrentStep(net, tiny, int8=True)
    assert step8.layers.head.scale is not None  # the head is int8
    q = _two_steps(step8, tiny, ctx)
    for a, b in zip(dense, q, strict=True):
        assert np.exp(a).max() > 0.3  # not a flat distribution
        assert np.abs(np.exp(a) - np.exp(b)).max() < 0.05  # measured <= 0.026
        assert np.abs(np.exp(a) - np.exp(b)).sum(-1).max() < 0.12  # 2 x total variation, <= 0.057


@needs_int8
def test_step_linear_int8_error_and_small_layers():  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    w, b = torch.randn(256, 96), torch.randn(256)
    x = torch.randn(4, 96)
    want = torch.nn.functional.linear(x, w, b)
    lin = StepLinear(w, b, torch.bfloat16, int8=True)
    assert lin.w.dtype == torch.int8
    got = lin(x.bfloat16()).float()
    assert float((got - want).norm() / want.norm()) < 0.02
    small = StepLinear(torch.randn(1, 96), None, torch.bfloat16, int8=True)  # the gate
    assert small.scale is None and small.w.dtype == torch.bfloat16


def test_quantize_groups_rounds_each_32_inputs_to_their_own_scale():  # type: ignore[no-untyped-def]
    """4-bit codes with a bfloat16 scale per 32 inputs (the compiled step's ``GROUPED``
    layers): codes in -7..7, each group's largest weight at +-7 (up to its scale's
    bfloat16 rounding), every weight within half a step of codes x scale; a group of
    tiny weights keeps its own precision (a scale per row would round it to 0); a width
    that is no multiple of 32 is refused."""
    torch.manual_seed(1)
    w = torch.randn(64, 128)
    w[:, 32:64] *= 1e-3  # one group of small weights in each row
    codes, gs = quantize_groups(w)
    assert codes.dtype == torch.int8 and codes.shape == (64, 128)
    assert gs.dtype == torch.bfloat16 and gs.shape == (64, 128 // GROUP)
    assert int(codes.abs().max()) == 7
    step = gs.float().repeat_interleave(GROUP, dim=1)  # (64, 128)
    approx = codes.float() * step
    # half a step, and a clamped code's weight up to 7 x the scale's bfloat16 rounding more
    assert float(((approx - w).abs() / step).max()) <= 0.5 + 7 * 2.0**-8
    small = w[:, 32:64]
    assert float((approx[:, 32:64] - small).norm() / small.norm()) < 0.1
    assert float(codes[:, 32:64].abs().float().mean()) > 2  # not rounded away
    with pytest.raises(ValueError, match="K % 32 == 0, got K = 100"):
        quantize_groups(torch.randn(4, 100))


def test_step_linear_grouped_is_the_grouped_rounding_in_float32():  # type: ignore[no-untyped-def]
    torch.manual_seed(2)
    w, b = torch.randn(128, 192), torch.randn(128)
    x = torch.randn(3, 192).bfloat16()
    lin = StepLinear(w, b, torch.bfloat16, int8=True, grouped=True)
    codes, gs = quantize_groups(w)
    ref = codes.float() * gs.float().repeat_interleave(GROUP, dim=1)  # (128, 192)
    assert lin.f32 and torch.equal(lin.w, ref)
    got = lin(x)
    assert got.dtype == torch.bfloat16
    want = torch.nn.functional.linear(x.float(), ref, b.bfloat16().float())
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)
    # a width the grouped products cannot take (K % 64 != 0) stays int8 rows
    narrow = StepLinear(torch.randn(128, 96), None, torch.bfloat16, int8=True, grouped=True)
    assert narrow.scale is not None and not narrow.f32
