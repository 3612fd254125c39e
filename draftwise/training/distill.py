"""Distillation data for ReDrafter: the target's own greedy continuations (seed 001 eq. 2),
generated batched, with its last-layer hidden state at every position.

Prompts come from the training corpus (``corpus/prompts.jsonl``, never benchmark
prompts), rendered through the model's chat template. Each batch of ``batch`` prompts
(about equally long: ``shard_prompts``) is left-padded and continued greedily for
``gen_len`` tokens (``batch_greedy``; bfloat16 where the CPU computes it, else float32:
``data_dtype``), so one forward serves the whole batch.
A shard per batch is written atomically
(``shard-00007.npz``: ``tokens`` (B, L) int32, ``hidden`` (B, L, C) float16, ``valid``
(B, L) bool), so an interrupted run resumes at the first missing shard.

Row layout: ``hidden[b, j]`` is the hidden state that predicted ``tokens[b, j]`` (for
j = 0 the prompt's last token; then the token before), so a drafter started at j reads
``hidden[b, j]``, takes ``tokens[b, j]`` as its root and must guess ``tokens[b, j+1:]``.

Example::

    write_shards(model_dir, corpus / "prompts.jsonl", out / "data", n_batches=4)
    tokens, hidden, valid = load_shards(out / "data")
"""

from __future__ import annotations

import hashlib
import io
import json
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from draftwise.backends.cuda.redrafter.checkpoint import atomic_write
from draftwise.errors import DraftwiseError


def read_rows(path: Path, seed: int = 0) -> list[dict[str, object]]:
    """The corpus rows (``prompt``, ``response`` or null), shuffled reproducibly."""
    if not path.is_file():
        raise DraftwiseError(f"no corpus prompts at {path}")
    rows = [json.loads(line) for line in path.read_text().split("\n") if line.strip()]
    random.Random(seed).shuffle(rows)
    return rows


def read_prompts(path: Path, seed: int = 0) -> list[str]:
    """The corpus prompts, shuffled reproducibly (the order of ``read_rows``)."""
    return [str(r["prompt"]) for r in read_rows(path, seed)]


def _shard(out: Path, i: int) -> Path:
    return out / f"shard-{i:05d}.npz"


def shard_prompts(tok: object, prompts: list[str], batch: int, max_prompt: int) -> list[list[int]]:
    """The prompts' chat-template ids (the last ``max_prompt`` of longer ones) in shard
    order: the shuffled corpus order, sorted by length within windows of 8 shards so a
    shard's prompts are about as long as each other (little padding in the batch)."""
    ids = []
    for t in prompts:
        x = tok.apply_chat_template(  # type: ignore[attr-defined]
            [{"role": "user", "content": t}], add_generation_prompt=True
        )
        ids.append(list(x["input_ids"] if hasattr(x, "keys") else x)[-max_prompt:])
    win = 8 * batch
    return [x for w in range(0, len(ids), win) for x in sorted(ids[w : w + win], key=len)]


def data_dtype(device: str = "cpu") -> torch.dtype:
    """The dtype the target computes new training data in: bfloat16 where the CPU has
    bf16 instructions (``modes.native_bf16``), else float32, since emulated bfloat16 is
    several times slower there (one teacher-forced shard, 8 x 512 tokens through the
    default model, on an AMD EPYC Zen 3 with AVX2 only: 80 s in bfloat16, 15 s in
    float32); bfloat16 on a GPU (``device`` "cuda"). The hidden states are stored in
    float16 either way; greedy shards record theirs (``data.json``), and a resumed run
    keeps it.

    Example::

        >>> data_dtype() in (torch.bfloat16, torch.float32)
        True
    """
    from draftwise.backends.cuda.modes import native_bf16

    return torch.bfloat16 if device != "cpu" or native_bf16() else torch.float32


UNRECORDED_DTYPE = "bfloat16"  # greedy shards made before data.json recorded a dtype


def shards_dtype(out: Path, device: str = "cpu") -> torch.dtype:
    """The dtype the greedy shards in ``out`` were made in (``data.json``; bfloat16 for
    shards from before it was recorded), or ``data_dtype(device)`` where there are none yet."""
    meta = out / "data.json"
    if not meta.is_file():
        return data_dtype(device)
    name = json.loads(meta.read_text()).get("dtype", UNRECORDED_DTYPE)
    if name not in ("bfloat16", "float32"):
        raise DraftwiseError(f"{meta} records dtype {name!r}, not bfloat16 or float32")
    return getattr(torch, name)


