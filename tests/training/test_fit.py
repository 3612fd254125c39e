"""training/fit.py's distillation term (``soft_term``): its value, that it moves a
drafter's distribution toward the target's, and the refusals."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from draftwise.backends.cuda.redrafter.checkpoint import weights_fingerprint  # noqa: E402
from draftwise.backends.cuda.redrafter.net import ReDrafterNet  # noqa: E402
from draftwise.core.drafters.redrafter_ckpt import ReDrafterConfig  # noqa: E402
from draftwise.errors import DraftwiseError  # noqa: E402
from draftwise.training.fit import (  # noqa: E402
    IGNORE,
    Soft,
    TrainSettings,
    _context_batch,
    chain_acceptance,
    context_unroll,
    soft_term,
    train,
)
from draftwise.training.recipe import TrainRecipe  # noqa: E402

V, C, K = 40, 16, 24


def _net(context_dim: int, seed: int = 0) -> ReDrafterNet:
    torch.manual_seed(seed)
    embed = torch.randn(V, C)
    cfg = ReDrafterConfig(
        C, V, K, 1, "tok-a", weights_fingerprint(embed), context_dim=context_dim, context_heads=2
    )
    return ReDrafterNet(cfg, embed, torch.arange(K) + 3)


def _data(n: int, length: int, head: torch.Tensor) -> tuple[np.ndarray, ...]:
    """Rows laid out as the distillation shards are (hidden[j] predicted tokens[j]) from
    a toy target whose next-token distribution ``softmax(hidden @ head.T)`` depends on the
    last token alone (hidden[j + 1] = M[tokens[j]]), each token sampled from it: a
    drafter can learn the whole distribution from its input token, not just its argmax."""
    rng = np.random.default_rng(3)
    m = rng.normal(size=(V, C)).astype(np.float16)  # the state after each token id
    hidden = rng.normal(size=(n, length, C)).astype(np.float16)
    tokens = np.zeros((n, length), np.int32)
    for j in range(length):
        if j:
            hidden[:, j] = m[tokens[:, j - 1]]
        p = torch.softmax(torch.from_numpy(hidden[:, j]).float() @ head.T, -1).numpy()  # (n, K)
        u = rng.random((n, 1))
        tokens[:, j] = 3 + np.minimum((p.cumsum(1) < u).sum(1), K - 1)
    return tokens, hidden, np.ones((n, length), bool)


def test_the_term_is_least_at_the_targets_own_distribution():
    """Gibbs: cross-entropy against p is smallest (the entropy of p) at q = p; labels
    equal to IGNORE count nothing."""
    torch.manual_seed(0)
    head, hs = torch.randn(K, C), torch.randn(2, 3, C)
    p = torch.softmax(hs @ head.T / 0.7, -1)  # (2, 3, K)
    labels = torch.tensor([[1, 2, IGNORE], [0, IGNORE, IGNORE]])
    soft = Soft(head, 1.0, temp=0.7)
    best = soft_term(p.log(), hs, labels, soft)
    keep = labels != IGNORE
    assert best == pytest.approx(float(-(p * p.log()).sum(-1)[keep].sum()), rel=1e-5)
    other = torch.log_softmax(torch.randn(2, 3, K), -1)
    assert soft_term(other, hs, labels, soft) > best


@pytest.mark.parametrize("context_dim", [0, 8])
def test_soft_training_brings_the_drafter_closer_to_the_target(tmp_path, context_dim):
    """Same data, same steps: with the soft term the drafter's distribution ends nearer
    the target's (mean KL over the training roots) than with the greedy labels alone."""
    torch.manual_seed(5)
    head = torch.randn(K, C) * 0.6  # a soft target: several ids carry mass
    tokens, hidden, valid = _data(24, 16, head)
    kl = {}
    for w in (0.0, 1.0):
        net = _net(context_dim)
        s = TrainSettings(t=2, epochs=6, lr=1e-2, batch=64, context_rows=8, ckpt_every=1000,
                          soft_weight=w)
        train(net, tokens, hidden, valid, tmp_path / str(w), s, head=head)
        tk, hd, vd = (torch.from_numpy(a) for a in (tokens.astype(np.int64), hidden, valid))
        pos = torch.arange(14).expand(24, -1)  # (R, Q): every root with 2 labels after it
        with torch.no_grad():
            if context_dim:
                inputs, h, _, *ctx, _ = _context_batch(net, tk, hd, vd, torch.arange(24), pos, 2)
                logq = context_unroll(net, inputs, h, *ctx)  # (R, Q, T, K)
            else:
                seq = torch.stack([tk[:, pos[0] + i] for i in range(3)], -1)  # (R, Q, 3)
                h = hd[torch.arange(24)[:, None], pos].float()  # (R, Q, C)
                logq = net.unroll(h.reshape(-1, C), seq[..., :2].reshape(-1, 2))
                logq = logq.log_softmax(-1).reshape(24, 14, 2, K)
            hs = torch.stack([hd[:, pos[0] + i] for i in (1, 2)], 2)  # (R, Q, T, C)
            p = torch.softmax(hs.float() @ head.T, -1)  # the target's next-token distributions
            kl[w] = float((p * (p.log() - logq)).sum(-1).mean())
    assert kl[1.0] < 0.9 * kl[0.0], kl


