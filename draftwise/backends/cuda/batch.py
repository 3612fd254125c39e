"""Batched forwards for ``TorchBackend`` (The N-Grammys): the bigram builder's
one-token rows and the paper's (k, w + 1) verification batch.

``next_topk`` runs B independent one-token sequences at position 0. With a single key,
attention is the identity on the values (softmax over one score is 1), so no cache and
no RoPE are needed: ``o = v`` per head, then the usual MLP and lm_head; top-k on device.

``verify_batch`` runs k rows ``[root, drafts[i]]`` at positions ``cache_len .. +w``. The
KV cache is never copied or repeated per row: for the cached prefix all ``k (w+1)``
queries of a kv head are folded into ONE matmul against the cache as it lies (the
broadcast the paper gets from ``expand``), and each row's own ``w + 1`` keys get a plain
causal block; the two score blocks share one softmax. The rows' new K/V stay in a side
buffer until ``commit_batch(row, n)`` copies the kept row's first ``n`` into the cache.

Example::

    be = TorchBackend.from_pretrained(path, device="cpu")
    be.next_topk(np.arange(8), k=5)                          # (8, 5) ids
    be.prefill(prompt[:-1])
    am = be.verify_batch(prompt[-1], np.array([[5, 6], [7, 8]]))   # (2, 3) argmax
    be.commit_batch(row=0, n=1)                              # keep the root only
"""

from __future__ import annotations

import numpy as np
import torch

from draftwise.backends.cuda.cpu.int4 import linear
from draftwise.backends.cuda.llama import Llama, rms_norm
from draftwise.core.batch import check_drafts
from draftwise.errors import DraftwiseError