def write_shards(
    model_dir: Path,
    prompts_path: Path,
    out: Path,
    n_batches: int,
    batch: int = 128,
    gen_len: int = 160,
    max_prompt: int = 128,
    progress: Callable[[int, int], None] | None = None,
    device: str = "cpu",
) -> None:
    """Generate the missing shards 0..n_batches-1 (see the module docstring): greedy
    continuations in ``shards_dtype(out, device)``, ``batch`` prompts per forward
    (``batch_greedy``), the model on ``device``."""
    prompts = read_prompts(prompts_path)
    if n_batches * batch > len(prompts):
        raise DraftwiseError(
            f"{prompts_path} has {len(prompts)} prompts; {n_batches} shards of {batch} "
            f"need {n_batches * batch}"
        )
    # the shards' prompts depend on these: a resumed run must not mix two layouts
    digest = hashlib.sha256(prompts_path.read_bytes()).hexdigest()[:16]
    dtype = shards_dtype(out, device)
    settings = {"prompts_sha256": digest, "n_batches": n_batches, "batch": batch,
                "gen_len": gen_len, "max_prompt": max_prompt,
                "dtype": str(dtype).removeprefix("torch.")}
    meta = out / "data.json"
    if meta.is_file():
        old = {"dtype": UNRECORDED_DTYPE, **json.loads(meta.read_text())}
        if old != settings:
            diff = ", ".join(
                f"{k} {old.get(k)} -> {v}" for k, v in settings.items() if old.get(k) != v
            )
            raise DraftwiseError(
                f"{out} holds shards made with other settings ({diff}); use another --out"
            )
    todo = [i for i in range(n_batches) if not _shard(out, i).is_file()]
    if not todo:
        return
    atomic_write(meta, (json.dumps(settings, indent=1) + "\n").encode())
    from transformers import AutoTokenizer

    from draftwise.backends.cuda.llama import Llama
    from draftwise.training.batch_greedy import greedy_continuations, prompt_states

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = Llama.load(model_dir, dtype, torch.device(device), max_cache_len=1)
    ordered = shard_prompts(tok, prompts[: n_batches * batch], batch, max_prompt)
    for done, i in enumerate(todo):
        ids = ordered[i * batch : (i + 1) * batch]
        tokens, hidden, valid = greedy_continuations(model, ids, gen_len, tok.eos_token_id)
        ptok, phid, pvalid, _ = prompt_states(model, ids, max_prompt)
        buf = io.BytesIO()
        np.savez(
            buf, tokens=tokens, hidden=hidden, valid=valid,
            prompt_tokens=ptok, prompt_hidden=phid, prompt_valid=pvalid,
        )
        atomic_write(_shard(out, i), buf.getvalue())
        if progress is not None:
            progress(done + 1, len(todo))


def add_prompt_states(
    model_dir: Path,
    prompts_path: Path,
    out: Path,
    n_batches: int,
    batch: int,
    max_prompt: int,
    progress: Callable[[int, int], None] | None = None,
    device: str = "cpu",
) -> None:
    """Add the prompts' tokens and hidden states (``batch_greedy.prompt_states``) to
    shards written without them (by an earlier version), each rewritten atomically, so
    an interrupted run resumes. Refused when a shard's prompts do not give its first
    hidden state back (other prompts or settings than those it was made with)."""
    todo = [i for i in range(n_batches) if "prompt_tokens" not in np.load(_shard(out, i))]
    if not todo:
        return
    from transformers import AutoTokenizer

    from draftwise.backends.cuda.llama import Llama
    from draftwise.training.batch_greedy import prompt_states

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = Llama.load(model_dir, shards_dtype(out), torch.device(device), max_cache_len=1)
    prompts = read_prompts(prompts_path)
    ordered = shard_prompts(tok, prompts[: n_batches * batch], batch, max_prompt)
    for done, i in enumerate(todo):
        shard = dict(np.load(_shard(out, i)))
        ids = ordered[i * batch : (i + 1) * batch]
        ptok, phid, pvalid, last = prompt_states(model, ids, max_prompt)
        got, want = last.astype(np.float32), shard["hidden"][:, 0].astype(np.float32)
        if not np.allclose(got, want, atol=0.1 * float(np.abs(want).max()) + 0.05):
            raise DraftwiseError(
                f"{_shard(out, i)} was not made from these prompts (its first hidden states "
                "differ); use another --out"
            )
        buf = io.BytesIO()
        np.savez(buf, **shard, prompt_tokens=ptok, prompt_hidden=phid, prompt_valid=pvalid)
        atomic_write(_shard(out, i), buf.getvalue())
        if progress is not None:
            progress(done + 1, len(todo))


