"""Assets drafters need, found, built, cached and versioned in one place.

- **cost profile**: the device's verify cost curve (``draftwise tune``), per device
  description, backend mode, model and dtype; measured in seconds on first use.
- **bigram table**: the model-derived top-k next tokens of every token (N-Grammys),
  per model and tokenizer; built in minutes on first use (never inside a request).
- **frozen table**: Cacheback's shipped n-gram table, used when it was built for this
  model's tokenizer.
- **checkpoints**: trained drafter weights, per drafter name, model and tokenizer.

Files live under ``cache_dir()`` (``$DRAFTWISE_CACHE_DIR``), are written atomically and
carry a format version in their name or content, so a new version never reads an old file
and a corrupt file is rebuilt, not trusted.

Example::

    assets = model.assets
    cost = assets.cost_profile()          # measures on first use (seconds), then reuses
    table = assets.bigram_table()         # builds on first use (minutes), then loads
    assets.ready("bigram_table")          # True once built: a server may use it
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

from draftwise.core.backend import Backend
from draftwise.core.costmodel import CostModel
from draftwise.core.costprofile import measure_cost_curve
from draftwise.core.device import DeviceInfo
from draftwise.core.drafters.bigram_table import (
    BigramTable,
    TableSource,
    build_bigram_table,
    unigram_ranking,
)
from draftwise.core.drafters.frozen_table import DEFAULT_TABLE, FrozenTable
from draftwise.drafting.progress import ProgressFactory
from draftwise.errors import DraftwiseError
from draftwise.models.paths import cache_dir

PROFILE_VERSION = 2  # 2: keyed by the backend's own device description
FIRST_USE_BUDGET_S = 20.0  # a first-use profile on a slow device (mlx[cpu]) is cut to this
DRAFT_ROWS = (1, 2, 4, 8, 16)  # rows of one draft forward (a layer of <= beam nodes)
TABLE_K = 20  # bigram top-k kept per token: the paper's useful k range is <= 25
TABLE_BATCH = 512  # one-token rows per forward when building the bigram table
COST_PROFILE, BIGRAM_TABLE = "cost_profile", "bigram_table"


class Assets:
    """The assets of one loaded model on one device (see the module docstring)."""

    def __init__(
        self,
        backend: Backend,
        model_dir: str | os.PathLike[str],
        tokenizer_id: str,
        progress: ProgressFactory | None = None,
        on_backend_reset: Callable[[], None] | None = None,
        root: Path | None = None,
    ) -> None:
        self.backend = backend
        self.model_dir = Path(model_dir)
        self.tokenizer_id = tokenizer_id
        self.progress = progress
        self.on_backend_reset = on_backend_reset  # profiling empties the KV cache
        self._root = root
        self._costs: dict[bool, CostModel] = {}  # by sampling path (True: with logits)
        self._stored: set[bool] = set()  # paths whose curve is a file (replace_drifted)
        self._bigram: BigramTable | None = None
        self._frozen: FrozenTable | None | bool = False  # False: not looked up yet

    @property
    def root(self) -> Path:
        return self._root if self._root is not None else cache_dir()

    @property
    def device(self) -> DeviceInfo:
        return self.backend.device_info()

    def _bar(self, label: str, quiet: bool) -> Callable[[int, int], None] | None:
        return None if quiet or self.progress is None else self.progress(label)

    # ----- cost profile -----------------------------------------------------------------
    def profile_path(self, sampling: bool = False) -> Path:
        """Where this model's cost profile on this device lives (``sampling``: the one
        measured with every row's logits on the host, the path at temperature > 0)."""
        dev = self.device
        key = f"v{PROFILE_VERSION}|{dev.key()}|{self.backend.name}|{self.model_dir.resolve()}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        kind = "-sampling" if sampling else ""
        return self.root / "profiles" / f"{self.model_dir.name}-{self.backend.name}{kind}-{digest}.json"

    def measure_cost_profile(
        self,
        reps: int = 3,
        quiet: bool = False,
        time_budget_s: float | None = None,
        sampling: bool = False,
    ) -> CostModel:
        """Measure and store the cost curve (what ``draftwise tune`` runs, in full);
        ``sampling``: verify with logits, as the sampling path does."""
        dev = self.device
        meta = {"device": dev.describe(), "backend": self.backend.name, "model": str(self.model_dir),
                "dtype": dev.dtype, "mode": dev.mode, "threads": str(dev.threads),
                "path": "sampling (logits)" if sampling else "greedy (argmax)"}
        label = "sampling " if sampling else ""
        bar = self._bar(f"draftwise: measuring {label}verify cost on this device", quiet)
        try:
            cost = measure_cost_curve(
                self.backend, reps=reps, progress=bar, meta=meta, time_budget_s=time_budget_s,
                need_logits=sampling,
            )
        finally:
            if self.on_backend_reset is not None:
                self.on_backend_reset()
        cost.save(self.profile_path(sampling))
        self._costs[sampling] = cost
        self._stored.add(sampling)
        return cost

    def cost_profile(self, quiet: bool = False, reps: int = 3, sampling: bool = False) -> CostModel:
        """The stored profile, or a fresh measurement when there is none or it is unreadable."""
        if sampling in self._costs:
            return self._costs[sampling]
        path = self.profile_path(sampling)
        if path.is_file():
            try:
                cost = CostModel.load(path)
                if not cost.plausible():  # measured while the machine was busy, say
                    raise DraftwiseError(
                        f"cost profile '{path}' costs less for more rows "
                        f"({', '.join(f'{x:.1f}' for x in cost.prior[0])} ms)"
                    )
                self._costs[sampling] = cost
                self._stored.add(sampling)
                return cost
            except DraftwiseError as exc:
                if not quiet:
                    print(f"draftwise: {exc}; measuring again", file=sys.stderr)
        # first use, on the way to a generation: bounded (``draftwise tune`` measures in full)
        return self.measure_cost_profile(
            reps=reps, quiet=quiet, time_budget_s=FIRST_USE_BUDGET_S, sampling=sampling
        )

    def replace_drifted(self) -> list[Path]:
        """Store, in place of a stored profile, the curve live timings corrected, where
        they disagree with it by more than ``costmodel.DRIFT`` (or it was implausible);
        returns the files replaced. Called after each generation."""
        replaced = []
        for sampling, cost in self._costs.items():
            if sampling in self._stored and cost.drifted:  # never a curve given by the caller
                fixed = cost.corrected()
                path = self.profile_path(sampling)
                fixed.save(path)
                cost.rebase()  # the stored curve is now the prior: drift counts from here
                replaced.append(path)
        return replaced

    def use_cost_profile(self, cost: CostModel, sampling: bool | None = None) -> None:
        """Plan with ``cost`` instead of measuring (replays, tests); ``None``: for both
        the greedy and the sampling path."""
        for kind in (False, True) if sampling is None else (sampling,):
            self._costs[kind] = cost
            self._stored.discard(kind)  # the caller's curve: learnt from, never written

    # ----- draft model forward cost -------------------------------------------------------
    def draft_profile_path(self, draft_key: str) -> Path:
        """Where the forward cost curve of the draft model ``draft_key`` lives (per device,
        backend, target model and draft: e.g. ``'early-exit|layers=8|head=0'``)."""
        dev = self.device
        key = f"v{PROFILE_VERSION}|{dev.key()}|{self.backend.name}|{self.model_dir.resolve()}"
        digest = hashlib.sha256(f"{key}|{draft_key}".encode()).hexdigest()[:16]
        name = f"draft-{self.model_dir.name}-{self.backend.name}-{digest}.json"
        return self.root / "profiles" / name

    def draft_cost_profile(self, lm: Backend, draft_key: str, quiet: bool = False) -> CostModel:
        """The draft model's forward ms per tree rows (``auto`` sizes draft trees with it
        and the target's ``cost_profile``): stored, or measured now (bounded, seconds)."""
        path = self.draft_profile_path(draft_key)
        if path.is_file():
            try:
                return CostModel.load(path)
            except DraftwiseError as exc:
                if not quiet:
                    print(f"draftwise: {exc}; measuring again", file=sys.stderr)
        meta = {"device": self.device.describe(), "backend": self.backend.name,
                "model": str(self.model_dir), "draft": draft_key}
        bar = self._bar("draftwise: measuring the draft model's cost", quiet)
        cost = measure_cost_curve(lm, rows=DRAFT_ROWS, contexts=(256,), reps=3, progress=bar,
                                  meta=meta, time_budget_s=FIRST_USE_BUDGET_S)
        cost.save(path)
        return cost

    # ----- bigram table -----------------------------------------------------------------
    def bigram_path(self) -> Path:
        """Where this model's bigram table lives (per model directory and tokenizer)."""
        tok = self.tokenizer_id[:16]
        return self.root / "tables" / f"bigram-{self.model_dir.name}-{tok}.npz"

    def build_bigram_table(self, k: int = TABLE_K, quiet: bool = False) -> BigramTable:
        """Build the table from the model (no disk access)."""
        src = self.backend
        if not isinstance(src, TableSource):
            raise DraftwiseError(f"backend {self.backend.name!r} cannot build a bigram table (no next_topk)")
        uni = unigram_ranking(*src.embeddings())
        return build_bigram_table(
            lambda ids: src.next_topk(ids, k), self.backend.vocab_size, k, TABLE_BATCH, uni,
            self._bar("bigram table", quiet),
        )

    def bigram_table(self, quiet: bool = False) -> BigramTable:
        """This model's cached table, or build and cache it (minutes on a CPU)."""
        if self._bigram is not None:
            return self._bigram
        path = self.bigram_path()
        if path.exists():
            try:
                self._bigram = BigramTable.load(path, self.tokenizer_id)
                return self._bigram
            except DraftwiseError as exc:
                if not quiet:
                    print(f"rebuilding the bigram table: {exc}", file=sys.stderr)
        table = self.build_bigram_table(quiet=quiet)
        path.parent.mkdir(parents=True, exist_ok=True)
        table.save(path, self.tokenizer_id)
        self._bigram = table
        return table

    # ----- frozen Cacheback table ---------------------------------------------------------
    def frozen_table(self) -> FrozenTable | None:
        """The shipped frozen table when it was built for this tokenizer, else None."""
        if self._frozen is False:
            try:
                self._frozen = FrozenTable.load(DEFAULT_TABLE, self.tokenizer_id)
            except DraftwiseError:
                self._frozen = None  # made for another model's tokenizer
        assert self._frozen is not False
        return self._frozen

    # ----- trained drafter checkpoints ----------------------------------------------------
    def checkpoint_dir(self, drafter: str) -> Path:
        """Where a trained drafter's checkpoint for this model and tokenizer is cached."""
        return self.root / "drafters" / f"{drafter}-{self.model_dir.name}-{self.tokenizer_id[:16]}"

    # ----- what can be used without a long build --------------------------------------------
    def ready(self, asset: str) -> bool:
        """Whether ``asset`` is in memory or on disk, so using it costs no build."""
        if asset == COST_PROFILE:
            return False in self._costs or self.profile_path().is_file()
        if asset == BIGRAM_TABLE:
            return self._bigram is not None or self.bigram_path().is_file()
        raise DraftwiseError(f"unknown asset {asset!r}")


# ----- the default compute mode, as ``draftwise tune --modes`` measured it ----------------
def modes_path(root: Path | None = None) -> Path:
    return (root if root is not None else cache_dir()) / "profiles" / "default_mode.json"


def recorded_mode(key: str, root: Path | None = None) -> dict[str, object] | None:
    """The mode ``draftwise tune --modes`` recorded for device ``key``, or None."""
    import json

    path = modes_path(root)
    try:
        entry = json.loads(path.read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None  # none recorded (or unreadable): the built-in rule applies
    if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str):
        return None
    return entry


def record_mode(key: str, entry: dict[str, object], root: Path | None = None) -> Path:
    """Store ``entry`` (dtype, invariant, measured ms) for device ``key``, atomically."""
    import json

    from draftwise.core.atomic import atomic_file

    path = modes_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        table = json.loads(path.read_text())
        table = table if isinstance(table, dict) else {}
    except (OSError, ValueError):
        table = {}
    table[key] = entry
    with atomic_file(path, "w") as f:
        json.dump(table, f, indent=1)
    return path

