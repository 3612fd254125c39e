"""Plot a Cacheback LL x FL sweep (seed 000, Figure 4) from a `draftwise bench` folder.

    python scripts/plot_ll_fl.py bench/results/cacheback-ll-fl

Methods named ``cacheback:ll=L,fl=F,...`` are placed on an LL x FL grid; the figure
shows overall speedup over `none` and MAT, both from that one bench run.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from draftwise.apps.bench.records import read_results  # noqa: E402


def main(folder: str) -> None:
    out = Path(folder)
    data = read_results(out)
    rows = [s for s in data["summary"] if s["category"] == "overall" and s["pass_no"] == 1]
    grid: dict[tuple[int, int], dict] = {}
    for s in rows:
        m = re.match(r"cacheback:ll=(\d+),fl=(\d+)", s["method"])
        if m:
            grid[(int(m.group(1)), int(m.group(2)))] = s
    lls = sorted({k[0] for k in grid})
    fls = sorted({k[1] for k in grid})
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key, title in ((axes[0], "speedup", "speedup over none"), (axes[1], "mat", "MAT")):
        z = np.array([[grid[(ll, fl)][key] for fl in fls] for ll in lls])
        im = ax.imshow(z, cmap="viridis", origin="lower")
        ax.set_xticks(range(len(fls)), [f"FL={f}" for f in fls])
        ax.set_yticks(range(len(lls)), [f"LL={v}" for v in lls])
        for i in range(len(lls)):
            for j in range(len(fls)):
                ax.text(j, i, f"{z[i, j]:.2f}", ha="center", va="center", color="w", fontsize=9)
        ax.set_title(title)
        fig.colorbar(im, ax=ax, shrink=0.8)
    cfg = data["config"]
    fig.suptitle(f"Cacheback LL x FL (dynamic table), {cfg.get('max_tokens')} tokens, "
                 f"backend {cfg.get('backend', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "ll_fl.png", dpi=110)
    best = max(grid.items(), key=lambda kv: kv[1]["speedup"])
    best_mat = max(grid.items(), key=lambda kv: kv[1]["mat"])
    print(f"best speedup: LL={best[0][0]} FL={best[0][1]} {best[1]['speedup']:.2f}x; "
          f"best MAT: LL={best_mat[0][0]} FL={best_mat[0][1]} {best_mat[1]['mat']:.2f}")


if __name__ == "__main__":
    main(sys.argv[1])
