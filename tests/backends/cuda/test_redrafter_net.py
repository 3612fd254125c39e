"""ReDrafter network: checkpoint round trip and refusals, training reduces the loss, and
the torch step drives the core's beam search."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from draftwise.backends.cuda.redrafter import ReDrafterNet  # noqa: E402
from draftwise.backends.cuda.redrafter_io import (  # noqa: E402
    load_redrafter,
    save_redrafter,
    weights_fingerprint,
)
from draftwise.backends.cuda.redrafter_train import (  # noqa: E402
    TrainSettings,
    chain_acceptance,
    choose_vocab,
    train,
)
from draftwise.core.drafters.redrafter_ckpt import ReDrafterConfig  # noqa: E402
from draftwise.errors import DraftwiseError  # noqa: E402

V, C, K = 40, 16, 24


def _net(seed: int = 0) -> tuple[ReDrafterNet, torch.Tensor]:
    torch.manual_seed(seed)
    embed = torch.randn(V, C)
    cfg = ReDrafterConfig(C, V, K, 1, tokenizer_id="tok-a", fingerprint=weights_fingerprint(embed))
    return ReDrafterNet(cfg, embed, torch.arange(K) + 3), embed


def test_round_trip(tmp_path):
    net, embed = _net()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    save_redrafter(net, tmp_path)
    back = load_redrafter(tmp_path, embed, "tok-a", weights_fingerprint(embed))
    h, toks = torch.randn(3, C), torch.randint(0, V, (3, 4))
    torch.testing.assert_close(back.unroll(h, toks), net.unroll(h, toks), rtol=0, atol=0)
    assert back.vocab_ids.tolist() == net.vocab_ids.tolist()


def test_refusals_name_the_path(tmp_path):
    net, embed = _net()
    save_redrafter(net, tmp_path)
    fp = weights_fingerprint(embed)
    with pytest.raises(DraftwiseError, match=f"{tmp_path}.*another tokenizer"):
        load_redrafter(tmp_path, embed, "tok-b", fp)
    with pytest.raises(DraftwiseError, match=f"{tmp_path}.*other model weights"):
        load_redrafter(tmp_path, embed, "tok-a", weights_fingerprint(embed + 1))
    w = tmp_path / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-10])  # truncated
    with pytest.raises(DraftwiseError, match=f"corrupt or truncated ReDrafter weights: {w}"):
        load_redrafter(tmp_path, embed, "tok-a", fp)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(DraftwiseError, match=f"corrupt ReDrafter config {tmp_path}"):
        load_redrafter(tmp_path, embed, "tok-a", fp)
    with pytest.raises(DraftwiseError, match="no ReDrafter checkpoint at"):
        load_redrafter(tmp_path / "nothing", embed, "tok-a", fp)


def test_config_records_identity(tmp_path):
    net, _ = _net()
    save_redrafter(net, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["tokenizer_id"] == "tok-a" and len(cfg["weights_sha256"]) == 64


def _synthetic(n: int, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sequences following next = (5 * tok + 1) mod K + 3: learnable from the inputs."""
    rng = np.random.default_rng(0)
    tokens = np.zeros((n, length), np.int32)
    tokens[:, 0] = rng.integers(3, 3 + K, n)
    for j in range(1, length):
        tokens[:, j] = (5 * (tokens[:, j - 1] - 3) + 1) % K + 3
    hidden = rng.normal(size=(n, length, C)).astype(np.float16)
    return tokens, hidden, np.ones((n, length), bool)


def test_training_reduces_loss_and_resumes(tmp_path):
    tokens, hidden, valid = _synthetic(64, 12)
    vocab, cover = choose_vocab(tokens, valid, K, V)
    assert cover == 1.0 and vocab.tolist() == list(range(3, 3 + K))
    net, _ = _net()
    s = TrainSettings(t=3, epochs=5, lr=1e-2, batch=64, ckpt_every=5)
    before = chain_acceptance(net, tokens, hidden, valid, 3)
    losses = train(net, tokens, hidden, valid, tmp_path, s)
    assert losses[-1] < 0.5 * losses[0]
    after = chain_acceptance(net, tokens, hidden, valid, 3)
    assert after[0] > max(0.5, before[0])
    # a second run with a longer schedule resumes at the saved step
    more = train(
        net, tokens, hidden, valid, tmp_path, TrainSettings(t=3, epochs=6, lr=1e-2, batch=64)
    )
    assert len(more) == len(losses) // 5
