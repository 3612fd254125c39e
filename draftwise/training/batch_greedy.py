"""Batched greedy continuation of many prompts at once, for distillation data.

``Llama`` runs one sequence (its cache is one sequence's); this runs B left-padded
sequences through the same weights with a cache of their own, ``(B, H_kv, S, D)`` per
layer, so every decode step is one forward of B rows: the matmuls see B rows instead of
one, which is what makes a drafter's training data affordable on a CPU. Plain torch
ops (bfloat16 weights run through oneDNN on a CPU, cuBLAS on a GPU: the model's
device); no plan, no invariance: this is data, not decoding.

Layout of the result (the ReDrafter shards'): ``hidden[b, j]`` is the last-layer hidden
state (after the final norm) that predicted ``tokens[b, j]``: for j = 0 the prompt's
last token's, then the previous generated token's. ``valid[b, j]`` is False after the
row's end-of-sequence token (its later tokens are 0); finished rows leave the batch.

Example::

    model = Llama.load(model_dir, torch.bfloat16, torch.device("cpu"), max_cache_len=1)
    tokens, hidden, valid = greedy_continuations(model, [[1, 2, 3], [4, 5]], 16, eos=2)
    tokens.shape, hidden.shape   # (2, 16), (2, 16, 576)
"""

from __future__ import annotations

import numpy as np
import torch

from draftwise.backends.cuda.batch import mlp_block
from draftwise.backends.cuda.cpu.int4 import linear
from draftwise.backends.cuda.llama import Llama, rms_norm, rope_table_set
from draftwise.errors import DraftwiseError


class _Batch:
    """B sequences' K/V and which cache slots each may attend to."""

    def __init__(self, model: Llama, b: int, slots: int) -> None:
        cfg = model.cfg
        shape = (cfg.n_layers, 2, b, cfg.n_kv_heads, slots, cfg.head_dim)
        dev = model.device
        self.kv = torch.zeros(shape, dtype=model.dtype, device=dev)  # (L, 2, B, H_kv, S, D)
        self.ok = torch.zeros((b, slots), dtype=torch.bool, device=dev)  # (B, S) real token
        self.ropes = rope_table_set(cfg, slots, model.dtype, dev)  # per Layer.rope


def _left_padded(
    model: Llama, prompts: list[list[int]], slots: int
) -> tuple[_Batch, torch.Tensor, torch.Tensor]:
    """A batch cache of ``slots`` slots with the prompts' slots marked, and their ids and
    positions (B, P), left-padded to the longest prompt P."""
    b, p = len(prompts), max(len(x) for x in prompts)
    st = _Batch(model, b, slots)
    ids = torch.zeros((b, p), dtype=torch.long)  # (B, P) left-padded
    pos = torch.zeros((b, p), dtype=torch.long)  # (B, P)
    ok = torch.zeros((b, p), dtype=torch.bool)  # (B, P)
    for r, x in enumerate(prompts):
        ids[r, p - len(x) :] = torch.tensor(x)
        pos[r, p - len(x) :] = torch.arange(len(x))
        ok[r, p - len(x) :] = True
    st.ok[:, :p] = ok.to(st.ok.device)
    return st, ids.to(st.ok.device), pos.to(st.ok.device)


