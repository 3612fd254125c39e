"""``draftwise bench``: measure drafters against plain decoding (and other libraries).

Runs the baseline ``none``, each drafter and each peer on the same prompts in one process,
interleaved prompt by prompt, and writes results.json.gz (every record, gzipped JSON:
``records.read_results`` reads it), results.md, speedup.png and accept_hist.png to
``--out``. Multi-turn items are asked turn by turn with the chat template, each method's
own previous answer in the history (as Spec-Bench does).

Example::

    draftwise bench --prompts shared/bench/prompts/specbench.jsonl --limit 2 \\
        --categories qa,writing --drafters none,cacheback --peers hf --out runs/bench1
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from draftwise.apps.bench.metrics import OVERALL, SummaryRow, mark_identical, summarize
from draftwise.apps.bench.peers import PEER_NAMES, check_peer_names, make_peers
from draftwise.apps.bench.prompts import BenchItem, read_prompts, select_items
from draftwise.apps.bench.llamacpp import find_gguf
from draftwise.apps.bench.records import LEGACY_RESULTS_FILE, REFERENCE, RESULTS_FILE, TurnRecord
from draftwise.apps.bench.report import device_info, render_markdown, write_json_gz, write_text
from draftwise.apps.bench.runner import (
    BASELINE_NAME,
    BenchConfig,
    Chat,
    DraftwiseMethod,
    run_bench,
    split_threads,
)
from draftwise.apps.common import add_model_args, add_sampling_args, sampling_kwargs
from draftwise.drafting import check_spec, drafter_names
from draftwise.errors import DraftwiseError


def _names(text: str | None) -> list[str]:
    """Split a comma list; a comma followed by ``key=`` continues a drafter's options
    (``ngrammys:k=5,w=4,cacheback`` is two drafters)."""
    return [s.strip() for s in re.split(r",(?!\s*[A-Za-z_]\w*=)", text or "") if s.strip()]


def setup_arg_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="draftwise bench", description=__doc__)
    p.add_argument(
        "--prompts", type=Path, required=True, help="JSONL prompt file (id, category, turns)"
    )
    p.add_argument("--out", type=Path, required=True, help="folder for the results files")
    p.add_argument("--limit", type=int, default=None, help="first N items of each category")
    p.add_argument("--categories", default=None, help="comma-separated categories (default: all)")
    p.add_argument(
        "--drafters",
        default="none,cacheback",
        help=f"comma-separated drafters ({', '.join(drafter_names())}); "
        "'none' (the baseline) is always run; a drafter ending in @N runs the model with N "
        "torch CPU threads (thread splits: 'none,card:threads=1@1')",
    )
    p.add_argument(
        "--peers",
        default="",
        help=f"comma-separated other libraries: {', '.join(PEER_NAMES)} (default: none)",
    )
    p.add_argument("--budget", type=int, default=16, help="draft tree size in tokens (default: 16)")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs per (prompt, method); the median time is kept (default: 1)",
    )
    p.add_argument(
        "--lifetime",
        action="store_true",
        help="never reset drafters; run the prompts twice and report both passes",
    )
    p.add_argument(
        "--device-info",
        action="store_true",
        help="record CPU, cores, GPU and library versions in the results",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--reference-dtype",
        choices=("float32", "bfloat16", "float16"),
        default=None,
        help="also run plain decoding on a second copy of the model in this dtype "
        "(none@DTYPE) and report every method's speedup against it too",
    )
    add_model_args(p)
    add_sampling_args(p)
    return p


def check_args(args: argparse.Namespace) -> tuple[list[str], list[str], dict[str, Any]]:
    """(drafters with ``none`` first, peers, generation kwargs); raises on a bad flag."""
    drafters = _names(args.drafters)
    drafters = [BASELINE_NAME] + [d for d in dict.fromkeys(drafters) if d != BASELINE_NAME]
    for d in drafters:
        check_spec(split_threads(d)[0])  # a bad name or option fails here, before loading
    peers = list(dict.fromkeys(_names(args.peers)))
    check_peer_names(peers)
    if args.repeats < 1:
        raise DraftwiseError(f"--repeats must be >= 1, got {args.repeats}")
    if args.lifetime and args.repeats != 1:
        raise DraftwiseError(
            f"--repeats must be 1 with --lifetime (a repeat would teach the drafter), "
            f"got {args.repeats}"
        )
    if peers and args.temp != 0:
        raise DraftwiseError(f"--peers run greedy: use --temp 0 with them, got --temp {args.temp}")
    if args.out.exists() and not args.out.is_dir():
        raise DraftwiseError(f"--out '{args.out}' exists and is not a folder")
    gen = sampling_kwargs(argparse.Namespace(**{**vars(args), "drafter": BASELINE_NAME}))
    gen.pop("drafter")
    gen.pop("max_tokens")
    return drafters, peers, gen


def _default_threads(model: Any, drafters: list[str]) -> int | None:
    """The model's thread count for methods without ``@N``, when some method has one."""
    if all(split_threads(d)[1] is None for d in drafters):
        return None
    old = model.set_threads(1)  # read the count the process started with
    model.set_threads(old)
    return int(old)


def _items(args: argparse.Namespace) -> list[BenchItem]:
    items = select_items(read_prompts(args.prompts), _names(args.categories) or None, args.limit)
    if not items:
        raise DraftwiseError(f"no items selected from '{args.prompts}'")
    return items


