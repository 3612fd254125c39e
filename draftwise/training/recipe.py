"""``draftwise train-drafter``: the ReDrafter training recipe, end to end.

``train_redrafter`` generates (or resumes) the distillation data (``distill.py``: the
model's own greedy continuations, batched by ``batch_greedy.py``), then trains (or
resumes) the network (``fit.py``) and writes a checkpoint the ``redrafter`` drafter loads.
It drives the torch backend; it is not part of one.

Example::

    summary = train_redrafter(model_dir, out_dir, corpus / "prompts.jsonl", TrainRecipe())
    summary["chain_acceptance"]   # held-out share of roots whose first k guesses are right
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from draftwise.errors import DraftwiseError


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
    soft_weight: float = 0.0  # + this x the target's own distribution's cross-entropy
    soft_temp: float = 1.0  # that distribution's temperature
    device: str = "cpu"  # where the data is generated and the network trained ("cuda": a GPU)

    def check(self) -> None:
        """One-line error naming the first out-of-range setting (before any work)."""
        if self.device != "cpu":
            import torch

            try:
                dev = torch.device(self.device)
            except (RuntimeError, ValueError):
                raise DraftwiseError(f"--device must be cpu or cuda, got {self.device!r}") from None
            if dev.type != "cuda":
                raise DraftwiseError(f"--device must be cpu or cuda, got {self.device!r}")
            if not torch.cuda.is_available():
                raise DraftwiseError(f"--device {self.device}: torch sees no CUDA GPU here")
        for f in fields(self):
            v = getattr(self, f.name)
            low = 0 if f.name in ("forced_batches", "forced_skip", "context_dim") else 1
            if f.name in ("epochs", "lr", "soft_temp") and not v > 0:
                raise DraftwiseError(f"--{f.name.replace('_', '-')} must be > 0, got {v}")
            if f.name == "soft_weight" and not v >= 0:
                raise DraftwiseError(f"--soft-weight must be >= 0, got {v}")
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


def target_rows(model_dir: Path) -> tuple[Any, Any]:
    """The target's input embeddings and output rows, (V, C) float32 each: the output rows
    are the embeddings (the same tensor) unless the checkpoint has its own
    ``lm_head.weight``."""
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        embed = f.get_tensor("model.embed_tokens.weight").float()  # (V, C)
        tied = "lm_head.weight" not in f.keys()
        return embed, embed if tied else f.get_tensor("lm_head.weight").float()


def train_redrafter(
    model_dir: Path, out: Path, prompts: Path, recipe: TrainRecipe, quiet: bool = False
) -> dict[str, Any]:
    """Generate (or resume) the distillation data, then train (or resume); returns a
    summary (sizes, coverage, held-out chain acceptance, times)."""
    import numpy as np
    import torch
    from tqdm import tqdm

    from draftwise.backends.cuda.redrafter.checkpoint import weights_fingerprint
    from draftwise.backends.cuda.redrafter.net import ReDrafterNet
    from draftwise.core.drafters.redrafter_ckpt import ReDrafterConfig, read_config
    from draftwise.models.tokenizer import Tokenizer
    from draftwise.training.distill import (
        add_prompt_states,
        load_prompt_states,
        load_shards,
        write_forced_shards,
        write_shards,
    )
    from draftwise.training.fit import (
        TrainSettings,
        chain_acceptance,
        choose_vocab,
        train,
    )

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
        recipe.device,
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
            recipe.device,
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
    embed, out_rows = target_rows(model_dir)
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
        recipe.t, recipe.epochs, recipe.lr, recipe.train_batch, context_rows=recipe.context_rows,
        soft_weight=recipe.soft_weight, soft_temp=recipe.soft_temp, device=recipe.device,
    )
    tbar = tqdm(desc="train (steps)", disable=quiet, file=sys.stderr)

    def train_progress(step: int, total: int, loss: float) -> None:
        tbar.total = total
        tbar.n = step
        tbar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        tbar.refresh()

    torch.manual_seed(0)
    t1 = time.time()
    head = out_rows[torch.from_numpy(vocab).long()]  # (K, C)
    losses = train(net, tokens, hidden, valid, out, s, train_progress, train_labels, prompt, head)
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
