"""Write the bench results: ``results.json.gz`` (everything, gzipped JSON; read it back
with ``records.read_results``) and ``results.md`` (the tables).

Files are written atomically (a temporary file in the same folder, then ``os.replace``),
so a reader never sees half a file and an interrupted run leaves the last checkpoint.

Example::

    >>> text = render_markdown({"config": {"max_tokens": 8}, "summary": [], "skipped_peers": {}})
    >>> text.splitlines()[0]
    '# draftwise bench'
"""

from __future__ import annotations

import gzip
import json
import os
import platform
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from draftwise.apps.bench.metrics import OVERALL
from draftwise.core.atomic import atomic_path

TIMING_NOTE = (
    "Timing: wall time per turn, measured around the whole generation from the "
    "chat-templated prompt ids to the last token, prefill included (tokenization excluded). "
    "The KV cache is cleared before every turn, so every method prefills each turn's whole "
    "prompt, as the peers do. **speedup** = the method's mean tokens/s over the baseline "
    "`none`'s mean tokens/s (Spec-Bench), from these total wall times; **median** = median of "
    "per-turn ratios; **decode** = the same mean ratio with prefill time left out. "
    "**MAT** = tokens per verification step, bonus token included. **identical** = turns "
    "whose output equals the baseline's (token ids; decoded text for peers)."
)


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Call ``write(tmp)`` on a temporary path next to ``path``, then move it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        write(tmp)


def write_text(path: Path, text: str) -> None:
    def write(tmp: Path) -> None:
        tmp.write_text(text, encoding="utf-8")

    atomic_write(path, write)


def write_json_gz(path: Path, data: Any) -> None:
    """``data`` as compact JSON, gzipped (no timestamp in the header, so the same data
    gives the same bytes), written atomically."""
    raw = (json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")

    def write(tmp: Path) -> None:
        tmp.write_bytes(gzip.compress(raw, compresslevel=9, mtime=0))

    atomic_write(path, write)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_info(backend_name: str) -> dict[str, Any]:
    """CPU, core count, library versions and the GPU (when torch sees one).

    Example::

        >>> device_info("torch-cpu-float32")["backend"]
        'torch-cpu-float32'
    """
    info: dict[str, Any] = {
        "backend": backend_name,
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "sched_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {
            d: _version(d) for d in ("draftwise", "numpy", "torch", "transformers", "mlx", "mlx-lm")
        },
        "gpu": None,
    }
    if "cuda" in backend_name:
        import torch

        info["gpu"] = torch.cuda.get_device_name()
    return info


def _fmt(x: float | None, digits: int = 2, suffix: str = "") -> str:
    return "n/a" if x is None else f"{x:.{digits}f}{suffix}"


def _table(rows: Sequence[dict[str, Any]]) -> list[str]:
    ref = any(r.get("speedup_vs_reference") is not None for r in rows)
    beam = any(r.get("beam_width_per_step") is not None for r in rows)
    out = [
        "| method | turns | tokens | tok/s | speedup | median | decode | MAT | tree "
        + ("| beam bw x t " if beam else "")
        + "| draft ms/step | verify ms/step | identical |"
        + (" vs reference |" if ref else ""),
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
        + ("--:|" if beam else "")
        + ("--:|" if ref else ""),
    ]
    for r in rows:
        ident = (
            "n/a"
            if r["identical_rate"] is None
            else (f"{r['identical']}/{r['turns']} ({100 * r['identical_rate']:.0f}%)")
        )
        out.append(
            f"| {r['method']} | {r['turns']} | {r['tokens']} | {_fmt(r['tokens_per_s'], 1)} "
            f"| {_fmt(r['speedup'], 2, 'x')} | {_fmt(r['speedup_median'], 2, 'x')} "
            f"| {_fmt(r['decode_speedup'], 2, 'x')} | {_fmt(r['mat'])} "
            f"| {_fmt(r.get('tree_per_step'), 1)} "
            + (f"| {_beam(r)} " if beam else "")
            + f"| {_fmt(r['draft_ms_per_step'])} | {_fmt(r['verify_ms_per_step'])} | {ident} |"
            + (f" {_fmt(r.get('speedup_vs_reference'), 2, 'x')} |" if ref else "")
        )
    return out


