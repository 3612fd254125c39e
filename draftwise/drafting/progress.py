"""Progress bars for slow, one-off builds (cost profiles, bigram tables), via tqdm.

A *progress factory* takes a label and returns a ``(done, total)`` callback, the form
the core's builders report in; ``None`` means silent.

Example::

    bar = tqdm_progress("bigram table")   # a tqdm bar on stderr
    for i in range(1, 11):
        bar(i, 10)                        # closes itself when done == total
"""

from __future__ import annotations

import sys
from collections.abc import Callable

Progress = Callable[[int, int], None]
ProgressFactory = Callable[[str], Progress]


def tqdm_progress(label: str) -> Progress:
    """A ``(done, total)`` callback drawing a tqdm bar on stderr (plain lines without tqdm)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm comes with the torch, mlx and apps extras
        def plain(done: int, total: int) -> None:
            if done == total:
                print(f"{label}: {done}/{total}", file=sys.stderr, flush=True)

        return plain

    bar = None

    def show(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc=label, file=sys.stderr, leave=True, dynamic_ncols=True)
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return show
