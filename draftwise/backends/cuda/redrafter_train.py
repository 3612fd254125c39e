"""Training a ReDrafter network on distillation shards (``redrafter_data.py``).

Teacher forcing as in seed 001: a sample is a position ``j`` of a target's greedy
continuation; the network starts from the hidden state ``hidden[j]``, takes the root
``tokens[j]`` and the next ``T - 1`` true tokens as inputs and is scored on predicting
``tokens[j+1 .. j+T]`` (cross-entropy over the draft vocabulary, summed over the ``T``
positions; a label outside the draft vocabulary, or past the end of a continuation,
counts nothing). AdamW with a cosine learning rate. Every ``ckpt_every`` steps and at
the end the network (``save_redrafter``) and the optimizer state are written atomically;
a second run with the same output directory resumes from there.

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

from draftwise.backends.cuda.redrafter import ReDrafterNet
from draftwise.backends.cuda.redrafter_io import atomic_write, save_redrafter

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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs (B, T), hidden (B, C) and labels (B, T) (draft-vocabulary columns); the
    labels are ``target`` (N, L) (the target's argmax on teacher-forced data) where given,
    else the next tokens."""
    rows, pos = idx[:, 0], idx[:, 1]  # (B,), (B,)
    length = tokens.shape[1]
    offs = torch.arange(t + 1)  # (T+1,)
    at = (pos[:, None] + offs[None]).clamp(max=length - 1)  # (B, T+1)
    seq = tokens[rows[:, None], at]  # (B, T+1)
    ok = valid[rows[:, None], at] & (pos[:, None] + offs[None] < length)  # (B, T+1)
    want = seq if target is None else target[rows[:, None], at]  # (B, T+1)
    labels = col[want[:, 1:]]  # (B, T)
    labels = torch.where(ok[:, 1:], labels, torch.full_like(labels, IGNORE))
    return seq[:, :t], hidden[rows, pos].float(), labels


def loss_of(
    net: ReDrafterNet, inputs: torch.Tensor, h: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """Cross-entropy summed over the T positions, averaged over the batch."""
    logits = net.unroll(h, inputs)  # (B, T, K)
    ce = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=IGNORE, reduction="sum")
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
) -> list[float]:
    """Train ``net`` in place (resuming from ``out`` when a state is there); returns the
    loss of every step run. ``labels`` (N, L): the target's argmax on teacher-forced
    rows (``redrafter_data.write_forced_shards``); None for greedy continuations."""
    tk = torch.from_numpy(tokens.astype(np.int64))  # (N, L)
    hd = torch.from_numpy(hidden)  # (N, L, C) float16
    vd = torch.from_numpy(valid)  # (N, L)
    lb = None if labels is None else torch.from_numpy(labels.astype(np.int64))  # (N, L)
    col = torch.full((net.cfg.vocab_size,), IGNORE, dtype=torch.long)  # (V,)
    col[net.vocab_ids] = torch.arange(net.cfg.draft_vocab)
    root_ok = None if labels is None else tokens == labels
    idx = torch.from_numpy(samples(valid, s.t, root_ok))  # (S, 2)
    per_epoch = max(1, idx.shape[0] // s.batch)
    total = max(1, int(per_epoch * s.epochs))
    opt = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=s.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: 0.5 * (1 + math.cos(math.pi * min(i, total) / total))
    )
    step = 0
    state_path = out / STATE
    if state_path.is_file():
        st = torch.load(state_path, weights_only=False)
        net.load_state_dict(st["net"], strict=False)
        opt.load_state_dict(st["opt"])
        sched.load_state_dict(st["sched"])
        step = int(st["step"])
    losses: list[float] = []
    net.train()
    while step < total:
        epoch, i = divmod(step, per_epoch)
        perm = torch.randperm(idx.shape[0], generator=torch.Generator().manual_seed(s.seed + epoch))
        sel = idx[perm[i * s.batch : (i + 1) * s.batch]]
        inputs, h, want = _batch(net, tk, hd, vd, col, sel, s.t, lb)
        loss = loss_of(net, inputs, h, want)
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
) -> np.ndarray:
    """(T,) share of samples whose first k greedy (teacher-forced) guesses are all right,
    k = 1..T; ``1 + sum`` estimates the tokens per step of a bw=1 chain of length T.
    ``labels``: the target's argmax on teacher-forced rows (as in ``train``)."""
    tk, hd, vd = (
        torch.from_numpy(tokens.astype(np.int64)),
        torch.from_numpy(hidden),
        torch.from_numpy(valid),
    )
    lb = None if labels is None else torch.from_numpy(labels.astype(np.int64))
    col = torch.full((net.cfg.vocab_size,), IGNORE, dtype=torch.long)
    col[net.vocab_ids] = torch.arange(net.cfg.draft_vocab)
    idx = torch.from_numpy(samples(valid, t, None if labels is None else tokens == labels))
    idx = idx[torch.randperm(idx.shape[0], generator=torch.Generator().manual_seed(1))[:n]]
    inputs, h, want = _batch(net, tk, hd, vd, col, idx, t, lb)
    right = net.unroll(h, inputs).argmax(-1) == want  # (B, T)
    return right.cumprod(dim=1).float().mean(0).numpy()