def mlp_block(model: Llama, li: int, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """Residual + o_proj, then the MLP of layer ``li``; x, o: (..., C), (..., H D)."""
    layer = model.layers[li]
    return model.mlp_residual(layer, model.attn_residual(layer, x, o))  # (R, C)


def single_token_logits(model: Llama, tokens: torch.Tensor) -> torch.Tensor:
    """(B, V) logits of B independent one-token sequences ``tokens`` (B,) at position 0."""
    cfg = model.cfg
    h, hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    b = tokens.shape[0]
    x = model.embed_rows(tokens)  # (B, C)
    for li, layer in enumerate(model.layers):
        hn = rms_norm(x, layer.attn_norm, cfg.norm_eps)
        qkv = linear(hn, layer.wqkv, layer.bqkv)  # (B, (H + 2 H_kv) D)
        v = qkv[:, (h + hkv) * d :].view(b, hkv, 1, d)  # (B, H_kv, 1, D)
        o = v.expand(b, hkv, model.n_rep, d).reshape(b, h * d)  # q head j reads kv j // rep
        x = mlp_block(model, li, x, o)
    return model.logits(rms_norm(x, model.norm, cfg.norm_eps))  # (B, V)


class BatchMixin:
    """``next_topk``, ``verify_batch`` and ``commit_batch`` for ``TorchBackend`` (which
    provides ``model``, ``device``, ``_len``, ``_check_room`` and ``_check_ids``)."""

    # Measured on a 2-core CPU with SmolLM2-135M (see draftwise/backends/cuda/README or the
    # issue report): the tree forward was faster for every (k, w) tried, so batch is opt-in.
    batch_by_default = False
    _batch_kv: torch.Tensor | None = None  # (L, 2, H_kv, k, w + 1, D) of the last batch

    def next_topk(self, tokens: np.ndarray, k: int) -> np.ndarray:
        """(B, k) int64: the model's top-k next tokens after each one-token sequence."""
        ids = np.asarray(tokens, np.int64).reshape(-1)
        self._check_ids(ids)  # type: ignore[attr-defined]
        model: Llama = self.model  # type: ignore[attr-defined]
        if not 1 <= k <= model.cfg.vocab_size:
            raise DraftwiseError(f"top-k must be in 1..{model.cfg.vocab_size}, got {k}")
        with torch.inference_mode():
            logits = single_token_logits(model, torch.from_numpy(ids).to(model.device))
            return logits.topk(k, dim=-1).indices.cpu().numpy()  # (B, k)

    def embeddings(self) -> tuple[np.ndarray, np.ndarray]:
        """(input embeddings (V, C), output embeddings (V, C)) as float32 numpy."""
        model: Llama = self.model  # type: ignore[attr-defined]
        return model.embed.float().cpu().numpy(), model.lm_head.float().cpu().numpy()

    def verify_batch(self, root: int, drafts: np.ndarray) -> np.ndarray:
        """Argmax (k, w + 1) of rows ``[root, drafts[i]]``; see the module docstring."""
        d = check_drafts(drafts)
        k, t = d.shape[0], d.shape[1] + 1
        if k == 0:
            raise DraftwiseError("verify_batch needs at least one row of drafts")
        self._check_room("verify_batch", t)  # type: ignore[attr-defined]
        host = np.empty((k, t), np.int64)
        host[:, 0] = root
        host[:, 1:] = d
        self._check_ids(host)  # type: ignore[attr-defined]
        model: Llama = self.model  # type: ignore[attr-defined]
        cfg, start = model.cfg, self._len  # type: ignore[attr-defined]
        h, hkv, dd, rep = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, model.n_rep
        with torch.inference_mode():
            tok = torch.from_numpy(host).to(model.device).reshape(-1)  # (k t,)
            pos = torch.arange(start, start + t, device=model.device)  # (t,)
            ropes = model.rope_rows(pos)  # per table: (t, 1, D) x 2, broadcast over rows
            own_mask = torch.ones(t, t, dtype=torch.bool, device=model.device).tril()
            own_mask = own_mask.repeat(rep, 1)  # (rep t, t): query row r*t + i
            far = None  # (rep t, start) -inf on cached keys outside a windowed layer's window
            if cfg.window_layers and cfg.sliding_window is not None:
                row_pos = start + torch.arange(rep * t, device=model.device) % t  # (rep t,)
                keys = torch.arange(start, device=model.device)  # (start,)
                out = keys[None, :] <= row_pos[:, None] - cfg.sliding_window
                far = torch.zeros(out.shape, device=model.device).masked_fill(out, float("-inf"))
            kv_new = torch.empty((cfg.n_layers, 2, hkv, k, t, dd), dtype=model.dtype, device=model.device)
            x = model.embed_rows(tok)  # (k t, C)
            for li, layer in enumerate(model.layers):
                hn = rms_norm(x, layer.attn_norm, cfg.norm_eps)
                qkv = linear(hn, layer.wqkv, layer.bqkv)  # (k t, (H + 2 H_kv) D)
                qk = qkv[:, : (h + hkv) * dd].view(k, t, h + hkv, dd)
                qk = model._rope(model.qk_norm(layer, qk), *ropes[layer.rope])  # (k, t, H + H_kv, D)
                q = qk[:, :, :h].view(k, t, hkv, rep, dd).permute(2, 0, 3, 1, 4)  # (H_kv, k, rep, t, D)
                q = q.reshape(hkv, k, rep * t, dd)
                kv_new[li, 0] = qk[:, :, h:].permute(2, 0, 1, 3)  # (H_kv, k, t, D)
                kv_new[li, 1] = qkv[:, (h + hkv) * dd :].view(k, t, hkv, dd).permute(2, 0, 1, 3)
                o = _attend(q, model.cache[li, :, :, :start], kv_new[li], own_mask,
                            cfg.attn_scale, cfg.attn_softcap, far if layer.window else None)
                o = o.view(hkv, k, rep, t, dd).permute(1, 3, 0, 2, 4).reshape(k * t, h * dd)
                x = mlp_block(model, li, x, o)
            logits = model.logits(rms_norm(x, model.norm, cfg.norm_eps))  # (k t, V)
            self._batch_kv = kv_new
            self._pending = 0  # type: ignore[attr-defined]  # a tree commit is now invalid
            if logits.device.type == "cpu":  # float32 argmax: same answer, much faster (backend.py)
                logits = logits.float()
            return logits.argmax(dim=-1).view(k, t).cpu().numpy()

    def commit_batch(self, row: int, n: int) -> None:
        """Keep entries ``0..n-1`` of ``row`` of the last batch in the cache."""
        kv = self._batch_kv
        if kv is None:
            raise DraftwiseError("commit_batch() without a preceding verify_batch()")
        if not (0 <= row < kv.shape[3] and 1 <= n <= kv.shape[4]):
            raise DraftwiseError(f"commit_batch row={row}, n={n} outside the last batch {tuple(kv.shape[3:5])}")
        start = self._len  # type: ignore[attr-defined]
        with torch.inference_mode():
            self.model.cache[:, :, :, start : start + n] = kv[:, :, :, row, :n]  # type: ignore[attr-defined]
        self._len = start + n
        self._batch_kv = None


def _attend(
    q: torch.Tensor, prefix: torch.Tensor, own: torch.Tensor, own_mask: torch.Tensor,
    scale: float | None = None, softcap: float | None = None, far: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of q (H_kv, k, R, D) over the shared cached ``prefix`` (2, H_kv, S, D)
    and each row's own keys ``own`` (2, H_kv, k, t, D) under ``own_mask`` (R, t), scores
    scaled by ``scale`` (None: D ** -0.5) and soft-capped at ``softcap`` (gemma2);
    ``far`` (R, S): a bias on the cached keys (a sliding window's -inf).
    Returns (H_kv, k, R, D)."""
    hkv, k, r, d = q.shape
    s = prefix.shape[2]
    scale = d**-0.5 if scale is None else scale
    qf = q.float()
    # All k R queries of a kv head against the cache in one matmul: no per-row copy.
    sp = torch.matmul(qf.reshape(hkv, k * r, d), prefix[0].float().transpose(1, 2))  # (H_kv, k R, S)
    so = torch.matmul(qf, own[0].float().transpose(-1, -2))  # (H_kv, k, R, t)
    scores = torch.cat([sp.view(hkv, k, r, s), so], dim=-1) * scale  # (H_kv, k, R, S + t)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    own_bias = torch.zeros(own_mask.shape, dtype=scores.dtype, device=scores.device)
    scores[..., s:] += own_bias.masked_fill(~own_mask, float("-inf"))  # (R, t) on the own keys
    if far is not None:
        scores[..., :s] += far  # (R, S)
    p = torch.softmax(scores, dim=-1)
    out = torch.matmul(p[..., s:], own[1].float())  # (H_kv, k, R, D)
    if s:
        pp = p[..., :s].reshape(hkv, k * r, s)
        out = out + torch.matmul(pp, prefix[1].float()).view(hkv, k, r, d)
    return out.to(q.dtype)
