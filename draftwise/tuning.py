"""Device profiles for the auto drafter: measured once per (device, backend, model, dtype)
and kept in the user's cache directory.

Example::

    model = draftwise.load()
    cost = ensure_profile(model)        # measures on first use (seconds), then reuses
    drafter = make_auto_drafter(model)  # what --drafter auto builds
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftwise.core.autotune import AutoDrafter, CostModel
from draftwise.core.costprofile import measure_cost_curve
from draftwise.core.drafters import auto_members, make_drafter
from draftwise.core.drafters.base import Drafter
from draftwise.core.drafters.frozen_table import DEFAULT_TABLE, FrozenTable
from draftwise.errors import DraftwiseError
from draftwise.models.paths import cache_dir

if TYPE_CHECKING:
    from draftwise.api import Model


def device_description(backend_name: str) -> str:
    """A human-readable name of the device a backend runs on."""
    if backend_name.startswith("torch-cuda"):
        import torch

        return f"{torch.cuda.get_device_name(0)}"
    if backend_name.startswith("mlx"):
        import mlx.core as mx

        return f"mlx {mx.default_device()} {platform.machine()}"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            found = re.search(r"model name\s*:\s*(.+)", f.read())
        cpu = found.group(1).strip() if found else cpu
    except OSError:
        pass
    threads = os.cpu_count()
    if backend_name.startswith("torch"):
        import torch

        threads = torch.get_num_threads()  # the cost curve depends on it (OMP_NUM_THREADS)
    return f"{cpu} x{threads}"


def profile_path(model: Model) -> Path:
    """Where the profile of ``model`` on this device lives."""
    device = device_description(model.backend.name)
    key = f"{device}|{model.backend.name}|{model.model_dir.resolve()}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir() / "profiles" / f"{model.model_dir.name}-{model.backend.name}-{digest}.json"


def _bar(total_label: str) -> Callable[[int, int], None]:
    def show(done: int, total: int) -> None:
        width = 30
        filled = width * done // total
        print(f"\r{total_label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}",
              end="" if done < total else "\n", file=sys.stderr, flush=True)

    return show


def tune(model: Model, quiet: bool = False, reps: int = 3) -> CostModel:
    """Measure and store the cost curve of ``model`` on this device."""
    meta = {"device": device_description(model.backend.name), "backend": model.backend.name,
            "model": str(model.model_dir)}
    progress = None if quiet else _bar("draftwise: measuring verify cost on this device")
    try:
        cost = measure_cost_curve(model.backend, reps=reps, progress=progress, meta=meta)
    finally:
        model.decoder.reset()  # profiling emptied the cache
    cost.save(profile_path(model))
    return cost


def ensure_profile(model: Model, quiet: bool = False, reps: int = 3) -> CostModel:
    """The stored profile, or a fresh measurement if there is none (or it is unreadable)."""
    path = profile_path(model)
    if path.is_file():
        try:
            return CostModel.load(path)
        except DraftwiseError as exc:
            if not quiet:
                print(f"draftwise: {exc}; measuring again", file=sys.stderr)
    return tune(model, quiet=quiet, reps=reps)


def default_cacheback(tokenizer_id: str, **options: Any) -> Drafter:
    """Cacheback with ``options``, plus the shipped frozen table when it was built for
    this tokenizer and the options neither give their own nor ask for ``table=dynamic``."""
    if "frozen_path" in options:
        options.setdefault("tokenizer_id", tokenizer_id)
    own = "frozen" in options or "frozen_path" in options or options.get("table") == "dynamic"
    if not own and options.get("ll", 1) == 1:  # the shipped table has leaders of 1 token
        try:
            options["frozen"] = FrozenTable.load(DEFAULT_TABLE, tokenizer_id)
        except DraftwiseError:
            pass  # made for another model's tokenizer: dynamic table only
    return make_drafter("cacheback", **options)


def make_auto_drafter(model: Model, quiet: bool = False) -> Drafter:
    """A precise Cacheback (3-token leaders), SSD and a broad Cacheback (1-token leaders,
    dual table when possible) in one tree, pruned each step by the device's cost curve and
    the online acceptance estimates (see ``auto_members``)."""
    cost = ensure_profile(model, quiet=quiet)
    return AutoDrafter(auto_members(default_cacheback(model.tokenizer.identity())), cost)

