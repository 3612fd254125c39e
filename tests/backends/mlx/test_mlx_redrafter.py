"""ReDrafter on MLX: the backend's hidden state of the last cached token equals the
torch backend's on the same tiny model; the MLX network computes the torch network's
log-probs from the same checkpoint, so both draft the same trees."""

from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from draftwise.backends.cuda import TorchBackend  # noqa: E402
from draftwise.backends.cuda.redrafter.checkpoint import save_redrafter, weights_fingerprint  # noqa: E402
from draftwise.backends.cuda.redrafter.net import ReDrafterNet  # noqa: E402
from draftwise.backends.cuda.redrafter.step import TorchRecurrentStep  # noqa: E402
from draftwise.backends.mlx import MLXBackend  # noqa: E402
from draftwise.backends.mlx.redrafter.net import MLXReDrafterNet
from draftwise.backends.mlx.redrafter.step import MLXRecurrentStep  # noqa: E402
from draftwise.core.drafters.redrafter import ReDrafter  # noqa: E402
from draftwise.core.drafters.redrafter_ckpt import ReDrafterConfig  # noqa: E402
from draftwise.core.tree import DraftTree  # noqa: E402
from draftwise.errors import DraftwiseError  # noqa: E402
from tests.backends.cuda.test_torch_backend import V, _save_tiny  # noqa: E402

pytestmark = pytest.mark.mlx


@pytest.mark.parametrize("context_dim,extend", [(0, False), (16, False), (0, True), (16, True)])
def test_mlx_hidden_and_drafts_equal_torch(tmp_path, context_dim, extend):
    """Same hidden state, same trees and path log-probs over two steps; with
    ``context_dim`` the networks also attend over (and copy from) the context; with
    ``extend`` the context's ids outside the draft vocabulary join it."""
    model_dir, _ = _save_tiny(tmp_path / "m", "llama")
    tb = TorchBackend.from_pretrained(model_dir, device="cpu", invariant=False)
    mb = MLXBackend.from_pretrained(model_dir, dtype="float32", invariant=False)
    embed = tb.model.embed
    torch.manual_seed(1)
    cfg = ReDrafterConfig(
        int(embed.shape[1]), V, 50, 1, "tok", weights_fingerprint(embed), context_dim=context_dim
    )
    net = ReDrafterNet(cfg, embed.float(), torch.arange(50) + 20)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    save_redrafter(net, tmp_path / "ckpt")
    mnet = MLXReDrafterNet.load(tmp_path / "ckpt", mb, "tok")
    steps = [TorchRecurrentStep(net, tb, extend=extend), MLXRecurrentStep(mnet, mb, extend=extend)]
    drafters = [ReDrafter(s, bw=3, t=4) for s in steps]  # before the prefill: rows are kept

    ctx = np.random.default_rng(0).integers(0, V, 9)
    tree = DraftTree(np.array([5, 6, 7, 8]), np.array([-1, -1, 0, 1]))
    for be in (tb, mb):
        be.prefill(ctx[:-1])
        be.verify(int(ctx[-1]), tree, need_logits=False)
        be.commit(np.array([0, 2, 4]))
    np.testing.assert_allclose(np.array(mb.last_hidden()), tb.last_hidden().numpy(), atol=1e-4)

    seq = np.array([*ctx.tolist(), 6, 8, 9])  # the root 9 follows the committed tokens
    for _ in range(2):
        trees = []
        for d in drafters:
            trees.append(d.propose(seq, 64))
            assert d.last is not None
            trees.append(d.last.path_logp)
        assert trees[0].tokens.tolist() == trees[2].tokens.tolist()
        assert trees[0].parents.tolist() == trees[2].parents.tolist()
        np.testing.assert_allclose(trees[1], trees[3], atol=1e-4)
        assert steps[0].vocab_ids.tolist() == steps[1].vocab_ids.tolist()
        assert len(steps[0].vocab_ids) == 50 + (extend and len(set(seq) - set(range(20, 70))))
        chain = DraftTree(np.array([3, 4]), np.array([-1, 0]))  # accept both: 9, 3, 4
        for be in (tb, mb):
            be.verify(int(seq[-1]), chain, need_logits=False)
            be.commit(np.array([0, 1, 2]))
        seq = np.array([*seq.tolist(), 3, 4, 11])
    if context_dim:  # the torch step's entries: positions 1 .. cache_len - 1
        assert drafters[0].net._m == len(seq) - 2 - 3  # type: ignore[attr-defined]
    with pytest.raises(DraftwiseError, match="another tokenizer"):
        MLXReDrafterNet.load(tmp_path / "ckpt", mb, "other")
