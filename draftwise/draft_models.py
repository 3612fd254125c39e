"""Draft models for the ``draft`` and ``card`` drafters: built from the loaded target.

``build_draft_lm(model, path=None, layers=...)`` gives a ``core.draft_lm.DraftLM``:

- ``path`` None: the target's own first ``layers`` blocks plus its final norm and head
  (early exit; no weights copied, a KV cache of its own);
- ``path`` a local HF directory or ``.gguf`` file (converted once, like ``--model``): that
  model, which must have the target's tokenizer (else a one-line error naming how they
  differ) and a llama-family architecture.

``head`` > 0 drafts from the first ``head`` vocabulary ids only (a view of the head's
rows, no copy): BPE ids are roughly in merge order, so the low ids are the frequent
tokens, and the head is most of a small draft model's cost.

Example::

    model = draftwise.load()
    lm = build_draft_lm(model, layers=8)
    d = DraftModelDrafter(lm, beam=4, topk=4, depth=5)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from draftwise.core.draft_lm import DraftLM
from draftwise.errors import DraftwiseError
from draftwise.models.resolve import check_architecture, read_config, resolve_model
from draftwise.models.tokenizer import Tokenizer
from draftwise.models.tokenizer_match import check_same_tokenizer

if TYPE_CHECKING:
    from draftwise.api import Model

SCRATCH = 512  # tree rows the draft cache holds beyond the target's context


def build_draft_lm(
    model: Model,
    path: str | os.PathLike[str] | None = None,
    layers: int = 8,
    head: int = 0,
) -> DraftLM:
    """The draft model for ``model``; see the module docstring."""
    draft_dir = None
    if path is not None:
        draft_dir = resolve_model(path)
        check_architecture(read_config(draft_dir), {"llama", "mistral", "qwen2"})
        check_same_tokenizer(model.tokenizer, Tokenizer.from_dir(draft_dir), os.fspath(path))
    be = model.backend
    limit = be.context_limit + SCRATCH
    if be.name.startswith("mlx"):
        if head:
            raise DraftwiseError("a cut draft head (head=N) is torch-only so far; drop head=")
        return _mlx_draft(model, draft_dir, layers, limit)
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


def _mlx_draft(model: Model, draft_dir: Path | None, layers: int, limit: int) -> DraftLM:
    from draftwise.backends.mlx.backend import MLXBackend  # type: ignore[import-not-found]
    from draftwise.backends.mlx.draft import MLXDraftLM, early_exit  # type: ignore[import-not-found]
    from draftwise.backends.mlx.llama import Llama  # type: ignore[import-not-found]
    from draftwise.backends.mlx.load import load_module  # type: ignore[import-not-found]

    be = model.backend
    assert isinstance(be, MLXBackend)  # by its name
    if draft_dir is None:
        return MLXDraftLM(early_exit(be.model, layers, limit), be.vocab_size)  # type: ignore[no-any-return]
    module, cfg = load_module(draft_dir, be.dtype)
    return MLXDraftLM(Llama(module, cfg, limit), be.vocab_size)  # type: ignore[no-any-return]