def _beam(r: dict[str, Any]) -> str:
    """Mean beam width x length per step, e.g. ``2.4 x 3.1``; blank without beams."""
    w, t = r.get("beam_width_per_step"), r.get("beam_length_per_step")
    return "" if w is None or t is None else f"{w:.1f} x {t:.1f}"


def _matrix(rows: Sequence[dict[str, Any]], categories: list[str]) -> list[str]:
    methods = list(dict.fromkeys(r["method"] for r in rows))
    cell = {(r["method"], r["category"]): r["speedup"] for r in rows}
    out = ["| method | " + " | ".join(categories) + " |", "|---|" + "--:|" * len(categories)]
    for m in methods:
        vals = [_fmt(cell.get((m, c)), 2, "x") for c in categories]
        out.append(f"| {m} | " + " | ".join(vals) + " |")
    return out


def _header(config: dict[str, Any]) -> list[str]:
    c = config
    mode = (
        "lifetime: two passes through the prompts, drafters never reset"
        if c.get("lifetime")
        else "drafters reset before each prompt"
    )
    return [
        f"Model `{c.get('model_dir')}` on backend `{c.get('backend')}`; prompts "
        f"`{c.get('prompts')}` ({c.get('items')} items, {c.get('turns')} turns per method "
        f"and pass); max tokens {c.get('max_tokens')}, temperature {c.get('temp')}, "
        f"budget {c.get('budget')}, repeats {c.get('repeats')} (median time kept); {mode}.",
        *_layout_lines(c.get("layouts") or {}),
    ] + ([
        f"Speedups are against `none` in this mode; *vs reference* is against "
        f"`{c['reference']}` (plain decoding on `{c.get('reference_backend')}`), same run; "
        f"its *identical* compares its text with `none`'s across the two dtypes.",
    ] if c.get("reference") else [])


def _layout_lines(layouts: dict[str, Any]) -> list[str]:
    """One line per method whose threads or draft worker were set (thread splits, CARD).

    >>> _layout_lines({"card@1": {"model_threads": 1, "draft_worker": "own thread"}})
    ['', 'Layout: `card@1`: model 1 thread(s), own thread.']
    """
    parts = []
    for name, lay in layouts.items():
        bits = []
        if lay.get("model_threads") is not None:
            bits.append(f"model {lay['model_threads']} thread(s)")
        if lay.get("draft_worker"):
            bits.append(str(lay["draft_worker"]))
        if bits:
            parts.append(f"`{name}`: {', '.join(bits)}")
    return ["", "Layout: " + "; ".join(parts) + "."] if parts else []


def render_markdown(results: dict[str, Any]) -> str:
    """The results.md text: header, timing note, overall and per-category tables."""
    config = results.get("config", {})
    summary = results.get("summary", [])
    lines = ["# draftwise bench", "", *_header(config), "", TIMING_NOTE, ""]
    if not results.get("complete", True):
        lines += ["**Partial results: the run did not finish.**", ""]
    passes = sorted({r["pass_no"] for r in summary})
    for p in passes:
        rows = [r for r in summary if r["pass_no"] == p]
        title = (
            ""
            if len(passes) == 1
            else (
                " - pass 1 (fresh drafters)" if p == 1 else f" - pass {p} (drafters carried over)"
            )
        )
        cats = list(dict.fromkeys(r["category"] for r in rows))
        lines += [f"## Overall{title}", ""]
        lines += _table([r for r in rows if r["category"] == OVERALL]) + [""]
        lines += [f"## Speedup by category{title}", "", *_matrix(rows, cats), ""]
        for cat in cats:
            if cat == OVERALL:
                continue
            lines += [f"### {cat}{title}", ""]
            lines += _table([r for r in rows if r["category"] == cat]) + [""]
    skipped = results.get("skipped_peers") or {}
    if skipped:
        lines += ["## Skipped peers", ""] + [f"- {k}: {v}" for k, v in skipped.items()] + [""]
    dev = results.get("device")
    if dev:
        versions = ", ".join(f"{k} {v}" for k, v in dev.get("versions", {}).items() if v)
        lines += [
            "## Device",
            "",
            f"- CPU: {dev.get('cpu')} ({dev.get('cpu_count')} cores, "
            f"{dev.get('sched_cpus')} usable)",
            f"- GPU: {dev.get('gpu') or 'none'}",
            f"- {dev.get('platform')}, Python {dev.get('python')}",
            f"- {versions}",
            "",
        ]
    return "\n".join(lines)
