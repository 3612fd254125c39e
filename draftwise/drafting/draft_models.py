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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftwise.core.draft_lm import DraftLM
from draftwise.core.drafters.base import Drafter
from draftwise.core.drafters.card import CardDrafter
from draftwise.core.drafters.draft_model import DraftModelDrafter
from draftwise.core.draftplan import DraftPlanner
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
    from draftwise.backends.cuda.draft import TorchDraftLM, cut_head, early_exit, load_draft_model

    if draft_dir is None:
        llama = early_exit(be.model, layers, limit, head)
    else:
        llama = load_draft_model(draft_dir, be.dtype, be.device, limit)
        if head:
            llama.head_q = cut_head(llama, head)  # the cut head drafts
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


def _lm(ctx: DraftingContext, opts: dict[str, Any], parallel: bool) -> DraftLM:
    """The draft model, and with ``auto=true`` the planner (put in ``opts``) sizing its
    trees from the target's verify curve and the draft's forward curve."""
    lm = opts.pop("lm", None)
    path, layers, head = opts.pop("model", None), opts.pop("layers", 8), opts.pop("head", 0)
    lm = lm if lm is not None else build_draft_lm(ctx, path, layers, head)
    if opts.pop("auto", False):
        if ctx.assets is None:
            raise DraftwiseError("auto=true needs a loaded target: use model.drafter(...)")
        key = f"{path or 'early-exit'}|layers={layers}|head={head}|{lm.name}"
        draft_cost = ctx.assets.draft_cost_profile(lm, key)  # type: ignore[arg-type]
        opts["planner"] = DraftPlanner(
            ctx.assets.cost_profile(), draft_cost, opts.get("beam", 4), opts.get("topk", 4),
            opts.get("depth", 5), parallel=parallel,
        )
    return lm


def build_draft(ctx: DraftingContext, opts: dict[str, Any]) -> Drafter:
    """``draft``: sequential drafting with a draft model (chain when beam=topk=1)."""
    return DraftModelDrafter(_lm(ctx, opts, parallel=False), **opts)


def build_card(ctx: DraftingContext, opts: dict[str, Any]) -> Drafter:
    """``card``: the draft model in a worker thread with a compute stream of its own, so
    its forwards overlap the target's instead of queueing behind them: torch with
    ``threads`` CPU threads there (on CUDA its own stream, ``backends/cuda/gpu/streams.py``),
    MLX on a new CPU stream made in that thread (the target keeps its own stream).
    ``card.layout`` says which, in words, for the bench record."""
    threads = opts.pop("threads", 1)
    lm = _lm(ctx, opts, parallel=True)
    be = ctx.backend
    init: Callable[[], None] | None = None
    layout = "draft worker: own thread"  # a backend without streams or threads (tests)
    if be is not None and be.name.startswith("mlx"):
        init, layout = _mlx_worker(lm), "draft worker: own thread, own mlx cpu stream"
    elif be is not None and be.name.startswith("torch"):
        init, layout = torch_worker(threads, getattr(be, "device", None))
    card = CardDrafter(lm, thread_init=init, **opts)
    card.layout = layout
    return card


def _mlx_worker(lm: DraftLM) -> Callable[[], None]:
    from draftwise.backends.mlx.draft import enter_worker_stream  # type: ignore[import-not-found]

    def init() -> None:
        enter_worker_stream(lm)

    return init


def torch_worker(threads: int, device: Any = None) -> tuple[Callable[[], None], str]:
    """CARD's worker start on torch (``threads`` CPU threads, its own stream on CUDA)
    and the layout in words. The same code runs on CPU, where the stream is a no-op.

    Example: ``init, layout = torch_worker(1, torch.device("cpu"))``; ``layout`` is
    ``'draft worker: own thread, torch 1 thread(s), cpu (no stream)'``."""
    import torch

    from draftwise.backends.cuda.gpu.streams import WorkerStream

    # Made here, in the target's thread: on CUDA it records the target's stream.
    ws = WorkerStream(device if device is not None else torch.device("cpu"))

    def init() -> None:
        torch.set_num_threads(threads)  # per thread: the target keeps its own count
        ws.enter()

    init.worker_stream = ws  # type: ignore[attr-defined]  # for tests
    return init, f"draft worker: own thread, torch {threads} thread(s), {ws.describe()}"
