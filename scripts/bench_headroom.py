"""How far a finished ``draftwise bench`` run is from a target speedup, and what could
close the gap: a drafter's cost (drafting, host work) or its acceptance (MAT).

Read from the run's per-turn records (``results.json.gz``), for each drafter method
against the baseline (``none``) of the same run, over the turns both have:

- **measured**: the speedup (total wall times; the bench's ``speedup``), the median of the
  per-turn ratios (its ``median``), the decode-only ratio, MAT, and per step the verify,
  the drafting and the **other** host work (the wall time outside prefill, drafting and
  verify: the decoding loop's bookkeeping, a drafter's ``update``);
- **what if** (the same MAT and trees): drafting took no time; drafting took no time and
  the other host work were the baseline's per step;
- **MAT needed** for each ``--targets`` speedup, at the method's own prefill and per-step
  costs (drafting included, then without it). Deeper trees cost more to draft and verify,
  so the real need is higher: these are lower bounds. "prefill" when the prompt's prefill
  alone takes more than the target allows.

A what-if is arithmetic on the records (no decoding is run): it says which lever can reach
a target at all. Example (``bench/results/specbench-4bit-zen4/session-s/done-when``, an AMD
EPYC Zen 4): `auto` measured 1.27x (median 1.25x); with drafting free 1.38x (1.37x); its
MAT 2.03 where 1.5x needs at least 2.52 (2.27 with drafting free): there the acceptance,
not the drafting, is what is missing.

Example::

    python scripts/bench_headroom.py bench/results/specbench-4bit-zen4/session-s/done-when \\
        --targets 1.3,1.5
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from draftwise.apps.bench.records import read_results  # noqa: E402


def _tps(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def mean_ratio(walls: list[float], tokens: list[int], base: list[tuple[int, float]]) -> float:
    """The bench's ``speedup``: the mean of the turns' tokens/s (``walls`` seconds each)
    over the baseline's mean over the same turns (``base``: (tokens, seconds) a turn)."""
    mine = statistics.fmean(_tps(n, w) for n, w in zip(tokens, walls, strict=True))
    return mine / statistics.fmean(_tps(n, w) for n, w in base)


def mat_needed(
    prefill: list[float], steps: list[int], step_s: list[float], tokens: list[int],
    base: list[tuple[int, float]], target: float,
) -> float | None:
    """The MAT at which turns of ``prefill`` seconds, ``steps`` decoding steps of
    ``step_s`` seconds each and ``tokens`` tokens reach ``target`` x the baseline's speedup
    (``mean_ratio``) when every turn needs its steps divided by one factor (prefill and
    per-step costs held); None where the prefill alone is too slow for the target.

    Example: the baseline a turn of 100 tokens in 1.0 s; the method the same 100 tokens
    with 0.2 s of prefill and 50 steps of 12 ms (MAT 2.0, 1.25x). 1.5x allows 1 / 1.5 -
    0.2 = 0.467 s of steps: 38.9 of them, MAT 2.57.

        >>> round(mat_needed([0.2], [50], [0.012], [100], [(100, 1.0)], 1.5), 2)
        2.57
    """
    def ratio(k: float) -> float:  # the speedup with every turn's steps x k
        walls = [p + k * n * s for p, n, s in zip(prefill, steps, step_s, strict=True)]
        return mean_ratio(walls, tokens, base)

    if ratio(1e-9) <= target:  # not even with (almost) no steps at all
        return None
    lo, hi = 1e-9, 1.0  # ratio(lo) > target; grow hi until ratio(hi) <= target
    while ratio(hi) > target:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ratio(mid) > target else (lo, mid)
    return sum(tokens) / (hi * sum(steps))


def _step_other(r: dict[str, Any]) -> float:
    """A turn's seconds outside prefill, drafting and verify (never below 0: jitter)."""
    return max(0.0, r["wall_s"] - r["prefill_s"] - (r["draft_ms"] + r["verify_ms"]) / 1e3)


