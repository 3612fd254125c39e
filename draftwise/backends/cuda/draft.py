"""``TorchDraftLM``: the draft-model tensor step (``core.draft_lm.DraftLM``) on torch.

A draft model here is a ``Llama`` with its own KV cache: either another checkpoint with
the target's tokenizer (``--draft-model PATH``), or the target's own first ``L`` layers
plus its final norm and head (``early_exit``: training-free, no weights copied). The
cache holds the context, then one *scratch* slot per tree row computed (written by slot
index as in the target; rejected rows are dropped by ``keep``, a single gather).

Example::

    target = TorchBackend.from_pretrained(model_dir)
    lm = TorchDraftLM(early_exit(target.model, 4, target.context_limit + 512))
    drafter = DraftModelDrafter(lm, beam=4, topk=4, depth=5)
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import torch

from draftwise.backends.cuda.backend import TorchBackend, weights_mode
from draftwise.backends.cuda.cpu.f32 import F32Weight
from draftwise.backends.cuda.llama import Llama, read_llama_config, read_weights, rope_tables
from draftwise.core.draft_lm import ScratchSlots
from draftwise.errors import DraftwiseError

DEFAULT_SCRATCH = 512  # tree rows the draft cache holds beyond the context


def early_exit(model: Llama, n_layers: int, max_cache_len: int, head: int = 0) -> Llama:
    """The first ``n_layers`` blocks of ``model`` with its final norm and head, sharing
    its weight tensors (no copy), with a KV cache of its own for ``max_cache_len``
    positions. ``head`` > 0 keeps only the head's first ``head`` rows (a view): the
    draft then proposes only ids below ``head``."""
    if not 1 <= n_layers <= model.cfg.n_layers:
        raise DraftwiseError(
            f"draft layers must be in 1..{model.cfg.n_layers} for this model, got {n_layers}"
        )
    cfg = dataclasses.replace(model.cfg, n_layers=n_layers)
    out = copy.copy(model)  # shallow: embed, layers, norm and head are the same tensors
    out.cfg = cfg
    out.layers = model.layers[:n_layers]
    if head:
        if not 1 <= head <= model.lm_head.shape[0]:
            raise DraftwiseError(f"draft head must be in 1..{model.lm_head.shape[0]}, got {head}")
        out.lm_head = model.lm_head[:head]  # (head, C) view: no copy
        out.head_q = cut_head(model, head)
    out.max_cache_len = max_cache_len
    if max_cache_len > model.max_cache_len:
        out.cos, out.sin = rope_tables(cfg, max_cache_len, model.dtype, model.device)
    out.cache = torch.zeros(
        (n_layers, 2, cfg.n_kv_heads, max_cache_len, cfg.head_dim),
        dtype=model.cache_dtype,
        device=model.device,
    )  # (L, 2, H_kv, T_max, D)
    return out


def cut_head(model: Llama, head: int) -> F32Weight | None:
    """The packed head a draft cut to ``head`` rows computes with: the float32 kernel's
    first tiles (no copy) where the model has one (``f32.py``), else None (the dense rows;
    a 4-bit head is not cut: drafts, not output)."""
    return model.head_q.rows(head) if isinstance(model.head_q, F32Weight) else None


def load_draft_model(model_dir: str | Path, dtype: str, device: torch.device,
                     max_cache_len: int) -> Llama:
    """Another checkpoint as a draft model (its tokenizer is checked by the caller), in
    the target's ``dtype`` (``4bit``: its GGUF's codes, or rounded ones)."""
    cfg = read_llama_config(model_dir)
    limit = min(cfg.max_positions, max_cache_len)
    compute, q4 = weights_mode(Path(model_dir), dtype, device)
    return Llama(cfg, read_weights(Path(model_dir)), compute, device, limit, q4=q4)


class TorchDraftLM(ScratchSlots, TorchBackend):
    """A draft ``Llama`` and its cache: context slots, then scratch tree rows.

    Reuses the target backend's prefill and bookkeeping; adds ``expand`` (the scratch
    count and ``keep``: ``core.draft_lm.ScratchSlots``).
    ``vocab_limit`` caps proposed ids at the target's vocabulary (same tokenizer, but a
    checkpoint may pad its embedding to another size).
    """

    def __init__(self, model: Llama, vocab_limit: int | None = None) -> None:
        super().__init__(model, model.max_cache_len, invariant=False)
        rows = int(model.lm_head.shape[0])  # fewer than the vocabulary with a cut head
        self.vocab_size = min(model.cfg.vocab_size, vocab_limit or rows, rows)
        self.name = f"draft-{self.name}-{model.cfg.n_layers}layers"
        self._scratch = 0

    def _check_ids(self, ids: np.ndarray) -> None:
        # Inputs may be any id of the embedding; only proposals are capped at vocab_size.
        rows = int(self.model.embed.shape[0])
        if ids.size and (ids.min() < 0 or ids.max() >= rows):
            bad = ids[(ids < 0) | (ids >= rows)][0]
            raise DraftwiseError(f"token id {bad} outside the draft model's vocabulary ({rows})")

    def expand(
        self, tokens: np.ndarray, depths: np.ndarray, mask: np.ndarray, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        r, s0 = self.scratch_rows(tokens, mask)
        start, n = self._len + s0, self._len
        host = np.empty((r, 2 + s0 + r), np.int64)  # tokens, positions, scratch mask
        host[:, 0] = tokens
        self._check_ids(host[:, 0])
        host[:, 1] = n + np.asarray(depths, np.int64)
        host[:, 2:] = mask
        with torch.inference_mode():
            dev = torch.from_numpy(host).to(self.device)  # (R, 2 + S + R)
            full = None
            if r > 1 or s0 > 0:
                full = torch.cat(
                    [self._ones[:, :n].expand(r, n), dev[:, 2:].bool()], dim=1
                )  # (R, n + S + R)
            logits = self.model.forward(dev[:, 0], dev[:, 1], start, full, need_logits=True)
            assert logits is not None
            logp = torch.log_softmax(logits[:, : self.vocab_size].float(), dim=-1)  # (R, V)
            vals, ids = logp.topk(k, dim=-1)  # (R, k) each, best first
            self._scratch += r
            return ids.cpu().numpy().astype(np.int64), vals.cpu().numpy()

    def _move_slots(self, src: np.ndarray, dst: int) -> None:
        with torch.inference_mode():
            self.model.move_slots(torch.from_numpy(src).to(self.device), dst)  # (K,)