def load_prompt_states(out: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The greedy shards' prompt tokens (N, W), hidden (N, W, C) and valid (N, W),
    concatenated like ``load_shards``; None when a shard has none."""
    parts = [np.load(f) for f in sorted(out.glob("shard-*.npz"))]
    if not parts or any("prompt_tokens" not in p.files for p in parts):
        return None
    keys = ("prompt_tokens", "prompt_hidden", "prompt_valid")
    tok, hid, val = (np.concatenate([p[k] for p in parts]) for k in keys)
    return tok, hid, val


def _forced(out: Path, i: int) -> Path:
    return out / f"forced-{i:05d}.npz"


def write_forced_shards(
    model_dir: Path,
    prompts_path: Path,
    out: Path,
    n_batches: int,
    skip: int,
    batch: int = 8,
    seq_len: int = 512,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Teacher-forced data, the cheap alternative to greedy continuations: corpus
    conversations (prompt + reference response through the chat template, rows
    ``skip..`` of ``read_rows``, so the prompts of the greedy shards stay out), packed
    into rows of ``seq_len + 1`` tokens; one forward per ``batch`` rows (in
    ``data_dtype()``) gives the last-layer hidden state and the target's argmax at
    every position.

    Layout as the greedy shards plus ``labels``: ``tokens[b, j]`` is corpus token
    ``j + 1``, ``hidden[b, j]`` the state after token ``j`` (it predicts ``tokens[b, j]``)
    and ``labels[b, j]`` the target's argmax from it. A sample at ``j`` is usable as a
    draft root only where ``tokens[b, j] == labels[b, j]`` (live, the root is always the
    target's own token); its labels ``labels[b, j+1:]`` are what the target predicts
    after the corpus prefix."""
    todo = [i for i in range(n_batches) if not _forced(out, i).is_file()]
    if not todo:
        return
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=data_dtype()).eval()
    rows = [r for r in read_rows(prompts_path)[skip:] if r.get("response")]
    need = max(todo) + 1
    stream: list[int] = []
    per = batch * (seq_len + 1)
    for r in rows:  # tokenise only what the shards need
        msgs = [
            {"role": "user", "content": str(r["prompt"])},
            {"role": "assistant", "content": str(r["response"])},
        ]
        ids = tok.apply_chat_template(msgs)
        stream.extend(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
        if len(stream) >= need * per:
            break
    if len(stream) < need * per:
        raise DraftwiseError(
            f"corpus {prompts_path} has {len(stream)} conversation tokens after row {skip}; "
            f"{n_batches} forced shards need {need * per}"
        )
    for done, i in enumerate(todo):
        x = torch.tensor(stream[i * per : (i + 1) * per]).view(batch, seq_len + 1)  # (B, L+1)
        with torch.inference_mode():
            h = model.model(input_ids=x[:, :-1]).last_hidden_state  # (B, L, C)
            labels = model.lm_head(h).argmax(-1)  # (B, L)
        buf = io.BytesIO()
        np.savez(
            buf,
            tokens=x[:, 1:].to(torch.int32).numpy(),
            hidden=h.to(torch.float16).numpy(),
            valid=np.ones((batch, seq_len), dtype=bool),
            labels=labels.to(torch.int32).numpy(),
        )
        atomic_write(_forced(out, i), buf.getvalue())
        if progress is not None:
            progress(done + 1, len(todo))


def load_shards(
    out: Path, pattern: str = "shard-*.npz"
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """All shards concatenated: tokens (N, L), hidden (N, L, C), valid (N, L), labels
    (N, L) (the tokens themselves for greedy shards)."""
    files = sorted(out.glob(pattern))
    if not files:
        raise DraftwiseError(f"no distillation shards in {out}")
    parts = [np.load(f) for f in files]
    tokens, hidden, valid = (np.concatenate([p[k] for p in parts]) for k in ("tokens", "hidden", "valid"))
    labels = np.concatenate([p["labels"] if "labels" in p else p["tokens"] for p in parts])
    return tokens, hidden, valid, labels