def _forward(
    model: Llama,
    st: _Batch,
    rows: slice,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    start: int,
) -> torch.Tensor:
    """Rows ``rows`` of the batch: ``tokens``, ``positions`` (B', T) into slots
    ``start .. start+T``; returns the residual stream (B', T, C) before the final norm."""
    cfg = model.cfg
    h, hkv, d, rep = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, model.n_rep
    b, t = tokens.shape
    if cfg.window_layers and cfg.sliding_window is not None and st.ok.shape[1] > cfg.sliding_window:
        raise DraftwiseError(
            f"batched greedy generation of {st.ok.shape[1]} positions passes the model's sliding "
            f"window ({cfg.sliding_window}): not supported yet; use shorter prompts or outputs"
        )
    end = st.ok.shape[1]  # every slot: a slice of the cache would make the matmuls copy it
    ropes = [(c[positions].unsqueeze(2), sn[positions].unsqueeze(2)) for c, sn in st.ropes]  # (B', T, 1, D)
    dev = tokens.device
    # (T, S) row i sees slots <= start+i
    causal = torch.ones((t, end), dtype=torch.bool, device=dev).tril(start)
    own = torch.zeros((t, end), dtype=torch.bool, device=dev)
    own[:, start : start + t] = torch.eye(t, dtype=torch.bool, device=dev)  # padding sees itself
    allowed = (st.ok[rows, None] | own[None]) & causal[None]  # (B', T, S)
    allowed = allowed[:, None, None].expand(b, hkv, rep, t, end).reshape(b, hkv, rep * t, end)
    x = model.embed_rows(tokens)  # (B', T, C)
    scale = d**-0.5 if cfg.attn_scale is None else cfg.attn_scale
    for li, layer in enumerate(model.layers):
        hn = rms_norm(x, layer.attn_norm, cfg.norm_eps)
        qkv = linear(hn, layer.wqkv, layer.bqkv)  # (B', T, (H + 2 H_kv) D)
        qk = qkv[..., : (h + hkv) * d].view(b, t, h + hkv, d)  # (B', T, H + H_kv, D)
        qk = model._rope(model.qk_norm(layer, qk), *ropes[layer.rope])
        q = qk[:, :, :h]  # (B', T, H, D)
        kv = st.kv[li, :, rows]  # (2, B', H_kv, S, D)
        kv[0, :, :, start : start + t] = qk[:, :, h:].transpose(1, 2)
        v = qkv[..., (h + hkv) * d :].view(b, t, hkv, d)  # (B', T, H_kv, D)
        kv[1, :, :, start : start + t] = v.transpose(1, 2)
        # q head j reads kv head j // rep: (B', H_kv, rep T, D)
        qg = q.view(b, t, hkv, rep, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, rep * t, d)
        s = torch.matmul(qg, kv[0].transpose(-1, -2)).float() * scale  # (B', H_kv, rep T, S)
        if cfg.attn_softcap is not None:
            s = torch.tanh(s / cfg.attn_softcap) * cfg.attn_softcap
        p = s.masked_fill(~allowed, float("-inf")).softmax(-1).to(x.dtype)
        o = torch.matmul(p, kv[1])  # (B', H_kv, rep T, D)
        o = o.view(b, hkv, rep, t, d).permute(0, 3, 1, 2, 4).reshape(b, t, h * d)
        x = mlp_block(model, li, x, o)  # (B', T, C)
    return x


