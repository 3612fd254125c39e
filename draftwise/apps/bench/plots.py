"""Charts of a bench run: speedup per category, and tokens-per-step histograms.

``speedup.png``: grouped bars, one group per category (plus ``overall``), one bar per
method, a dashed line at 1.0 (the baseline). ``accept_hist.png``: for each drafter, the
share of verification steps that emitted 1, 2, 3, ... tokens. matplotlib runs with the
Agg backend (no display needed); files are written atomically.

Example::

    >>> plot_speedup(summary_rows, Path("out/speedup.png"))  # doctest: +SKIP
    >>> plot_accept_hist(records, Path("out/accept_hist.png"))  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draftwise.apps.bench.metrics import OVERALL, SummaryRow
from draftwise.apps.bench.records import DRAFTER, TurnRecord
from draftwise.apps.bench.report import atomic_write


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _label(method: str, pass_no: int, passes: int) -> str:
    return method if passes == 1 else f"{method} (pass {pass_no})"


def _save(fig: Any, path: Path) -> None:
    atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=120, bbox_inches="tight"))


def plot_speedup(rows: Sequence[SummaryRow], path: Path) -> None:
    """Grouped bar chart of speedup (mean tok/s over the baseline's) per category."""
    plt = _pyplot()
    passes = len({r.pass_no for r in rows})
    cats = list(dict.fromkeys(r.category for r in rows if r.category != OVERALL)) + [OVERALL]
    series = list(dict.fromkeys((r.method, r.pass_no) for r in rows))
    value = {(r.method, r.pass_no, r.category): r.speedup for r in rows}
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(
        figsize=(max(6.0, 1.1 * len(cats) * max(1, len(series)) ** 0.5 + 2), 4.2)
    )
    top = 1.0
    for i, (method, p) in enumerate(series):
        xs = [c + (i - (len(series) - 1) / 2) * width for c in range(len(cats))]
        ys = [value.get((method, p, c)) or 0.0 for c in cats]
        top = max(top, *ys)
        bars = ax.bar(xs, ys, width, label=_label(method, p, passes))
        ax.bar_label(bars, labels=[f"{y:.2f}" if y else "" for y in ys], fontsize=7, padding=1)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
    ax.set_xticks(
        range(len(cats)),
        cats,
        rotation=30 if len(cats) > 6 else 0,
        ha="right" if len(cats) > 6 else "center",
    )
    ax.set_ylim(0, top * 1.15)
    ax.set_ylabel("speedup over none (mean tokens/s ratio)")
    ax.set_title("Speedup per category (wall time per turn, prefill included)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside the bars
    _save(fig, path)
    plt.close(fig)


def plot_accept_hist(records: Sequence[TurnRecord], path: Path) -> None:
    """Histogram of tokens emitted per verification step, one bar series per drafter."""
    plt = _pyplot()
    passes = len({r.pass_no for r in records})
    series: dict[str, list[int]] = {}
    for r in records:
        if r.kind == DRAFTER:
            series.setdefault(_label(r.method, r.pass_no, passes), []).extend(r.accept_lengths)
    fig, ax = plt.subplots(figsize=(7, 4))
    if not series or not any(series.values()):
        ax.text(
            0.5,
            0.5,
            "no drafter was run (only the baseline and peers)",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
        ax.set_axis_off()
    else:
        top = max(max(v) for v in series.values() if v)
        width = 0.8 / len(series)
        for i, (name, lengths) in enumerate(series.items()):
            n = max(len(lengths), 1)
            share = [sum(1 for x in lengths if x == k) / n for k in range(1, top + 1)]
            mean = sum(lengths) / n
            xs = [k + (i - (len(series) - 1) / 2) * width for k in range(1, top + 1)]
            ax.bar(xs, share, width, label=f"{name} (MAT {mean:.2f}, {len(lengths)} steps)")
        ax.set_xticks(range(1, top + 1))
        ax.set_xlabel("tokens emitted per step (accepted drafts + bonus token)")
        ax.set_ylabel("share of steps")
        ax.set_title("Tokens per verification step")
        ax.legend(fontsize=8)
    _save(fig, path)
    plt.close(fig)
