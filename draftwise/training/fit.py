"""Training a ReDrafter network on distillation shards (``redrafter_data.py``).

Teacher forcing as in seed 001: a sample is a position ``j`` of a target's greedy
continuation; the network starts from the hidden state ``hidden[j]``, takes the root
``tokens[j]`` and the next ``T - 1`` true tokens as inputs and is scored on predicting
``tokens[j+1 .. j+T]`` (cross-entropy over the draft vocabulary, summed over the ``T``
positions; a label outside the draft vocabulary, or past the end of a continuation,
counts nothing). A context network (``cfg.context_dim > 0``) trains on whole rows
instead: ``context_rows`` rows a step, ``batch // context_rows`` roots each, every root
attending over its row's entries before it (the prompt's, when given, then the
continuation's): ``context_loss``. AdamW with a cosine learning rate. Every
``ckpt_every`` steps and at the end the network (``save_redrafter``) and the optimizer
state are written atomically; a second run with the same output directory resumes from
there.

Example::

    vocab, cover = choose_vocab(tokens, valid, k=4096)
    net = ReDrafterNet(cfg, embed, torch.from_numpy(vocab))
    train(net, tokens, hidden, valid, out_dir, TrainSettings(epochs=2))
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from draftwise.backends.cuda.redrafter.checkpoint import atomic_write, save_redrafter
from draftwise.backends.cuda.redrafter.net import ReDrafterNet
from draftwise.errors import DraftwiseError

STATE = "train_state.pt"
IGNORE = -100


@dataclass(frozen=True)
class TrainSettings:
    t: int = 5  # predicted positions per sample
    epochs: float = 2.0
    lr: float = 1e-3
    batch: int = 256
    ckpt_every: int = 100
    seed: int = 0
    context_rows: int = 16  # context networks: rows per step (batch // rows positions each)
    soft_weight: float = 0.0  # weight of the target's own distribution (``soft_term``)
    soft_temp: float = 1.0  # that distribution's temperature
    device: str = "cpu"  # where the network and the data live while training ("cuda": a GPU)


def choose_vocab(
    tokens: np.ndarray, valid: np.ndarray, k: int, vocab_size: int | None = None
) -> tuple[np.ndarray, float]:
    """The ``k`` most frequent ids of the target's outputs, filled up (when fewer ids
    occur) with the lowest ids (BPE merge order: roughly by frequency), sorted by id; and
    the share of the output tokens they cover. Measured on SmolLM2-135M outputs: the
    fill adds about half a point of held-out coverage at k = 4096."""
    v = vocab_size if vocab_size is not None else int(tokens.max()) + 1
    counts = np.bincount(tokens[valid].astype(np.int64), minlength=v)[:v]
    score = counts.astype(np.float64) * v - np.arange(v)  # by count, then by low id
    top = np.argsort(-score, kind="stable")[: min(k, v)]
    return np.sort(top), float(counts[top].sum() / max(counts.sum(), 1))


def samples(valid: np.ndarray, t: int, root_ok: np.ndarray | None = None) -> np.ndarray:
    """(S, 2) (row, position) of every sample whose root is a valid token (and, for
    teacher-forced data, the target's own argmax: ``root_ok``, (N, L) bool)."""
    n, length = valid.shape
    ok = valid if root_ok is None else valid & root_ok
    rows, pos = np.nonzero(ok[:, : max(length - 1, 0)])
    return np.stack([rows, pos], axis=1)


def _batch(
    net: ReDrafterNet,
    tokens: torch.Tensor,
    hidden: torch.Tensor,
    valid: torch.Tensor,
    col: torch.Tensor,
    idx: torch.Tensor,
    t: int,
    target: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs (B, T), hidden (B, C), labels (B, T) (draft-vocabulary columns) and the
    hidden states that predicted the labels (B, T, C) (``soft_term``); the labels are
    ``target`` (N, L) (the target's argmax on teacher-forced data) where given, else the
    next tokens."""
    rows, pos = idx[:, 0], idx[:, 1]  # (B,), (B,)
    length = tokens.shape[1]
    offs = torch.arange(t + 1, device=tokens.device)  # (T+1,)
    at = (pos[:, None] + offs[None]).clamp(max=length - 1)  # (B, T+1)
    seq = tokens[rows[:, None], at]  # (B, T+1)
    ok = valid[rows[:, None], at] & (pos[:, None] + offs[None] < length)  # (B, T+1)
    want = seq if target is None else target[rows[:, None], at]  # (B, T+1)
    labels = col[want[:, 1:]]  # (B, T)
    labels = torch.where(ok[:, 1:], labels, torch.full_like(labels, IGNORE))
    return seq[:, :t], hidden[rows, pos].float(), labels, hidden[rows[:, None], at[:, 1:]]


@dataclass(frozen=True)
class Soft:
    """The target's own distribution as a second training signal (``soft_term``):
    ``head`` (K, C) its output rows of the draft vocabulary, ``weight`` the term's weight,
    ``temp`` the distribution's temperature."""

    head: torch.Tensor
    weight: float
    temp: float = 1.0


def soft_term(
    logp: torch.Tensor, hs: torch.Tensor, labels: torch.Tensor, soft: Soft
) -> torch.Tensor:
    """Cross-entropy of the drafter's log-probs ``logp`` (..., K) against the target's own
    next-token distribution over the draft vocabulary, ``softmax(hs @ head.T / temp)``
    (``hs`` (..., C): the final-norm hidden states that predicted the labels; the target's
    logits of the draft vocabulary, renormalised over it), summed over the predictions
    with a label (``labels != IGNORE``). The greedy label says which token the target
    picked; this says how it weighed the others (knowledge distillation), which a
    network of a few million parameters learns from more per sample.

    Example: a drafter whose log-probs are the target's own renormalised ones scores the
    entropy of that distribution, the least any drafter can::

        >>> head = torch.eye(3); hs = torch.tensor([[2.0, 0.0, 0.0]])
        >>> p = torch.softmax(hs @ head.T, -1)
        >>> bool(torch.isclose(soft_term(p.log(), hs, torch.tensor([0]), Soft(head, 1.0)),
        ...                    -(p * p.log()).sum()))
        True
    """
    with torch.no_grad():
        p = torch.softmax((hs.float() @ soft.head.T) / soft.temp, dim=-1)  # (..., K)
    ce = -(p * logp).sum(-1)  # (...)
    return ce[labels != IGNORE].sum()


def loss_of(
    net: ReDrafterNet,
    inputs: torch.Tensor,
    h: torch.Tensor,
    labels: torch.Tensor,
    hs: torch.Tensor | None = None,
    soft: Soft | None = None,
) -> torch.Tensor:
    """Cross-entropy summed over the T positions, averaged over the batch; with ``soft``
    (and ``hs`` (B, T, C)), plus ``soft.weight`` x ``soft_term``."""
    logits = net.unroll(h, inputs)  # (B, T, K)
    ce = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=IGNORE, reduction="sum")
    if soft is not None and soft.weight > 0:
        assert hs is not None
        ce = ce + soft.weight * soft_term(logits.log_softmax(-1), hs, labels, soft)
    return ce / inputs.shape[0]


def train(
    net: ReDrafterNet,
    tokens: np.ndarray,
    hidden: np.ndarray,
    valid: np.ndarray,
    out: Path,
    s: TrainSettings,
    progress: Callable[[int, int, float], None] | None = None,
    labels: np.ndarray | None = None,
    prompt: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    head: torch.Tensor | None = None,
) -> list[float]:
    """Train ``net`` in place (resuming from ``out`` when a state is there); returns the
    loss of every step run. ``labels`` (N, L): the target's argmax on teacher-forced
    rows (``redrafter_data.write_forced_shards``); None for greedy continuations.
    ``prompt``: the rows' prompt tokens, hidden states and valid (N, W)
    (``batch_greedy.prompt_states``), the context a context network also attends over.
    ``head`` (K, C): the target's output rows of the draft vocabulary, needed when
    ``s.soft_weight > 0`` (``soft_term``)."""
    soft = None
    if s.soft_weight > 0:
        k, c = net.cfg.draft_vocab, net.cfg.hidden
        if head is None or tuple(head.shape) != (k, c):
            got = None if head is None else tuple(head.shape)
            raise DraftwiseError(
                f"soft_weight > 0 needs the target's head rows ({k}, {c}), got {got}"
            )
        soft = Soft(head.float().to(s.device), s.soft_weight, s.soft_temp)
    dev = torch.device(s.device)
    net.to(dev)
    vd_roots = torch.from_numpy(valid)  # (N, L): the roots are continuation positions
    offset = 0
    if net.cfg.context_dim and prompt is not None:
        tokens, hidden, valid = _with_prompt(tokens, hidden, valid, prompt)
        offset = prompt[0].shape[1]
    tk = torch.from_numpy(tokens.astype(np.int64)).to(dev)  # (N, W + L)
    hd = torch.from_numpy(hidden).to(dev)  # (N, W + L, C) float16
    vd = torch.from_numpy(valid).to(dev)  # (N, W + L)
    lb = None if labels is None else torch.from_numpy(labels.astype(np.int64)).to(dev)  # (N, L)
    col = torch.full((net.cfg.vocab_size,), IGNORE, dtype=torch.long, device=dev)  # (V,)
    col[net.vocab_ids] = torch.arange(net.cfg.draft_vocab, device=dev)
    root_ok = None if labels is None else tokens == labels
    if net.cfg.context_dim and labels is not None:
        raise DraftwiseError("a context drafter trains on greedy continuations only")
    idx = torch.from_numpy(samples(vd_roots.numpy(), s.t, root_ok))  # (S, 2)
    per_epoch = max(1, idx.shape[0] // s.batch)
    total = max(1, int(per_epoch * s.epochs))
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=s.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: 0.5 * (1 + math.cos(math.pi * min(i, total) / total))
    )
    step = 0
    state_path = out / STATE
    if state_path.is_file():
        st = torch.load(state_path, weights_only=False, map_location=dev)
        net.load_state_dict(st["net"], strict=False)
        opt.load_state_dict(st["opt"])
        sched.load_state_dict(st["sched"])
        step = int(st["step"])
    losses: list[float] = []
    net.train()
    while step < total:
        epoch, i = divmod(step, per_epoch)
        if net.cfg.context_dim:
            rows, pos = _context_rows(vd_roots, s, step)
            rows, pos = rows.to(dev), pos.to(dev) + offset
            loss = context_loss(net, *_context_batch(net, tk, hd, vd, rows, pos, s.t), soft=soft)
        else:
            perm = torch.randperm(
                idx.shape[0], generator=torch.Generator().manual_seed(s.seed + epoch)
            )
            sel = idx[perm[i * s.batch : (i + 1) * s.batch]].to(dev)
            inputs, h, want, hs = _batch(net, tk, hd, vd, col, sel, s.t, lb)
            loss = loss_of(net, inputs, h, want, hs, soft)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        losses.append(float(loss.detach()))
        if progress is not None:
            progress(step, total, losses[-1])
        if step % s.ckpt_every == 0 or step == total:
            _checkpoint(net, opt, sched, step, out)
    net.eval()
    return losses


def _with_prompt(
    tokens: np.ndarray,
    hidden: np.ndarray,
    valid: np.ndarray,
    prompt: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of prompt then continuation, (N, W + L): one context in the shards' layout
    (``hidden[j]`` predicted ``tokens[j]``; the continuation's first state is the
    prompt's last)."""
    ptok, phid, pval = prompt
    if ptok.shape[0] != tokens.shape[0]:
        raise DraftwiseError(f"{ptok.shape[0]} prompt rows for {tokens.shape[0]} continuations")
    return (
        np.concatenate([ptok.astype(tokens.dtype), tokens], axis=1),
        np.concatenate([phid, hidden], axis=1),
        np.concatenate([pval, valid], axis=1),
    )


def _context_rows(
    vd: torch.Tensor, s: TrainSettings, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s rows (R,) and root positions (R, Q): ``context_rows`` rows with a
    root, each with ``batch // context_rows`` positions drawn uniformly (with
    replacement) among its roots; seeded by the step, so a resumed run draws the same."""
    roots = vd[:, :-1].sum(1)  # (N,) valid is a prefix of each row
    usable = torch.nonzero(roots > 0).flatten()  # (N',)
    g = torch.Generator().manual_seed(s.seed * 1_000_003 + step)
    r = min(s.context_rows, int(usable.numel()))
    rows = usable[torch.randperm(usable.numel(), generator=g)[:r]]  # (R,)
    q = max(1, s.batch // r)
    pos = (torch.rand(r, q, generator=g) * roots[rows, None]).long()  # (R, Q)
    return rows, pos


def _context_batch(
    net: ReDrafterNet,
    tk: torch.Tensor,
    hd: torch.Tensor,
    vd: torch.Tensor,
    rows: torch.Tensor,
    pos: torch.Tensor,
    t: int,
) -> tuple[torch.Tensor, ...]:
    """Rows (R,) and roots (R, Q) -> inputs (R, Q, T), h (R, Q, C), labels (R, Q, T), the
    rows' context: keys, values (R, L, D), columns (R, L), visibility (R, Q, L), and the
    states that predicted the labels (R, Q, T, C) (``soft_term``).
    ``hidden[j]`` predicted ``tokens[j]``, so entry ``j`` (``context_entries``) is
    ``(hidden[j], tokens[j], tokens[j+1], hidden[j+1])``; a root at ``pos`` sees the
    entries before it (``j < pos``: ``tokens[pos]`` is the last one's next token)."""
    tok, hid, val = tk[rows], hd[rows].float(), vd[rows]  # (R, L), (R, L, C), (R, L)
    r, length = tok.shape
    nxt = torch.cat([tok[:, 1:], tok[:, -1:]], dim=1)  # (R, L)
    g = torch.cat([hid[:, 1:], hid[:, -1:]], dim=1)  # (R, L, C)
    keys, values, cols = net.context_entries(hid, tok, nxt, g)
    # an entry needs its token, its hidden state and the next token (the prompt's first
    # token has no hidden state: not valid)
    dev = tok.device
    has_next = val & torch.cat([val[:, 1:], torch.zeros(r, 1, dtype=torch.bool, device=dev)], dim=1)
    j = torch.arange(length, device=dev)
    ok = (j[None, None, :] < pos[:, :, None]) & has_next[:, None, :]  # (R, Q, L)
    offs = torch.arange(t + 1, device=dev)  # (T+1,)
    at = pos[:, :, None] + offs  # (R, Q, T+1)
    inside = at < length
    at = at.clamp(max=length - 1)
    ri = torch.arange(r, device=dev)[:, None, None]
    seq = tok[ri, at]  # (R, Q, T+1)
    good = val[ri, at] & inside  # (R, Q, T+1)
    lab = net.col[seq[..., 1:]]  # (R, Q, T)
    lab = torch.where(good[..., 1:] & (lab >= 0), lab, torch.full_like(lab, IGNORE))
    h = hid[ri[..., 0], pos]  # (R, Q, C)
    hs = hid[ri, at[..., 1:]]  # (R, Q, T, C): the states that predicted the labels
    return seq[..., :t], h, lab, keys, values, cols, ok, hs


def context_unroll(
    net: ReDrafterNet,
    inputs: torch.Tensor,
    h: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    cols: torch.Tensor,
    ok: torch.Tensor,
) -> torch.Tensor:
    """Teacher-forced forward of a context network -> (R, Q, T, K) log-probs."""
    s = net.zero_state(inputs.shape[0] * inputs.shape[1]).view(*inputs.shape[:2], -1)
    out = []
    for i in range(inputs.shape[2]):
        s = net.cell(inputs[..., i], s)  # (R, Q, C)
        out.append(net.context_logp(h, s, inputs[..., i], keys, values, cols, ok))
    return torch.stack(out, dim=2)  # (R, Q, T, K)


def context_loss(
    net: ReDrafterNet,
    inputs: torch.Tensor,
    h: torch.Tensor,
    labels: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    cols: torch.Tensor,
    ok: torch.Tensor,
    hs: torch.Tensor | None = None,
    soft: Soft | None = None,
) -> torch.Tensor:
    """Negative log-likelihood summed over the T positions, averaged over the samples;
    with ``soft`` (and ``hs`` (R, Q, T, C)), plus ``soft.weight`` x ``soft_term``."""
    logp = context_unroll(net, inputs, h, keys, values, cols, ok)  # (R, Q, T, K)
    nll = F.nll_loss(
        logp.reshape(-1, logp.shape[-1]), labels.reshape(-1), ignore_index=IGNORE, reduction="sum"
    )
    if soft is not None and soft.weight > 0:
        assert hs is not None
        nll = nll + soft.weight * soft_term(logp, hs, labels, soft)
    return nll / (inputs.shape[0] * inputs.shape[1])


def _checkpoint(
    net: ReDrafterNet, opt: torch.optim.Optimizer, sched: object, step: int, out: Path
) -> None:
    save_redrafter(net, out)
    buf = io.BytesIO()
    torch.save(
        {
            "net": net.state_dict(),
            "opt": opt.state_dict(),
            "sched": sched.state_dict(),  # type: ignore[attr-defined]
            "step": step,
        },
        buf,
    )
    atomic_write(out / STATE, buf.getvalue())


@torch.inference_mode()
def chain_acceptance(
    net: ReDrafterNet,
    tokens: np.ndarray,
    hidden: np.ndarray,
    valid: np.ndarray,
    t: int,
    n: int = 4096,
    labels: np.ndarray | None = None,
    prompt: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """(T,) share of samples whose first k greedy (teacher-forced) guesses are all right,
    k = 1..T; ``1 + sum`` estimates the tokens per step of a bw=1 chain of length T.
    ``labels``: the target's argmax on teacher-forced rows; ``prompt``: the rows'
    prompts (as in ``train``)."""
    roots = valid
    offset = 0
    if net.cfg.context_dim and prompt is not None:
        tokens, hidden, valid = _with_prompt(tokens, hidden, valid, prompt)
        offset = prompt[0].shape[1]
    dev = net.embed.device  # the network's device: the rows go there
    tk, hd, vd = (
        torch.from_numpy(tokens.astype(np.int64)).to(dev),
        torch.from_numpy(hidden).to(dev),
        torch.from_numpy(valid).to(dev),
    )
    lb = None if labels is None else torch.from_numpy(labels.astype(np.int64)).to(dev)
    col = torch.full((net.cfg.vocab_size,), IGNORE, dtype=torch.long, device=dev)
    col[net.vocab_ids] = torch.arange(net.cfg.draft_vocab, device=dev)
    if net.cfg.context_dim:  # every root of the first rows holding about n of them
        rights = []
        for r0 in range(0, tk.shape[0], 8):
            rows = torch.arange(r0, min(r0 + 8, tk.shape[0]), device=dev)
            length = roots.shape[1]
            pos = offset + torch.arange(length - 1, device=dev).expand(rows.numel(), -1)  # (R, L-1)
            inputs, h, want, *ctx, _ = _context_batch(net, tk, hd, vd, rows, pos, t)
            right = context_unroll(net, inputs, h, *ctx).argmax(-1) == want  # (R, Q, T)
            rights.append(right[torch.from_numpy(roots[r0 : r0 + rows.numel(), :-1]).to(dev)])
            if sum(x.shape[0] for x in rights) >= n:
                break
        return torch.cat(rights).cumprod(dim=1).float().mean(0).cpu().numpy()
    idx = torch.from_numpy(samples(valid, t, None if labels is None else tokens == labels))
    idx = idx[torch.randperm(idx.shape[0], generator=torch.Generator().manual_seed(1))[:n]]
    inputs, h, want, _ = _batch(net, tk, hd, vd, col, idx.to(dev), t, lb)
    right = net.unroll(h, inputs).argmax(-1) == want  # (B, T)
    return right.cumprod(dim=1).float().mean(0).cpu().numpy()
