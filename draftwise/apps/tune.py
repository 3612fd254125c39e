"""``draftwise tune``: measure how verify time grows with draft-tree size on this device.

The auto drafter (``--drafter auto``) plans every step with this curve. It is measured
automatically on first use and stored per (device, backend, model, dtype) in the cache
directory; run this command to refresh it (after a driver update, say) or to see it.

Example::

    draftwise tune --backend torch --dtype bfloat16
    draftwise tune --sampling        # the curve auto uses at temperature > 0
"""

from __future__ import annotations

import argparse
import json

from draftwise.apps.common import add_model_args


def setup_arg_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="draftwise tune", description=__doc__)
    add_model_args(p)
    p.add_argument("--reps", type=int, default=3, help="timed repeats per point (default: 3)")
    p.add_argument("--show", action="store_true", help="print the stored profile; measure only if none")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")
    p.add_argument(
        "--modes",
        action="store_true",
        help="measure every lossless torch mode (float32, bfloat16 invariant), record the "
        "faster as this device's default (used when no --dtype is given)",
    )
    p.add_argument(
        "--sampling",
        action="store_true",
        help="the sampling path's curve (verify with logits, what auto plans with at "
        "temperature > 0) instead of the greedy one",
    )
    return p


def main(args: argparse.Namespace) -> int:
    import draftwise
    from draftwise.errors import DraftwiseError

    if args.reps < 1:
        raise DraftwiseError(f"--reps must be >= 1, got {args.reps}")
    if args.modes:
        return _modes(args)
    model = draftwise.load(
        args.model, backend=args.backend, dtype=args.dtype, invariant=args.invariant
    )
    assets = model.assets
    smp = args.sampling
    if args.show:
        cost = assets.cost_profile(sampling=smp)
    else:
        cost = assets.measure_cost_profile(reps=args.reps, sampling=smp)
    if args.json:
        print(json.dumps(cost.to_json()))
        return 0
    print(f"profile: {assets.profile_path(smp)}  ({'sampling' if smp else 'greedy'} path)")
    print(f"device:  {cost.meta.get('device', '?')}  backend: {cost.meta.get('backend', '?')}  "
          f"mode: {cost.meta.get('mode', '?')}")
    header = "rows".rjust(8) + "".join(f"ctx {int(c)}".rjust(12) for c in cost.contexts)
    print(header)
    for j, r in enumerate(cost.rows.astype(int)):
        print(f"{r:8d}" + "".join(f"{cost.ms[i, j]:10.1f}ms" for i in range(len(cost.contexts))))
    return 0


def _modes(args: argparse.Namespace) -> int:
    from draftwise.api import measure_modes
    from draftwise.errors import DraftwiseError

    if args.dtype is not None or args.show or args.backend not in ("auto", "torch", "cuda"):
        raise DraftwiseError("--modes measures the torch modes itself: drop --dtype/--show/--backend")
    table, pick, path = measure_modes(args.model, reps=args.reps)
    if args.json:
        print(json.dumps({"ms": table, "pick": pick, "record": str(path)}))
        return 0
    rows = sorted(next(iter(table.values())))
    print("ms per verify at the first profiled context, by rows".rjust(8))
    print("mode".ljust(22) + "".join(f"{r:>9d}" for r in rows))
    for name, ms in table.items():
        print(name.ljust(22) + "".join(f"{ms[r]:9.1f}" for r in rows))
    print(f"default mode on this device: {pick} (recorded in {path})")
    return 0