def method_row(
    method: str, ms: list[dict[str, Any]], bs: list[dict[str, Any]], targets: list[float]
) -> dict[str, Any]:
    """The measures of one method's turns ``ms`` against the baseline's same turns ``bs``."""
    base = [(q["tokens"], q["wall_s"]) for q in bs]
    tokens, steps = [r["tokens"] for r in ms], [r["steps"] for r in ms]
    prefill, wall = [r["prefill_s"] for r in ms], [r["wall_s"] for r in ms]
    draft = [r["draft_ms"] / 1e3 for r in ms]
    verify = [r["verify_ms"] / 1e3 for r in ms]
    b_other = sum(_step_other(q) for q in bs) / sum(q["steps"] for q in bs)  # s a step
    no_draft = [w - d for w, d in zip(wall, draft, strict=True)]
    lean = [p + v + n * b_other for p, v, n in zip(prefill, verify, steps, strict=True)]
    step_s = [(w - p) / n for w, p, n in zip(wall, prefill, steps, strict=True)]
    step_nd = [s - d / n for s, d, n in zip(step_s, draft, steps, strict=True)]
    n_steps = sum(steps)

    def median_of(walls: list[float]) -> float:
        pairs = zip(tokens, walls, base, strict=True)
        return statistics.median(_tps(n, w) / _tps(*b) for n, w, b in pairs)

    return {
        "method": method,
        "turns": len(ms),
        "identical": sum(r.get("token_ids") == q.get("token_ids")
                         for r, q in zip(ms, bs, strict=True)),
        "speedup": mean_ratio(wall, tokens, base),
        "median": median_of(wall),
        "decode": mean_ratio([w - p for w, p in zip(wall, prefill, strict=True)], tokens,
                             [(q["tokens"], q["wall_s"] - q["prefill_s"]) for q in bs]),
        "mat": sum(tokens) / n_steps,
        "verify_ms": 1e3 * sum(verify) / n_steps,
        "draft_ms": 1e3 * sum(draft) / n_steps,
        "other_ms": 1e3 * sum(_step_other(r) for r in ms) / n_steps,
        "base_other_ms": 1e3 * b_other,
        "prefill_share": sum(q["prefill_s"] for q in bs) / sum(q["wall_s"] for q in bs),
        "free_draft": mean_ratio(no_draft, tokens, base),
        "free_draft_median": median_of(no_draft),
        "free_host": mean_ratio(lean, tokens, base),
        "needed": {t: (mat_needed(prefill, steps, step_s, tokens, base, t),
                       mat_needed(prefill, steps, step_nd, tokens, base, t)) for t in targets},
    }


def headroom(results: dict[str, Any], baseline: str, targets: list[float]) -> list[dict[str, Any]]:
    """One row per drafter method of a bench run (``read_results``), as described above
    (``method_row``), over the turns it shares with ``baseline``."""
    by: dict[str, dict[tuple[int, str, int], dict[str, Any]]] = {}
    for r in results["records"]:
        if r.get("kind") in ("baseline", "drafter") and r.get("steps"):
            by.setdefault(r["method"], {})[(r.get("pass_no", 1), r["prompt_id"], r["turn"])] = r
    if baseline not in by:
        raise SystemExit(
            f"no records of the baseline {baseline!r} in this run (methods: {sorted(by)})")
    rows = []
    for method, recs in by.items():
        keys = sorted(recs.keys() & by[baseline].keys())
        if method != baseline and keys:
            ms, bs = [recs[k] for k in keys], [by[baseline][k] for k in keys]
            rows.append(method_row(method, ms, bs, targets))
    return rows


def _mat(v: float | None) -> str:
    return "prefill" if v is None else f"{v:.2f}"


def markdown(rows: list[dict[str, Any]], targets: list[float]) -> str:
    """The rows as two markdown tables: measured, then what-if and MAT needed."""
    out = [
        "| method | turns | identical | speedup | median | decode | MAT | verify ms | draft ms "
        "| other ms (baseline's) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        out.append(
            f"| `{r['method']}` | {r['turns']} | {r['identical']}/{r['turns']} "
            f"| {r['speedup']:.2f}x | {r['median']:.2f}x | {r['decode']:.2f}x | {r['mat']:.2f} "
            f"| {r['verify_ms']:.2f} | {r['draft_ms']:.2f} "
            f"| {r['other_ms']:.2f} ({r['base_other_ms']:.2f}) |"
        )
    share = rows[0]["prefill_share"] if rows else 0.0
    out += ["", f"Prefill: {100 * share:.1f}% of the baseline's wall time.", ""]
    heads = " | ".join(f"MAT for {t:g}x (drafting free)" for t in targets)
    out += [
        f"| method | drafting free | its median | drafting and extra host work free | {heads} |",
        "|---|--:|--:|--:|" + "--:|" * len(targets),
    ]
    for r in rows:
        need = " | ".join(f"{_mat(a)} ({_mat(b)})" for a, b in (r["needed"][t] for t in targets))
        out.append(
            f"| `{r['method']}` | {r['free_draft']:.2f}x | {r['free_draft_median']:.2f}x "
            f"| {r['free_host']:.2f}x | {need} |"
        )
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bench", type=Path, help="a draftwise bench output folder")
    p.add_argument("--baseline", default="none")
    p.add_argument("--targets", default="1.3,1.5", help="comma-separated target speedups")
    args = p.parse_args()
    try:
        targets = [float(t) for t in args.targets.split(",")]
    except ValueError:
        raise SystemExit(
            f"--targets must be numbers separated by commas, got {args.targets!r}") from None
    if not targets or any(not t > 0 for t in targets):
        raise SystemExit(f"--targets must be numbers > 0, got {args.targets!r}")
    try:
        results = read_results(args.bench)
    except FileNotFoundError as e:
        raise SystemExit(str(e)) from None
    print(markdown(headroom(results, args.baseline, targets), targets))


if __name__ == "__main__":
    main()
