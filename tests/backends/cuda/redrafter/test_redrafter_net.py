"""ReDrafter network: checkpoint round trip and refusals, training reduces the loss, and
the torch step drives the core's beam search."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from draftwise.backends.cuda.redrafter.checkpoint import (  # noqa: E402
    load_redrafter,
    save_redrafter,
    weights_fingerprint,
)
from draftwise.backends.cuda.redrafter.net import ReDrafterNet  # noqa: E402
from draftwise.core.drafters.redrafter_ckpt import ReDrafterConfig  # noqa: E402
from draftwise.errors import DraftwiseError  # noqa: E402
from draftwise.training.fit import (  # noqa: E402
    TrainSettings,
    _context_batch,
    chain_acceptance,
    choose_vocab,
    context_unroll,
    samples,
    train,
)

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


def test_bfloat16_storage_halves_the_file_and_loads_as_float32(tmp_path):
    net, embed = _net()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    save_redrafter(net, tmp_path / "f32")
    save_redrafter(net, tmp_path / "bf16", dtype=torch.bfloat16)
    small, big = ((tmp_path / d / "model.safetensors").stat().st_size for d in ("bf16", "f32"))
    assert small < 0.6 * big
    back = load_redrafter(tmp_path / "bf16", embed, "tok-a", weights_fingerprint(embed))
    for (k, a), (_, b) in zip(net.state_dict().items(), back.state_dict().items()):
        assert b.dtype == a.dtype, k  # float32 parameters, int64 ids
        assert torch.equal(b, a.to(torch.bfloat16).to(a.dtype) if a.is_floating_point() else a), k
    with pytest.raises(DraftwiseError, match="not torch.int8"):
        save_redrafter(net, tmp_path / "int8", dtype=torch.int8)


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


def test_forced_labels_are_what_it_learns_and_roots_are_the_targets(tmp_path):
    """Teacher-forced rows: the network learns ``labels`` (the target's argmax), not the
    corpus tokens, and only positions whose token is the target's own are roots."""
    tokens, hidden, valid = _synthetic(64, 12)
    labels = (tokens - 3 + 7) % K + 3  # a different function of the same inputs
    labels[:, ::3] = tokens[:, ::3]  # every third position agrees with the corpus
    idx = samples(valid, 3, tokens == labels)
    assert set(idx[:, 1].tolist()) == {0, 3, 6, 9}
    net, _ = _net()
    s = TrainSettings(t=3, epochs=30, lr=1e-2, batch=64, ckpt_every=1000)
    train(net, tokens, hidden, valid, tmp_path, s, labels=labels)
    right_labels = chain_acceptance(net, tokens, hidden, valid, 1, labels=labels)
    right_tokens = chain_acceptance(net, tokens, hidden, valid, 1)
    assert right_labels[0] > 0.8 > 0.2 > right_tokens[0]


def test_forced_shards_layout(tmp_path, default_model_dir):
    """``hidden[b, j]`` predicts ``labels[b, j]`` (the argmax of the target's own head)
    and ``tokens[b, j]`` is the corpus token after the one it read."""
    from safetensors import safe_open

    from draftwise.training.distill import load_shards, write_forced_shards

    prompts = tmp_path / "p.jsonl"
    rows = [{"prompt": f"Name {i} colours.", "response": "Red, green and blue."} for i in range(6)]
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "forced"
    write_forced_shards(default_model_dir, prompts, out, 2, skip=1, batch=2, seq_len=16)
    tokens, hidden, valid, labels = load_shards(out, "forced-*.npz")
    assert tokens.shape == (4, 16) and hidden.shape[:2] == (4, 16) and valid.all()
    with safe_open(str(default_model_dir / "model.safetensors"), "pt") as f:
        embed = f.get_tensor("model.embed_tokens.weight").float()
    logits = (torch.from_numpy(hidden.astype(np.float32)) @ embed.T).numpy()  # tied head
    # the label is the argmax up to the bfloat16 rounding of the target's own head
    got = np.take_along_axis(logits, labels[..., None].astype(np.int64), -1)[..., 0]
    assert (got >= logits.max(-1) - 0.25).all()
    assert (logits.argmax(-1) == labels).mean() > 0.8
    with pytest.raises(DraftwiseError, match="forced shards need"):
        write_forced_shards(default_model_dir, prompts, tmp_path / "f2", 50, skip=1, batch=2)


def _ctx_net(context_dim: int, seed: int = 0) -> tuple[ReDrafterNet, torch.Tensor]:
    torch.manual_seed(seed)
    embed = torch.randn(V, C)
    cfg = ReDrafterConfig(
        C, V, K, 1, "tok-a", weights_fingerprint(embed), context_dim=context_dim, context_heads=2
    )
    return ReDrafterNet(cfg, embed, torch.arange(K) + 3), embed


def _repeats(n: int, length: int, period: int = 5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row repeats a random pattern of ``period`` ids: after the first period the
    next token is a copy from the context, unpredictable from the token alone."""
    rng = np.random.default_rng(1)
    pattern = rng.integers(3, 3 + K, (n, period))
    tokens = pattern[:, np.arange(length) % period].astype(np.int32)
    hidden = rng.normal(size=(n, length, C)).astype(np.float16)
    return tokens, hidden, np.ones((n, length), bool)


def test_context_round_trip(tmp_path):
    net, embed = _ctx_net(8)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    save_redrafter(net, tmp_path)
    back = load_redrafter(tmp_path, embed, "tok-a", weights_fingerprint(embed))
    assert (back.cfg.context_dim, back.cfg.context_heads) == (8, 2)
    tokens, hidden, valid = _repeats(2, 12)
    tk, hd, vd = (torch.from_numpy(a) for a in (tokens.astype(np.int64), hidden, valid))
    pos = torch.tensor([[3, 7], [1, 10]])
    args = _context_batch(net, tk, hd, vd, torch.arange(2), pos, 3)
    want = context_unroll(net, args[0], args[1], *args[3:7])
    got = context_unroll(back, args[0], args[1], *args[3:7])
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert torch.allclose(want.exp().sum(-1), torch.ones(()), atol=1e-4)  # probabilities


def test_context_network_learns_to_copy(tmp_path):
    """On repeated patterns the context network learns to copy (depth-1 acceptance near
    the share of roots after the first period); the plain network cannot."""
    tokens, hidden, valid = _repeats(48, 30)
    accs = {}
    for d in (0, 16):
        net, _ = _ctx_net(d)
        s = TrainSettings(t=3, epochs=8, lr=1e-2, batch=64, context_rows=8, ckpt_every=1000)
        losses = train(net, tokens, hidden, valid, tmp_path / str(d), s)
        assert losses[-1] < losses[0]
        accs[d] = chain_acceptance(net, tokens, hidden, valid, 3)[0]
    assert accs[16] > 0.7 and accs[0] < 0.4, accs


def test_context_visibility_is_causal():
    """A root at ``pos`` sees entries ``j < pos`` only: ``tokens[pos]`` is the last
    entry's next token, nothing after the root leaks in."""
    net, _ = _ctx_net(8)
    tokens, hidden, valid = _repeats(1, 10)
    tk, hd, vd = (torch.from_numpy(a) for a in (tokens.astype(np.int64), hidden, valid))
    *_, ok, _ = _context_batch(net, tk, hd, vd, torch.arange(1), torch.tensor([[0, 4]]), 2)
    assert ok[0, 0].sum() == 0 and ok[0, 1].tolist() == [True] * 4 + [False] * 6


def test_context_network_copies_from_the_prompt(tmp_path):
    """The pattern is in the prompt only: with the prompt as context the network copies
    it from the first continuation token on; with the continuation alone it first has
    to see it once."""
    rng = np.random.default_rng(2)
    n, period, length = 48, 6, 12
    pattern = rng.integers(3, 3 + K, (n, period))
    tokens = pattern[:, np.arange(length) % period].astype(np.int32)
    hidden = rng.normal(size=(n, length, C)).astype(np.float16)
    valid = np.ones((n, length), bool)
    w = period + 2  # right-aligned prompt: two padding columns, then the pattern
    ptok = np.zeros((n, w), np.int32)
    ptok[:, 2:] = pattern
    phid = rng.normal(size=(n, w, C)).astype(np.float16)
    pval = np.zeros((n, w), bool)
    pval[:, 3:] = True  # the first prompt token has no hidden state
    prompt = (ptok, phid, pval)
    s = TrainSettings(t=2, epochs=10, lr=1e-2, batch=64, context_rows=8, ckpt_every=1000)
    accs = {}
    for name, pr in (("prompt", prompt), ("alone", None)):
        net, _ = _ctx_net(16)
        train(net, tokens, hidden, valid, tmp_path / name, s, prompt=pr)
        accs[name] = chain_acceptance(net, tokens, hidden, valid, 2, prompt=pr)[0]
    assert accs["prompt"] > 0.65 and accs["prompt"] > accs["alone"] + 0.2, accs


def test_grown_network_drafts_the_same_then_trains_its_new_blocks(tmp_path):
    """``grown`` adds zero ResBlocks: the same outputs (context included), a checkpoint
    that records the new count, and training moves the new blocks' weights."""
    net, embed = _ctx_net(8)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    big = net.grown(3)
    assert (big.cfg.resblocks, len(big.res)) == (3, 3)
    tokens, hidden, valid = _repeats(2, 12)
    tk, hd, vd = (torch.from_numpy(a) for a in (tokens.astype(np.int64), hidden, valid))
    args = _context_batch(net, tk, hd, vd, torch.arange(2), torch.tensor([[3, 7], [1, 10]]), 3)
    torch.testing.assert_close(context_unroll(big, args[0], args[1], *args[3:7]),
                               context_unroll(net, args[0], args[1], *args[3:7]), rtol=0, atol=0)
    save_redrafter(big, tmp_path / "big")
    back = load_redrafter(tmp_path / "big", embed, "tok-a", weights_fingerprint(embed))
    assert back.cfg.resblocks == 3
    tokens, hidden, valid = _repeats(16, 20)
    s = TrainSettings(t=3, epochs=1, lr=1e-2, batch=32, context_rows=4, ckpt_every=1000)
    train(big, tokens, hidden, valid, tmp_path / "fit", s)
    assert big.res[2].weight.abs().sum() > 0  # the new block learnt
    with pytest.raises(DraftwiseError, match="cannot grow a network of 3 ResBlocks to 2"):
        big.grown(2)
