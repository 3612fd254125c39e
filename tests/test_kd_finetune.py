"""scripts/kd_finetune.py: its two held-out measures must be what they name, or the
comparison drawn from them (the soft term did not help a fine-tune) is unfounded."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from draftwise.backends.cuda.redrafter.checkpoint import weights_fingerprint  # noqa: E402
from draftwise.backends.cuda.redrafter.net import ReDrafterNet  # noqa: E402
from draftwise.core.drafters.redrafter_ckpt import ReDrafterConfig  # noqa: E402
from draftwise.training.fit import chain_acceptance  # noqa: E402
from tests.scripts import load_script  # noqa: E402

V, C, K, W, L = 40, 16, 24, 4, 12


def _setup() -> tuple[ReDrafterNet, tuple[np.ndarray, ...], tuple[np.ndarray, ...], torch.Tensor]:
    """A random context network and rows whose every token is the target's argmax over
    the full vocabulary (``hidden @ out_rows.T``), as greedy shards are."""
    torch.manual_seed(0)
    embed = torch.randn(V, C)
    cfg = ReDrafterConfig(C, V, K, 1, "tok-a", weights_fingerprint(embed), context_dim=8,
                          context_heads=2)
    net = ReDrafterNet(cfg, embed, torch.arange(K) + 3).eval()
    out_rows = torch.randn(V, C) * 3
    rng = np.random.default_rng(0)
    n = 6
    hidden = rng.normal(size=(n, L, C)).astype(np.float16)
    tokens = (torch.from_numpy(hidden).float() @ out_rows.T).argmax(-1).numpy().astype(np.int32)
    phid = rng.normal(size=(n, W, C)).astype(np.float16)
    ptok = rng.integers(0, V, (n, W)).astype(np.int32)
    held = (tokens, hidden, np.ones((n, L), bool))
    return net, held, (ptok, phid, np.ones((n, W), bool)), out_rows


def test_first_is_the_chains_depth_one_and_seeded_its_probability():
    net, held, prompt, out_rows = _setup()
    mod = load_script("kd_finetune")
    want = chain_acceptance(net, *held, 2, prompt=prompt)[0]
    cold, first = mod.first_guess_prob(net, held, prompt, out_rows, temp=1e-3)
    assert first == pytest.approx(float(want), abs=1e-6)
    # near temperature 0 the target's probability of a guess is 1 when it is the argmax
    # (the greedy label) and 0 otherwise: the seeded measure becomes the greedy one
    assert cold == pytest.approx(first, abs=1e-4)
    hot, _ = mod.first_guess_prob(net, held, prompt, out_rows, temp=1e6)
    assert hot == pytest.approx(1.0 / V, rel=1e-3)  # a flat target: 1 / V whatever the guess


def test_load_first_refuses_too_few_shards(tmp_path):
    mod = load_script("kd_finetune")
    with pytest.raises(SystemExit, match="has 0 shards, asked for 2"):
        mod.load_first(tmp_path, 2)