def test_soft_training_needs_the_head_rows(tmp_path):
    tokens, hidden, valid = _data(4, 8, torch.randn(K, C))
    s = TrainSettings(t=2, epochs=1, batch=8, soft_weight=0.5)
    with pytest.raises(DraftwiseError, match=r"head rows \(24, 16\), got None"):
        train(_net(0), tokens, hidden, valid, tmp_path, s)
    with pytest.raises(DraftwiseError, match=r"got \(23, 16\)"):
        train(_net(0), tokens, hidden, valid, tmp_path, s, head=torch.zeros(K - 1, C))


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [("soft_weight", -0.5, "--soft-weight must be >= 0, got -0.5"),
     ("soft_temp", 0.0, "--soft-temp must be > 0, got 0.0")],
)
def test_the_recipe_refuses_bad_soft_settings(field, value, match):
    with pytest.raises(DraftwiseError, match=match):
        TrainRecipe(**{field: value}).check()


@pytest.mark.parametrize(
    ("device", "match"),
    [("tpu", "--device must be cpu or cuda, got 'tpu'"),
     ("meta", "--device must be cpu or cuda, got 'meta'"),
     ("cuda", "--device cuda: torch sees no CUDA GPU here")],
)
def test_the_recipe_refuses_a_device_it_cannot_use(monkeypatch, device, match):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DraftwiseError, match=match):
        TrainRecipe(device=device).check()
    TrainRecipe(device="cpu").check()


def test_training_on_a_named_device_moves_the_network_there(tmp_path):
    # CI has no GPU: "cpu" named explicitly takes the same path a "cuda" run does
    tokens, hidden, valid = _data(4, 8, torch.randn(K, C))
    net = _net(0)
    s = TrainSettings(t=2, epochs=1, batch=8, device="cpu")
    losses = train(net, tokens, hidden, valid, tmp_path, s)
    assert losses and net.embed.device.type == "cpu"
    assert chain_acceptance(net, tokens, hidden, valid, 2).shape == (2,)


def test_target_rows_are_the_embeddings_unless_the_checkpoint_has_a_head(tmp_path):
    from safetensors.torch import save_file

    from draftwise.training.recipe import target_rows

    e, h = torch.randn(V, C), torch.randn(V, C)
    save_file({"model.embed_tokens.weight": e}, str(tmp_path / "model.safetensors"))
    embed, rows = target_rows(tmp_path)
    assert rows is embed and torch.equal(embed, e)
    save_file({"model.embed_tokens.weight": e, "lm_head.weight": h},
              str(tmp_path / "model.safetensors"))
    embed, rows = target_rows(tmp_path)
    assert torch.equal(embed, e) and torch.equal(rows, h)
