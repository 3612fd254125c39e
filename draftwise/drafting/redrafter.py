"""The ``redrafter`` drafter built from the drafting context (its training is
``draftwise/training/recipe.py``).

The checkpoint is, in order: the ``path`` option; the one ``draftwise train-drafter``
left in this model's asset directory; the one shipped in ``draftwise/data/`` for the
default model. Each is refused (one line naming its path) when made for another
tokenizer or other weights.

Example::

    d = model.drafter("redrafter:bw=2,t=4")
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from draftwise.core.drafters.base import Drafter
from draftwise.core.drafters.redrafter import ReDrafter
from draftwise.drafting.context import DraftingContext
from draftwise.errors import DraftwiseError

SHIPPED = Path(__file__).resolve().parent.parent / "data" / "redrafter-smollm2-135m"


def checkpoint_for(ctx: DraftingContext, path: str | os.PathLike[str] | None) -> Path:
    """The checkpoint directory the ``redrafter`` drafter loads (see the module docstring)."""
    if path is not None:
        return Path(path)
    if ctx.assets is not None:
        own = ctx.assets.checkpoint_dir("redrafter")
        if (own / "config.json").is_file():
            return own
    return SHIPPED


def build_redrafter(ctx: DraftingContext, opts: dict[str, Any]) -> Drafter:
    """``redrafter``: the trained recurrent drafter on the target's device (``net``: a
    ``RecurrentNet`` given as an object instead)."""
    net_obj = opts.pop("net", None)
    extend = bool(opts.pop("extend", True))  # a backend step's option (context_vocab)
    if net_obj is not None:
        return ReDrafter(net_obj, **opts)
    be = ctx.backend
    if be is None:
        raise DraftwiseError("redrafter needs a loaded target: use model.drafter('redrafter')")
    ckpt = checkpoint_for(ctx, opts.pop("path", None))
    if be.name.startswith("mlx"):
        from draftwise.backends.mlx.redrafter.net import (  # type: ignore[import-not-found]
            MLXReDrafterNet,
        )
        from draftwise.backends.mlx.redrafter.step import (  # type: ignore[import-not-found]
            MLXRecurrentStep,
        )

        mnet = MLXReDrafterNet.load(ckpt, be, ctx.tokenizer_id)  # type: ignore[arg-type]
        return ReDrafter(MLXRecurrentStep(mnet, be, extend=extend), **opts)  # type: ignore[arg-type]
    import torch

    from draftwise.backends.cuda.backend import TorchBackend
    from draftwise.backends.cuda.redrafter.checkpoint import load_redrafter, weights_fingerprint
    from draftwise.backends.cuda.redrafter.step import TorchRecurrentStep, int8_supported

    if not isinstance(be, TorchBackend):
        raise DraftwiseError(f"backend {be.name!r} cannot run redrafter")
    embed = be.model.embed
    net = load_redrafter(ckpt, embed, ctx.tokenizer_id, weights_fingerprint(embed))
    if embed.dtype in (torch.bfloat16, torch.float16):
        net = net.to(embed.dtype)  # the target's dtype
    if embed.device.type == "cpu" and int8_supported():
        # int8 weights on bfloat16 activations, also beside a float32 target: a beam step
        # reads every weight once. With bf16 dot products a 1-row step took 0.8 ms in
        # bfloat16 and 0.3 ms in int8 (backends/cuda/redrafter/step.py); on an AVX2-only CPU (bf16
        # emulated) int8 still beats float32 (the 4096 x 576 head, 1 row: 0.30 against
        # 0.91 ms) and drafting at bw=1, t=3 fell from 11.3 to 6.9 ms a step. Drafts may
        # differ at near-ties; the output never does.
        net = net.to(torch.bfloat16)
        from draftwise.backends.cuda.redrafter.native import NativeRecurrentStep, native_supported

        if native_supported(net):  # the beam step in one compiled call (native.py)
            return ReDrafter(NativeRecurrentStep(net, be, extend=extend), **opts)
        step = TorchRecurrentStep(net, be, int8=True, extend=extend)
        return ReDrafter(step, **opts)
    return ReDrafter(TorchRecurrentStep(net, be, extend=extend), **opts)


# ``auto`` (the default) takes the member only where a plain step costs at least
# ``MEMBER_STEP_RATIO`` times the member's drafting at a 256-token context. Measured on
# Spec-Bench in the bfloat16 mode (a 16 ms plain step, the torch step's ~2 ms of drafting):
# `auto:redrafter=on` 1.96x vs `auto` 1.88x (bench/results/specbench-pruned). With the
# compiled step (``NativeRecurrentStep``, ~0.4 ms a one-token proposal) the 4bit default
# mode's 2.7 ms step qualifies: there auto drafts with it alone on the steps where that
# is faster (``core.step_rates``), 1.12x against 1.09x `none` on Spec-Bench and 1.09x
# against 1.01x on held-out corpus prompts (bench/results/specbench-4bit-solo).
MEMBER_STEP_RATIO = 4.0
TORCH_DRAFT_MS = 2.0  # a proposal of the torch step (int8 weights)
NATIVE_DRAFT_MS = 0.4  # one of the compiled CPU step, one token
MEMBER_CONTEXT = 256


def member_pays(cost: Any, draft_ms: float = TORCH_DRAFT_MS) -> bool:
    """Whether a plain step (one row of ``cost``, a ``CostModel``) is slow enough for the
    ReDrafter member's drafting of ``draft_ms`` a proposal to pay (``MEMBER_STEP_RATIO``).

    Example::

        >>> from draftwise.core.costmodel import CostModel
        >>> member_pays(CostModel(rows=[1, 16], ms=[16.0, 24.0]))
        True
        >>> member_pays(CostModel(rows=[1, 16], ms=[2.8, 5.0]))
        False
        >>> member_pays(CostModel(rows=[1, 16], ms=[2.8, 5.0]), draft_ms=NATIVE_DRAFT_MS)
        True
    """
    return float(cost.cost(1, MEMBER_CONTEXT)) >= MEMBER_STEP_RATIO * draft_ms


def auto_redrafter(
    ctx: DraftingContext, mode: str, bw: int, t: int, cost: Any = None
) -> Drafter | None:
    """``auto``'s ReDrafter member: ``off`` none; ``on`` the ``redrafter`` drafter (its
    errors stand); ``auto`` it when a checkpoint made for this model loads on this
    backend and a plain step on ``cost`` (the device's curve) is slow enough for it to
    pay (``member_pays``), else none (another model, no checkpoint, no hidden states, a
    fast step)."""
    if mode == "off":
        return None
    if mode == "on":
        return build_redrafter(ctx, {"bw": bw, "t": t})
    if cost is not None and not member_pays(cost, NATIVE_DRAFT_MS):  # pays with no step
        return None
    if ctx.backend is None or not (checkpoint_for(ctx, None) / "config.json").is_file():
        return None
    try:
        rd = build_redrafter(ctx, {"bw": bw, "t": t})
    except DraftwiseError:
        return None
    compiled = bool(getattr(getattr(rd, "net", None), "compiled", False))  # the C step
    if cost is not None and not member_pays(cost, NATIVE_DRAFT_MS if compiled else TORCH_DRAFT_MS):
        return None
    return rd
