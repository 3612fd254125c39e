"""The N-Grammys (k, w) grid through ``draftwise bench``: speedup and tokens per call.

Runs one ``draftwise bench`` per prompt file with every ``ngrammys:k=K,w=W`` drafter
(plus the ``none`` baseline the bench always runs), then draws, per prompt file, two
heatmaps over the grid: wall-time speedup and tokens per call (mean accepted + bonus).

The Done-when setting (>= 10 prompts per file, 128 tokens)::

    python scripts/ngrammys_grid.py --out bench/results/ngrammys-grid --max-tokens 128 \
        --limit mtbench=2,humaneval=10,gsm8k=10 --extra "--backend torch"

Example (the tiny smoke setting)::

    python scripts/ngrammys_grid.py --out runs/ngrammys --limit 1 --max-tokens 16 \\
        --ks 1,5 --ws 2,4
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from draftwise.apps.bench.records import read_results, results_path

PROMPTS = Path("/work/shared/bench/prompts")
FILES = ("mtbench", "humaneval", "gsm8k")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for bench results and PNGs")
    p.add_argument("--prompts", type=Path, default=PROMPTS, help="folder with the JSONL files")
    p.add_argument("--files", default=",".join(FILES), help="prompt files (without .jsonl)")
    p.add_argument("--ks", default="1,5,10,20", help="draft counts k")
    p.add_argument("--ws", default="2,4,8", help="draft lengths w")
    p.add_argument("--limit", default=None,
                   help="first N items of each category: N, or per file, e.g. "
                   "'mtbench=2,humaneval=10,gsm8k=10' (MT-Bench has 8 categories of 10 two-turn items)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--verify", default="auto", choices=("auto", "tree", "batch"))
    p.add_argument("--reuse", action="store_true",
                   help="skip a prompt file whose bench records are already in --out (to run files in "
                   "separate processes, then combine them into one plot)")
    p.add_argument("--extra", default="", help="more flags for draftwise bench, e.g. '--backend torch'")
    return p


def file_limit(text: str | None, name: str) -> int | None:
    """``--limit`` for one prompt file: ``'3'`` -> 3; ``'mtbench=2,gsm8k=10'`` -> per file.

    Example::

        >>> file_limit("mtbench=2,gsm8k=10", "gsm8k"), file_limit("4", "mtbench")
        (10, 4)
    """
    if text is None:
        return None
    if "=" not in text:
        return int(text)
    per = dict(item.split("=", 1) for item in text.split(","))
    return int(per[name]) if name in per else None


def spec(k: int, w: int, verify: str) -> str:
    return f"ngrammys:k={k},w={w}" + (f",verify={verify}" if verify != "auto" else "")


def run_bench(args: argparse.Namespace, name: str, ks: list[int], ws: list[int]) -> Path:
    """Run the bench for one prompt file; return its output folder."""
    out = args.out / name
    if args.reuse:
        try:
            print(f"reusing {results_path(out)}", file=sys.stderr)
            return out
        except FileNotFoundError:
            pass
    drafters = ",".join(spec(k, w, args.verify) for k in ks for w in ws)
    # budget k * w: the tree path keeps every draft (the batch path ignores the budget)
    cmd = [sys.executable, "-m", "draftwise", "bench", "--prompts", str(args.prompts / f"{name}.jsonl"),
           "--out", str(out), "--drafters", drafters, "--max-tokens", str(args.max_tokens),
           "--budget", str(max(ks) * max(ws)), "--no-progress", *args.extra.split()]
    limit = file_limit(args.limit, name)
    if limit is not None:
        cmd += ["--limit", str(limit)]
    print(" ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)
    return out


def grid(results: Path, ks: list[int], ws: list[int], verify: str) -> dict[str, list[list[float]]]:
    """{"speedup": (k, w) grid, "tokens per call": (k, w) grid} from the overall rows of
    the bench folder ``results``."""
    rows = [r for r in read_results(results)["summary"] if r["category"] == "overall"]
    by = {r["method"]: r for r in rows}
    out: dict[str, list[list[float]]] = {"speedup": [], "tokens per call": []}
    for k in ks:
        out["speedup"].append([by[spec(k, w, verify)]["speedup"] or float("nan") for w in ws])
        out["tokens per call"].append([by[spec(k, w, verify)]["mat"] or float("nan") for w in ws])
    return out


def plot(grids: dict[str, dict[str, list[list[float]]]], ks: list[int], ws: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(grids)
    fig, axes = plt.subplots(2, len(names), figsize=(4 * len(names), 7), squeeze=False)
    for j, name in enumerate(names):
        for i, metric in enumerate(("speedup", "tokens per call")):
            ax = axes[i][j]
            data = grids[name][metric]
            im = ax.imshow(data, cmap="viridis", origin="lower", aspect="auto")
            for a, row in enumerate(data):
                for b, v in enumerate(row):
                    ax.text(b, a, f"{v:.2f}", ha="center", va="center", color="w", fontsize=8)
            ax.set_xticks(range(len(ws)), [str(w) for w in ws])
            ax.set_yticks(range(len(ks)), [str(k) for k in ks])
            ax.set_xlabel("w (draft length)")
            ax.set_ylabel("k (drafts)")
            ax.set_title(f"{name}: {metric}")
            fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    args = setup_arg_parser().parse_args()
    ks, ws = _ints(args.ks), _ints(args.ws)
    grids = {}
    for name in [f.strip() for f in args.files.split(",") if f.strip()]:
        grids[name] = grid(run_bench(args, name, ks, ws), ks, ws, args.verify)
    (args.out / "grid.json").write_text(json.dumps({"ks": ks, "ws": ws, "grids": grids}, indent=1))
    plot(grids, ks, ws, args.out / "ngrammys_grid.png")
    print(f"wrote {args.out / 'ngrammys_grid.png'}", file=sys.stderr)


if __name__ == "__main__":
    main()
