"""The ``redrafter`` drafter built from the drafting context, and its training recipe.

The checkpoint is, in order: the ``path`` option; the one ``draftwise train-drafter``
left in this model's asset directory; the one shipped in ``draftwise/data/`` for the
default model. Each is refused (one line naming its path) when made for another
tokenizer or other weights.

Example::

    d = model.drafter("redrafter:bw=2,t=4")
    train_redrafter(model_dir, out_dir, corpus / "prompts.jsonl", TrainRecipe())
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass, fields
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
        from draftwise.backends.mlx.redrafter import (  # type: ignore[import-not-found]
            MLXRecurrentStep,
            MLXReDrafterNet,
        )

        mnet = MLXReDrafterNet.load(ckpt, be, ctx.tokenizer_id)  # type: ignore[arg-type]
        return ReDrafter(MLXRecurrentStep(mnet, be, extend=extend), **opts)  # type: ignore[arg-type]
    import torch

    from draftwise.backends.cuda.backend import TorchBackend
    from draftwise.backends.cuda.redrafter_io import load_redrafter, weights_fingerprint
    from draftwise.backends.cuda.redrafter_step import TorchRecurrentStep, int8_supported

    if not isinstance(be, TorchBackend):
        raise DraftwiseError(f"backend {be.name!r} cannot run redrafter")
    embed = be.model.embed
    net = load_redrafter(ckpt, embed, ctx.tokenizer_id, weights_fingerprint(embed))
    if embed.dtype in (torch.bfloat16, torch.float16):
        net = net.to(embed.dtype)  # the target's dtype
    if embed.device.type == "cpu" and int8_supported():
        # int8 weights on bfloat16 activations, also beside a float32 target: a beam step
        # reads every weight once. With bf16 dot products a 1-row step took 0.8 ms in
        # bfloat16 and 0.3 ms in int8 (redrafter_step); on an AVX2-only CPU (bf16
        # emulated) int8 still beats float32 (the 4096 x 576 head, 1 row: 0.30 against
        # 0.91 ms) and drafting at bw=1, t=3 fell from 11.3 to 6.9 ms a step. Drafts may
        # differ at near-ties; the output never does.
        net = net.to(torch.bfloat16)
        step = TorchRecurrentStep(net, be, int8=True, extend=extend)
        return ReDrafter(step, **opts)
    return ReDrafter(TorchRecurrentStep(net, be, extend=extend), **opts)


# ``auto`` (the default) takes the member only where a plain step costs at least this
# much at a 256-token context: several times its ~2 ms of drafting a step. Measured on
# Spec-Bench in the bfloat16 mode (a 16 ms plain step here): `auto:redrafter=on` 1.96x vs
# `auto` 1.88x (bench/results/specbench-pruned); in the 4bit default mode (2.8 ms) the
# drafting is most of a step.
MEMBER_MIN_STEP_MS = 8.0
MEMBER_CONTEXT = 256


def member_pays(cost: Any) -> bool:
    """Whether a plain step (one row of ``cost``, a ``CostModel``) is slow enough for the
    ReDrafter member's drafting to pay (``MEMBER_MIN_STEP_MS``).

    Example::

        >>> from draftwise.core.costmodel import CostModel
        >>> member_pays(CostModel(rows=[1, 16], ms=[16.0, 24.0]))
        True
        >>> member_pays(CostModel(rows=[1, 16], ms=[2.8, 5.0]))
        False
    """
    return float(cost.cost(1, MEMBER_CONTEXT)) >= MEMBER_MIN_STEP_MS


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
    if cost is not None and not member_pays(cost):
        return None
    if ctx.backend is None or not (checkpoint_for(ctx, None) / "config.json").is_file():
        return None
    try:
        return build_redrafter(ctx, {"bw": bw, "t": t})
    except DraftwiseError:
        return None


@dataclass(frozen=True)
class TrainRecipe:
    """Data and training sizes of ``draftwise train-drafter`` (defaults: ~1 h on 2 cores).

    The network trains on the target's greedy continuations (``batches`` shards of
    ``batch`` corpus prompts), every 20th row held out to measure it on exactly what it
    will draft. With ``forced_batches > 0`` it trains on teacher-forced corpus
    conversations labelled with the target's argmax instead (the cheap alternative;
    measured worse, see ``draftwise/data/README.md``) and all greedy rows are held out."""

    batches: int = 68  # greedy-continuation shards (batch prompts each)
    batch: int = 128  # prompts per generation forward
    gen_len: int = 160  # greedy tokens per prompt
    max_prompt: int = 128  # prompt tokens kept (the end of longer ones)
    forced_batches: int = 0  # teacher-forced shards (8 rows of 512 tokens each)
    forced_skip: int = 8704  # corpus rows (shuffled) before the teacher-forced ones
    draft_vocab: int = 4096  # K most frequent output ids the head can draft
    resblocks: int = 1
    context_dim: int = 256  # attention over the context (0: the plain seed 001 network)
    context_heads: int = 4
    context_rows: int = 16  # rows per training step of a context network
    t: int = 5  # predicted positions per training sample
    epochs: float = 2.0
    lr: float = 1e-3
    train_batch: int = 512

    def check(self) -> None:
        """One-line error naming the first out-of-range setting (before any work)."""
        for f in fields(self):
            v = getattr(self, f.name)
            low = 0 if f.name in ("forced_batches", "forced_skip", "context_dim") else 1
            if f.name in ("epochs", "lr") and not v > 0:
                raise DraftwiseError(f"--{f.name.replace('_', '-')} must be > 0, got {v}")
            if isinstance(v, int) and v < low:
                raise DraftwiseError(f"--{f.name.replace('_', '-')} must be >= {low}, got {v}")
        if self.context_dim % self.context_heads:
            raise DraftwiseError(
                f"--context-dim {self.context_dim} must be a multiple of --context-heads "
                f"{self.context_heads}"
            )
        if self.context_dim and self.forced_batches:
            raise DraftwiseError(
                "--forced-batches trains on teacher-forced text; a context drafter "
                "(--context-dim > 0) trains on greedy continuations only: pass --context-dim 0"
            )


def train_redrafter(
    model_dir: Path, out: Path, prompts: Path, recipe: TrainRecipe, quiet: bool = False
) -> dict[str, Any]:
    """Generate (or resume) the distillation data, then train (or resume); returns a
    summary (sizes, coverage, held-out chain acceptance, times)."""
    import numpy as np
    import torch
    from safetensors import safe_open
    from tqdm import tqdm

    from draftwise.backends.cuda.redrafter import ReDrafterNet
    from draftwise.backends.cuda.redrafter_data import (
        add_prompt_states,
        load_prompt_states,
        load_shards,
        write_forced_shards,
        write_shards,
    )
    from draftwise.backends.cuda.redrafter_io import weights_fingerprint
    from draftwise.backends.cuda.redrafter_train import (
        TrainSettings,
        chain_acceptance,
        choose_vocab,
        train,
    )
    from draftwise.core.drafters.redrafter_ckpt import ReDrafterConfig, read_config
    from draftwise.models.tokenizer import Tokenizer

    recipe.check()
    if recipe.forced_batches > 0 and recipe.forced_skip < recipe.batches * recipe.batch:
        raise DraftwiseError(
            f"--forced-skip {recipe.forced_skip} would train on the held-out prompts: "
            f"it must be at least --batches x --batch = {recipe.batches * recipe.batch}"
        )
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=recipe.batches, desc="data (shards)", disable=quiet, file=sys.stderr)
    bar.update(len(list((out / "data").glob("shard-*.npz"))))

    def data_progress(i: int, n: int) -> None:
        bar.update(1)

    write_shards(
        model_dir,
        prompts,
        out / "data",
        recipe.batches,
        recipe.batch,
        recipe.gen_len,
        recipe.max_prompt,
        data_progress,
    )
    bar.close()
    if recipe.context_dim:  # shards made before prompts were stored get them added
        pbar = tqdm(total=recipe.batches, desc="data (prompts)", disable=quiet, file=sys.stderr)
        add_prompt_states(
            model_dir,
            prompts,
            out / "data",
            recipe.batches,
            recipe.batch,
            recipe.max_prompt,
            lambda i, n: pbar.update(1),
        )
        pbar.close()
    forced = out / "forced"
    if recipe.forced_batches > 0:
        fbar = tqdm(total=recipe.forced_batches, desc="data (forced)", disable=quiet, file=sys.stderr)
        fbar.update(len(list(forced.glob("forced-*.npz"))))
        write_forced_shards(
            model_dir,
            prompts,
            forced,
            recipe.forced_batches,
            skip=recipe.forced_skip,
            progress=lambda i, n: fbar.update(1),
        )
        fbar.close()
    t_data = time.time() - t0
    g_tokens, g_hidden, g_valid, _ = load_shards(out / "data")
    prompt: Any = None
    held_prompt: Any = None
    if recipe.forced_batches > 0:
        tokens, hidden, valid, labels = load_shards(forced, "forced-*.npz")
        held = (g_tokens, g_hidden, g_valid)
        train_labels: Any = labels
    else:
        if g_tokens.shape[0] < 2:
            raise DraftwiseError(
                f"{out / 'data'} has {g_tokens.shape[0]} greedy row(s): training holds some "
                "out, so it needs at least 2 (raise --batches or --batch)"
            )
        held_rows = np.arange(g_tokens.shape[0]) % 20 == 19  # every 20th row: held out
        held_rows[-1] |= not held_rows.any()  # (fewer than 20 rows: the last one)
        tokens, hidden, valid = (a[~held_rows] for a in (g_tokens, g_hidden, g_valid))
        held = (g_tokens[held_rows], g_hidden[held_rows], g_valid[held_rows])
        labels, train_labels = tokens, None
        if recipe.context_dim:
            got = load_prompt_states(out / "data")
            assert got is not None  # added above
            prompt = tuple(a[~held_rows] for a in got)
            held_prompt = tuple(a[held_rows] for a in got)
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        embed = f.get_tensor("model.embed_tokens.weight").float()  # (V, C)
    vocab, cover = choose_vocab(labels, valid, recipe.draft_vocab, int(embed.shape[0]))
    tok_id = Tokenizer.from_dir(model_dir).identity()
    cfg = ReDrafterConfig(
        int(embed.shape[1]),
        int(embed.shape[0]),
        int(vocab.size),
        recipe.resblocks,
        tok_id,
        weights_fingerprint(embed),
        model_dir.name,
        context_dim=recipe.context_dim,
        context_heads=recipe.context_heads,
    )
    if (out / "config.json").is_file():  # resuming: keep the vocabulary it was trained on
        old, _ = read_config(out)
        if old.fingerprint != cfg.fingerprint:
            raise DraftwiseError(
                f"{out} holds a drafter for other model weights; use another --out"
            )
        if (old.context_dim, old.context_heads) != (cfg.context_dim, cfg.context_heads):
            raise DraftwiseError(
                f"{out} holds a drafter with --context-dim {old.context_dim} "
                f"--context-heads {old.context_heads}; resume with those or use another --out"
            )
    net = ReDrafterNet(cfg, embed, torch.from_numpy(vocab))
    s = TrainSettings(
        recipe.t, recipe.epochs, recipe.lr, recipe.train_batch, context_rows=recipe.context_rows
    )
    tbar = tqdm(desc="train (steps)", disable=quiet, file=sys.stderr)

    def train_progress(step: int, total: int, loss: float) -> None:
        tbar.total = total
        tbar.n = step
        tbar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        tbar.refresh()

    torch.manual_seed(0)
    t1 = time.time()
    losses = train(net, tokens, hidden, valid, out, s, train_progress, train_labels, prompt)
    tbar.close()
    acc = chain_acceptance(net, *held, recipe.t, prompt=held_prompt)
    return {
        "recipe": asdict(recipe),
        "train_tokens": int(valid.sum()),
        "heldout_greedy_tokens": int(held[2].sum()),
        "draft_vocab": int(vocab.size),
        "coverage": round(cover, 4),
        "heldout_chain_acceptance": [round(float(a), 4) for a in acc],
        "heldout_chain_tokens_per_step": round(1 + float(np.sum(acc)), 3),
        "last_losses": [round(x, 3) for x in losses[-5:]],
        "data_s": round(t_data, 1),
        "train_s": round(time.time() - t1, 1),
    }