@torch.inference_mode()
def greedy_continuations(
    model: Llama,
    prompts: list[list[int]],
    gen_len: int,
    eos: int | None,
    prefill_rows: int = 16,
    temperature: float = 0.0,
    seed: int = 0,
    sample_first: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Greedy continuation of every prompt for ``gen_len`` tokens: tokens (B, L) int32,
    hidden (B, L, C) float16, valid (B, L) bool (see the module docstring). Prompts are
    prefilled ``prefill_rows`` at a time (bounds the score matrices' memory), each chunk
    from its longest prompt's first token: give prompts sorted by length to waste little
    on padding.

    ``temperature`` > 0 samples each token instead, from ``softmax(logits / T)`` by its
    CDF in id order at a uniform of its own (row ``b``'s from ``default_rng([seed, b])``,
    whatever else is in the batch): contexts like those seeded sampling meets, for a
    drafter that drafts there. ``sample_first`` = K samples only the first K tokens and
    continues greedily from there: greedy text (what a greedy drafter must guess) from
    other starts, a distinct greedy path from one prompt at each seed."""
    if not prompts or any(len(x) == 0 for x in prompts):
        raise DraftwiseError("greedy_continuations needs non-empty prompts")
    if gen_len < 1:
        raise DraftwiseError(f"gen_len must be at least 1, got {gen_len}")
    if not (temperature >= 0.0 and np.isfinite(temperature)):
        raise DraftwiseError(f"temperature must be a finite number >= 0, got {temperature}")
    if sample_first is not None and sample_first < 0:
        raise DraftwiseError(f"sample_first must be >= 0, got {sample_first}")
    sampled = gen_len if sample_first is None else min(gen_len, sample_first)  # tokens sampled
    if model.int4:
        raise DraftwiseError("greedy_continuations runs a dense (not 4-bit) model")
    dev = model.device
    b, p = len(prompts), max(len(x) for x in prompts)
    st, ids, pos = _left_padded(model, prompts, p + gen_len)
    last = torch.empty((b, model.cfg.dim), dtype=model.dtype, device=dev)  # (B, C)
    for r0 in range(0, b, prefill_rows):  # each chunk from its own longest prompt on
        rows = slice(r0, min(b, r0 + prefill_rows))
        c0 = p - max(len(x) for x in prompts[rows])
        last[rows] = _forward(model, st, rows, ids[rows, c0:], pos[rows, c0:], c0)[:, -1]
    nxt_pos = pos[:, -1] + 1  # (B,)
    alive = torch.ones(b, dtype=torch.bool, device=dev)  # (B',) of the rows still in the batch
    row_of = torch.arange(b, device=dev)  # (B',) their rows in the result
    toks = torch.zeros((b, gen_len), dtype=torch.int32, device=dev)
    hids = torch.zeros((b, gen_len, model.cfg.dim), dtype=torch.float16, device=dev)
    valid = torch.zeros((b, gen_len), dtype=torch.bool, device=dev)
    u = None  # (B, L) each row's uniforms, when sampling
    if temperature > 0.0:
        u = torch.from_numpy(
            np.stack([np.random.default_rng([seed, r]).random(gen_len) for r in range(b)])
        ).to(dev)
    for j in range(gen_len):
        xn = model.final_hidden(last)  # (B', C)
        logits = model.logits(xn).float()  # (B', V)
        if u is None or j >= sampled:
            nxt = logits.argmax(-1)  # (B',)
        else:  # the first id whose CDF passes the row's uniform
            cdf = torch.softmax(logits / temperature, -1).double().cumsum(-1)  # (B', V)
            at = u[row_of, j, None] * cdf[:, -1:]  # (B', 1)
            nxt = (cdf <= at).sum(-1).clamp_(max=logits.shape[1] - 1)  # (B',)
        toks[row_of, j], hids[row_of, j], valid[row_of, j] = nxt.int(), xn.half(), alive
        if eos is not None:
            alive &= nxt != eos
        if j + 1 == gen_len or not bool(alive.any()):
            break
        if int(alive.sum()) <= 3 * alive.numel() // 4:  # drop finished rows from the batch
            keep = alive.nonzero()[:, 0]
            st.kv, st.ok = st.kv[:, :, keep].contiguous(), st.ok[keep]
            last, nxt, nxt_pos, row_of = last[keep], nxt[keep], nxt_pos[keep], row_of[keep]
            alive = alive[keep]
        st.ok[:, p + j] = True
        rows = slice(0, row_of.numel())
        last = _forward(model, st, rows, nxt[:, None], nxt_pos[:, None], p + j)[:, 0]
        nxt_pos = nxt_pos + 1
    return toks.cpu().numpy(), hids.cpu().numpy(), valid.cpu().numpy()


@torch.inference_mode()
def prompt_states(
    model: Llama, prompts: list[list[int]], width: int, prefill_rows: int = 16
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The prompts' own tokens and hidden states, for a drafter that attends over the
    context: tokens (B, W) int32, hidden (B, W, C) float16, valid (B, W) bool, each
    prompt right-aligned in ``width`` columns (its last ``width`` tokens). As in the
    continuation, ``hidden[b, j]`` is the last-layer hidden state that predicted
    ``tokens[b, j]`` (the previous token's); a prompt's first token has none, so it is
    not valid. Also (B, C) float16: the state of each prompt's last token (the
    continuation's ``hidden[b, 0]``)."""
    if not prompts or any(len(x) == 0 for x in prompts):
        raise DraftwiseError("prompt_states needs non-empty prompts")
    if model.int4:
        raise DraftwiseError("prompt_states runs a dense (not 4-bit) model")
    prompts = [x[-width:] for x in prompts]
    b, p = len(prompts), max(len(x) for x in prompts)
    st, ids, pos = _left_padded(model, prompts, p)
    toks = np.zeros((b, width), np.int32)
    hids = np.zeros((b, width, model.cfg.dim), np.float16)
    valid = np.zeros((b, width), bool)
    last = np.zeros((b, model.cfg.dim), np.float16)
    for r0 in range(0, b, prefill_rows):
        rows = slice(r0, min(b, r0 + prefill_rows))
        c0 = p - max(len(x) for x in prompts[rows])
        x = _forward(model, st, rows, ids[rows, c0:], pos[rows, c0:], c0)  # (B', T, C)
        xn = model.final_hidden(x).to(torch.float16).cpu().numpy()  # (B', T, C)
        for i, r in enumerate(range(rows.start, rows.stop)):
            n = len(prompts[r])
            toks[r, width - n :] = prompts[r]
            hids[r, width - n + 1 :] = xn[i, xn.shape[1] - n : -1]  # g_0 .. g_{n-2}
            valid[r, width - n + 1 :] = True
            last[r] = xn[i, -1]
    return toks, hids, valid, last