class _Progress:
    """A tqdm bar on stderr (a no-op without tqdm or with --no-progress)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.bar: Any = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc="bench", unit="run", file=sys.stderr)
            except ImportError:
                pass

    def step(self, method: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(method)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def main(args: argparse.Namespace) -> int:
    import draftwise

    drafters, peer_names, gen = check_args(args)
    items = _items(args)
    model = draftwise.load(args.model, backend=args.backend, dtype=args.dtype, invariant=args.invariant)
    eos = sorted(model.tokenizer.eos_token_ids)
    device = "cuda" if "cuda" in model.backend.name else "cpu"
    default_threads = _default_threads(model, drafters)
    methods: list[Any] = [DraftwiseMethod(model, d, gen, default_threads) for d in drafters]
    reference = None
    if args.reference_dtype is not None:
        ref_model = draftwise.load(args.model, backend=args.backend, dtype=args.reference_dtype)
        reference = f"{BASELINE_NAME}@{args.reference_dtype}"
        methods.append(
            DraftwiseMethod(ref_model, BASELINE_NAME, gen, default_threads, reference, REFERENCE)
        )
    gguf, no_gguf = find_gguf(args.model, model.model_dir)
    threads = model.backend.device_info().threads
    peers, skipped = make_peers(
        peer_names, model.model_dir, eos, device, args.dtype, gguf, threads, no_gguf
    )
    methods += peers
    for name, why in skipped.items():
        print(f"draftwise bench: peer {name} skipped: {why}", file=sys.stderr)
    config = {
        "prompts": str(args.prompts),
        "categories": sorted({i.category for i in items}),
        "limit": args.limit,
        "items": len(items),
        "turns": sum(len(i.turns) for i in items),
        "methods": [m.name for m in methods],
        "drafters": drafters,
        "peers": peer_names,
        "model_dir": str(model.model_dir),
        "backend": model.backend.name,
        "dtype": args.dtype,
        "max_tokens": args.max_tokens,
        "temp": args.temp,
        "seed": args.seed,
        "budget": args.budget,
        "repeats": args.repeats,
        "lifetime": args.lifetime,
        "eos_token_ids": eos,
        "reference": reference,
        "reference_backend": methods[len(drafters)].model.backend.name if reference else None,
        "llama_cpp_gguf": str(gguf) if gguf is not None else None,
        "llama_cpp_threads": threads,
        "hf_peer_device": device,
        "hf_peer_dtype": args.dtype
        if args.dtype in ("float32", "bfloat16", "float16")
        else "float32",
        "timing": "wall_s per turn: whole generation incl. prefill (cache cleared each turn)",
        # thread / stream layout per method: the model's threads, CARD's worker
        "layouts": {m.name: m.layout() for m in methods if isinstance(m, DraftwiseMethod)},
    }
    state: dict[str, Any] = {
        "config": config,
        "device": device_info(model.backend.name) if args.device_info else None,
        "skipped_peers": skipped,
    }
    chat = Chat(model.tokenizer)
    args.out.mkdir(parents=True, exist_ok=True)
    passes = 2 if args.lifetime else 1
    bar = _Progress(passes * len(items) * args.repeats * len(methods), not args.no_progress)
    cfg = BenchConfig(max_tokens=args.max_tokens, repeats=args.repeats, lifetime=args.lifetime)
    try:
        records = run_bench(
            methods,
            items,
            chat,
            cfg,
            on_run=bar.step,
            on_item=lambda recs: _checkpoint(args.out, state, recs, chat),
        )
    finally:
        bar.close()
    # CARD's worker counters (draft forwards, cache hits and misses after correction)
    state["drafter_stats"] = {m.name: m.stats() for m in methods
                              if isinstance(m, DraftwiseMethod) and m.stats()}
    rows = _write(args.out, state, records, chat, complete=True)
    _plots(args.out, rows, records)
    for r in rows:
        if r.category == OVERALL:
            spd = "n/a" if r.speedup is None else f"{r.speedup:.2f}x"
            ref = "" if r.speedup_vs_reference is None else f"  {r.speedup_vs_reference:.2f}x vs reference"
            print(f"pass {r.pass_no} {r.method:>12}: {r.tokens_per_s:8.1f} tok/s  {spd}{ref}")
    print(f"results in {args.out}/results.md", file=sys.stderr)
    return 0


def _write(
    out: Path, state: dict[str, Any], records: list[TurnRecord], chat: Chat, complete: bool
) -> list[SummaryRow]:
    """Mark identical outputs, summarize, and write results.json.gz and results.md."""
    mark_identical(records, lambda ids: chat.tokenizer.decode(ids, skip_special_tokens=True))
    rows = summarize(records)
    results = {
        "complete": complete,
        **state,
        "summary": [r.to_json() for r in rows],
        "records": [r.to_json() for r in records],
    }
    write_json_gz(out / RESULTS_FILE, results)
    # a plain results.json left here by an older run would contradict these records
    (out / LEGACY_RESULTS_FILE).unlink(missing_ok=True)
    write_text(out / "results.md", render_markdown(results))
    return rows


def _checkpoint(out: Path, state: dict[str, Any], records: list[TurnRecord], chat: Chat) -> None:
    """Write partial results after each item, so an interrupted run keeps what it measured."""
    _write(out, state, records, chat, complete=False)


def _plots(out: Path, rows: list[SummaryRow], records: list[TurnRecord]) -> None:
    from draftwise.apps.bench.plots import plot_accept_hist, plot_speedup

    plot_speedup(rows, out / "speedup.png")
    plot_accept_hist(records, out / "accept_hist.png")
