"""Draft models for the ``draft`` and ``card`` drafters, built from the drafting context.

``build_draft_lm(ctx, path=None, layers=...)`` gives a ``core.draft_lm.DraftLM``:

- ``path`` None: the target's own first ``layers`` blocks plus its final norm and head
  (early exit; no weights copied, a KV cache of its own);
- ``path`` a local HF directory or ``.gguf`` file (converted once, like ``--model``): that
  model, which must have the target's tokenizer (else a one-line error naming how they
  differ) and a llama-family architecture.

``head`` > 0 drafts from the first ``head`` vocabulary ids only (a view of the head's
rows, no copy): BPE ids are roughly in merge order, so the low ids are the frequent
tokens, and the head is most of a small draft model's cost.

Each drafter gets its own draft model object (its own KV cache); early exit shares the
target's weights, a checkpoint is read once per drafter built.

Example::

    model = draftwise.load()
    lm = build_draft_lm(model.drafting, layers=8)
    d = DraftModelDrafter(lm, beam=4, topk=4, depth=5)
    d = model.drafter("card:layers=8")           # the same through the registry
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from draftwise.core.draft_lm import DraftLM
from draftwise.core.drafters.base import Drafter
from draftwise.core.drafters.card import CardDrafter
from draftwise.core.drafters.draft_model import DraftModelDrafter
from draftwise.drafting.context import DraftingContext
from draftwise.errors import DraftwiseError
from draftwise.models.resolve import check_architecture, read_config, resolve_model
from draftwise.models.tokenizer import Tokenizer
from draftwise.models.tokenizer_match import check_same_tokenizer

SCRATCH = 512  # tree rows the draft cache holds beyond the target's context


def build_draft_lm(
    ctx: DraftingContext,
    path: str | os.PathLike[str] | None = None,
    layers: int = 8,
    head: int = 0,
) -> DraftLM:
    """The draft model for the context's target; see the module docstring."""
    be = ctx.backend
    if be is None or ctx.assets is None:
        raise DraftwiseError("a draft model needs a loaded target: use model.drafter('draft')")
    draft_dir = None
    if path is not None:
        draft_dir = resolve_model(path)
        check_architecture(read_config(draft_dir), {"llama", "mistral", "qwen2"})
        target_tok = Tokenizer.from_dir(ctx.assets.model_dir)
        check_same_tokenizer(target_tok, Tokenizer.from_dir(draft_dir), os.fspath(path))
    limit = be.context_limit + SCRATCH
    if be.name.startswith("mlx"):
        if head:
            raise DraftwiseError("a cut draft head (head=N) is torch-only so far; drop head=")
        return _mlx_draft(ctx, draft_dir, layers, limit)
    from draftwise.backends.cuda.backend import TorchBackend

    if not isinstance(be, TorchBackend):
        raise DraftwiseError(f"backend {be.name!r} cannot run a draft model")
    from draftwise.backends.cuda.draft import TorchDraftLM, early_exit, load_draft_model

    if draft_dir is None:
        llama = early_exit(be.model, layers, limit, head)
    else:
        llama = load_draft_model(draft_dir, be.dtype, be.device, limit)
        if head:
            llama.lm_head = llama.lm_head[:head]
    return TorchDraftLM(llama, be.vocab_size)


def _mlx_draft(ctx: DraftingContext, draft_dir: Path | None, layers: int, limit: int) -> DraftLM:
    from draftwise.backends.mlx.backend import MLXBackend  # type: ignore[import-not-found]
    from draftwise.backends.mlx.draft import MLXDraftLM, early_exit  # type: ignore[import-not-found]
    from draftwise.backends.mlx.llama import Llama  # type: ignore[import-not-found]
    from draftwise.backends.mlx.load import load_module  # type: ignore[import-not-found]

    be = ctx.backend
    assert isinstance(be, MLXBackend)  # by its name
    if draft_dir is None:
        return MLXDraftLM(early_exit(be.model, layers, limit), be.vocab_size)  # type: ignore[no-any-return]
    module, cfg = load_module(draft_dir, be.dtype)
    return MLXDraftLM(Llama(module, cfg, limit), be.vocab_size)  # type: ignore[no-any-return]


def _lm(ctx: DraftingContext, opts: dict[str, Any]) -> DraftLM:
    lm = opts.pop("lm", None)
    path, layers, head = opts.pop("model", None), opts.pop("layers", 8), opts.pop("head", 0)
    return lm if lm is not None else build_draft_lm(ctx, path, layers, head)


def build_draft(ctx: DraftingContext, opts: dict[str, Any]) -> Drafter:
    """``draft``: sequential drafting with a draft model (chain when beam=topk=1)."""
    return DraftModelDrafter(_lm(ctx, opts), **opts)


def build_card(ctx: DraftingContext, opts: dict[str, Any]) -> Drafter:
    """``card``: the draft model in a worker thread (torch): ``threads`` torch CPU threads
    there, and on CUDA a stream of its own (torch's current stream is per thread), so its
    forwards overlap the target's instead of queueing behind them (untested on a GPU)."""
    if ctx.backend is not None and ctx.backend.name.startswith("mlx"):
        raise DraftwiseError("card runs on the torch backend so far (on MLX use 'draft')")
    threads = opts.pop("threads", 1)
    lm = _lm(ctx, opts)
    cuda = ctx.backend is not None and ctx.backend.name.startswith("torch-cuda")

    def thread_init() -> None:
        import torch

        torch.set_num_threads(threads)  # per thread: the target keeps its own count
        if cuda:
            torch.cuda.set_stream(torch.cuda.Stream())

    return CardDrafter(lm, thread_init=thread_init, **opts)
