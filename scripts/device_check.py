"""The GPU check of issue 39 as one command: what a lent H100/H200 session runs first.

Models with random weights of real shapes are built on the device in bfloat16 from their
published configs (no download, nothing read from ``../shared``, which does not travel);
prompts are token ids, the tokenizer a word-level stand-in made at run time. Sections,
each timed and caught on its own (a failing one is reported, the rest still run):

1. the machine: GPU, driver, torch and CUDA versions;
2. ``pytest -m cuda`` (the tests that need a GPU; they skip without one);
3. the verify cost curve: ms per step at 1..64 rows at context 512, per shape, and the
   bandwidth floor (weight bytes over the device copy bandwidth measured here), and the
   step with other switches (``VARIANTS``: every one on the largest shape);
4. plain decoding: draftwise ``none`` against transformers' ``generate`` (eager, and
   with ``cache_implementation="static"``) on the same weights, tokens/s;
5. identity on the GPU: ``cacheback``, ``ssd``, ``auto``, ``redrafter`` (a random
   network), ``draft`` (early exit) and ``card`` greedy equal ``none``; seeded T = 0.8
   equal ``none``.

Asked for by ``--only``: ``profile`` (the largest shape's one-row step under torch's
profiler), ``gemms`` (each of its linear layers alone, timed in CUDA graphs, with a
sweep of tiles and split-K), ``long`` (its step with an 8,192-slot limit at a short and a
long context), ``best`` (after ``curves``: the fastest variant whose buckets agree, then
identity, the probe and the profile under its switches), ``buckets`` and ``compiled``.
``--set DRAFTWISE_X=V,DRAFTWISE_Y=...`` sets switches for the whole run. A short table is printed
last; ``device_check.json`` and ``device_check.md`` go to ``$OUT`` (or ``--out``) when set.

Example::

    python scripts/device_check.py                         # on the GPU machine
    python scripts/device_check.py --device cpu --tiny     # the CPU smoke test (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback

# the curves section's extra runs of the largest shape's Triton step (environment switches):
# the default step (64-row GEMM tiles, the attention kernel) against the earlier choices
VARIANTS = {
    # on top of the default (or --set); the earlier calls' variants are in this file's history
    "PDL off": {"DRAFTWISE_PDL": "0"},
    "chunks of 256": {"DRAFTWISE_ATTN_CHUNK": "256"},
    "attention pipelined, 3 stages": {"DRAFTWISE_ATTN_PIPE": "3"},
}
SMALL_VARIANTS = ("PDL off",)
VARIANT_ROWS = (1, 4, 16, 64)  # the row counts a variant's curve is timed at
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the device machine runs the working tree, not an install

# published sizes (their config.json; the same as ../shared/model-shapes.json, which a
# test compares), plus a tiny shape for the CPU smoke test
SHAPES: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
                         rope_theta=100000.0, tie_word_embeddings=True),
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                         vocab_size=128256, rope_theta=500000.0, tie_word_embeddings=True,
                         rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                           high_freq_factor=4.0,
                                           original_max_position_embeddings=8192)),
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                         rope_theta=500000.0, tie_word_embeddings=False,
                         rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                           high_freq_factor=4.0,
                                           original_max_position_embeddings=8192)),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                 rope_theta=10000.0, tie_word_embeddings=True),
}
COMMON = dict(model_type="llama", rms_norm_eps=1e-5, max_position_embeddings=131072,
              bos_token_id=None, eos_token_id=None, pad_token_id=None)
DRAFTERS = ("cacheback", "ssd", "auto", "redrafter", "draft:layers=4", "card:layers=4")


@contextmanager
def switched(env: dict[str, str]) -> Iterator[None]:
    """``DRAFTWISE_*`` switches set for a block, then as they were (``--set``'s included)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def config_of(shape: str) -> dict[str, Any]:
    return {**COMMON, **SHAPES[shape]}


class Check:
    """Runs the sections, keeps their results and the table rows."""

    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        self.args = args
        self.device = torch.device(args.device)
        self.dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        self.results: dict[str, Any] = {"args": vars(args)}
        self.rows: list[tuple[str, str]] = []

    def section(self, name: str, fn: Callable[[], Any]) -> None:
        t0 = time.perf_counter()
        try:
            self.results[name] = fn()
            status = "ok"
        except Exception as exc:  # one section's failure must not hide the others
            self.results[name] = {"error": f"{type(exc).__name__}: {exc}",
                                  "trace": traceback.format_exc(limit=6)}
            status = f"FAILED: {type(exc).__name__}: {str(exc)[:160]}"
        secs = time.perf_counter() - t0
        self.results.setdefault("seconds", {})[name] = round(secs, 1)
        print(f"[{name}] {status} ({secs:.1f} s)", flush=True)
        if status != "ok":
            self.rows.append((name, status))
        self.write()  # after every section: a run cut short still leaves its results

    # ----- models ----------------------------------------------------------------------
    def build(self, shape: str, ctx: int, with_hf: bool = False, graphs: bool = True) -> tuple[Any, Any]:
        """(TorchBackend, transformers model or None) on the same random weights;
        ``graphs``: fixed-shape steps (CUDA graphs on the GPU, eager on CPU)."""
        import torch
        import transformers

        from draftwise.backends.cuda import TorchBackend
        from draftwise.backends.cuda.gpu.graphs import BUCKETS, StepGraphs
        from draftwise.backends.cuda.llama import Llama, LlamaConfig

        cfg = config_of(shape)
        hf_cfg = transformers.LlamaConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
        torch.manual_seed(0)
        with torch.device(self.device):
            hf = transformers.LlamaForCausalLM(hf_cfg).to(self.dtype).eval()
        weights = {k: v.detach() for k, v in hf.state_dict().items()}
        if cfg["tie_word_embeddings"]:
            weights.pop("lm_head.weight", None)
        slots = ctx + (max(BUCKETS) if graphs else 0)
        model = Llama(LlamaConfig.from_dict(cfg), weights, self.dtype, self.device, slots)
        backend = TorchBackend(model, ctx, invariant=False, graphs=StepGraphs(model) if graphs else None)
        if not with_hf:
            del hf
            return backend, None
        return backend, hf

    def sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()

    # ----- sections ----------------------------------------------------------------------
    def machine(self) -> dict[str, Any]:
        import torch

        out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                               "cuda": torch.version.cuda, "device": str(self.device)}
        if self.device.type == "cuda":
            out["gpu"] = torch.cuda.get_device_name(self.device)
            props = torch.cuda.get_device_properties(self.device)
            out["memory_gib"] = round(props.total_memory / 2**30, 1)
            out["sms"] = props.multi_processor_count
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            out["driver"] = smi.stdout.strip()
        else:
            out["cpu"] = platform.processor() or platform.machine()
        self.rows.append(("machine", f"{out.get('gpu', out.get('cpu'))}, torch {out['torch']}, "
                                     f"CUDA {out['cuda']}, driver {out.get('driver', '-')}"))
        return out

    def cuda_tests(self) -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p",
                               "no:cacheprovider", "tests"], cwd=ROOT, capture_output=True,
                              text=True, timeout=self.args.pytest_timeout)
        tail = done.stdout.strip().splitlines()[-1:] or [""]
        self.rows.append(("pytest -m cuda", f"exit {done.returncode}: {tail[0]}"))
        if done.returncode not in (0, 5):
            raise RuntimeError(f"pytest -m cuda exit {done.returncode}: {done.stdout[-2000:]}")
        return {"exit": done.returncode, "summary": tail[0]}

    def curves(self) -> dict[str, Any]:
        import torch

        from draftwise.core.costprofile import measure_cost_curve

        out: dict[str, Any] = {}
        bw = self.copy_bandwidth()
        out["copy_GBps"] = round(bw / 1e9, 1)
        for shape in self.args.shapes:
            be, _ = self.build(shape, self.args.context + 128)
            weight_bytes = sum(t.numel() * t.element_size() for t in self.tensors(be.model))
            # the backend's own verify (what decoding runs): fixed-shape graph steps ...
            cost = measure_cost_curve(be, rows=self.args.rows, contexts=(self.args.context,),
                                      reps=self.args.reps)
            ms = [round(float(x), 3) for x in cost.ms[0]]
            floor = weight_bytes / bw * 1e3
            # ... and the eager forward on the same weights (no graphs, no padding)
            graphs, be.graphs, be.max_tree_nodes = be.graphs, None, None
            eager = measure_cost_curve(be, rows=self.args.rows, contexts=(self.args.context,),
                                       reps=self.args.reps)
            be.graphs = graphs
            eager_ms = [round(float(x), 3) for x in eager.ms[0]]
            torch_ms, torch_buckets = None, None
            if graphs.kernels == "triton":  # the same step on torch's kernels (cuBLAS), as before
                from draftwise.backends.cuda.gpu.graphs import StepGraphs

                fast = be.model.rowinv
                be.graphs = StepGraphs(be.model, kernels="torch")
                tcost = measure_cost_curve(be, rows=self.args.rows, contexts=(self.args.context,),
                                           reps=self.args.reps)
                torch_ms = [round(float(x), 3) for x in tcost.ms[0]]
                torch_buckets = list(be.graphs.buckets)
                be.graphs, be.model.rowinv = graphs, fast
            variants: dict[str, Any] = {}
            # every variant on the largest shape; the smaller ones' steps are launch-bound,
            # so there the variant that launches fewer kernels
            chosen = VARIANTS if shape == self.args.shapes[-1] else {k: VARIANTS[k] for k in SMALL_VARIANTS}
            if graphs.kernels == "triton":
                # the same step with 64-row GEMM tiles (a 64-row tree reads each weight once)
                # and/or the attention kernel in place of SDPA; every bucket must still give
                # a row the same bits (asked at the first step: rows_agree)
                from draftwise.backends.cuda.gpu.graphs import StepGraphs

                fast = be.model.rowinv
                for name, env in chosen.items():
                    # the switches stay set while the step is timed: tiles are chosen at
                    # the first call of each GEMM (RowInvariant.mm), inside the capture
                    try:
                        with switched(env):
                            be.graphs = StepGraphs(be.model, kernels="triton")
                            # the buckets' row counts (1, 4, 16, 64 where they are in the
                            # main curve's rows): what decides a default, in about half the time
                            vrows = tuple(r for r in self.args.rows if r in VARIANT_ROWS) or self.args.rows
                            vcost = measure_cost_curve(be, rows=vrows, contexts=(self.args.context,),
                                                       reps=self.args.reps)
                        variants[name] = {"rows": list(vrows),
                                          "graph_ms": [round(float(x), 3) for x in vcost.ms[0]],
                                          "rows_agree": be.graphs.agree, "buckets": list(be.graphs.buckets)}
                    except Exception as exc:  # reported, the rest of the run goes on
                        variants[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                    finally:
                        be.graphs, be.model.rowinv = graphs, fast
            one = ms[0]
            out[shape] = {"rows": list(self.args.rows), "graph_ms": ms, "eager_ms": eager_ms,
                          "variants": variants,
                          "weight_GB": round(weight_bytes / 1e9, 2), "floor_ms": round(floor, 3),
                          "buckets": list(graphs.buckets), "rows_agree": graphs.agree,
                          "kernels": graphs.kernels, "torch_graph_ms": torch_ms,
                          "torch_buckets": torch_buckets,
                          "one_row_over_floor": round(one / floor, 2),
                          "over_one_row": [round(m / one, 2) for m in ms]}
            self.rows.append((f"graphs {shape}", " / ".join(f"{m:.2f}" for m in ms)
                              + f" ms at {','.join(map(str, self.args.rows))} rows; floor {floor:.2f} ms"
                              + f" (1 row {one / floor:.2f}x floor; {graphs.kernels} kernels, buckets "
                              + f"{list(graphs.buckets)})"))
            if torch_ms:
                self.rows.append((f"graphs {shape}, torch kernels", " / ".join(f"{m:.2f}" for m in torch_ms)
                                  + f" ms (buckets {torch_buckets})"))
            for name, v in variants.items():
                self.rows.append((f"graphs {shape}, {name}", v.get("error") or (
                    " / ".join(f"{m:.2f}" for m in v["graph_ms"])
                    + f" ms at {','.join(map(str, v['rows']))} rows (rows agree: {v['rows_agree']}, "
                    + f"buckets {v['buckets']})")))
            self.rows.append((f"eager {shape}", " / ".join(f"{m:.2f}" for m in eager_ms) + " ms"))
            del be
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        return out

    def best(self) -> dict[str, Any]:
        """After ``curves``: the largest shape's fastest variant at one row among those
        whose every bucket agrees and whose 16- and 64-row steps are no slower than the
        default's (3% noise allowed), then identity on both identity shapes, the
        row-invariance probe and the profile under its switches: what a default must
        pass, in the same call."""
        curves = self.results.get("curves") or {}
        shape = self.args.shapes[-1]
        main = curves.get(shape) if isinstance(curves, dict) else None
        if not main or "graph_ms" not in main:
            return {"skipped": "needs the curves section"}
        at = dict(zip(main["rows"], main["graph_ms"]))
        pick, pick_ms = None, at[main["rows"][0]]
        for name, v in main["variants"].items():
            if "graph_ms" not in v or not v["rows_agree"] or v["buckets"] != main["buckets"]:
                continue
            vat = dict(zip(v["rows"], v["graph_ms"]))
            wide = [r for r in vat if r > 1 and r in at]
            if all(vat[r] <= 1.03 * at[r] for r in wide) and vat[v["rows"][0]] < pick_ms:
                pick, pick_ms = name, vat[v["rows"][0]]
        out: dict[str, Any] = {"variant": pick, "env": VARIANTS.get(pick, {}), "one_row_ms": pick_ms}
        self.rows.append((f"best {shape}", f"{pick or 'the default'}: {pick_ms:.2f} ms at one row"))
        if pick is None:
            return out
        first = len(self.rows)
        with switched(VARIANTS[pick]):
            for name, fn in (("identity", self.identity), ("identity-large", self.identity_large),
                             ("probe", self.probe), ("profile", self.profile)):
                try:
                    out[name] = fn()
                except Exception as exc:  # reported; the others still run
                    out[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                    self.rows.append((name, out[name]["error"]))
        self.rows[first:] = [(f"best: {k}", v) for k, v in self.rows[first:]]
        return out

    def long(self) -> dict[str, Any]:
        """The largest shape with a long context limit: ms per step at 1, 16 and 64 rows at
        a short and a long context, the default step (whose attention kernel stops at the
        step's last slot), its attention in chunks walked side by side, and SDPA (which
        attends over every slot of the limit)."""
        import torch

        from draftwise.backends.cuda.gpu.graphs import StepGraphs
        from draftwise.core.costprofile import measure_cost_curve

        shape = self.args.shapes[-1]
        limit = 64 * self.args.context if self.args.tiny else 8192
        contexts = (self.args.context, limit - 256)
        rows = (1, 16, 64) if not self.args.tiny else (1, 4)
        be, _ = self.build(shape, limit)
        out: dict[str, Any] = {"shape": shape, "limit": limit, "contexts": list(contexts), "rows": list(rows)}
        fast = getattr(be.model, "rowinv", None)
        for name, env in (("default", {}), ("one program a kv head", {"DRAFTWISE_ATTN_CHUNK": "0"}),
                          ("chunks of 128 slots", {"DRAFTWISE_ATTN_CHUNK": "128"}),
                          ("SDPA", {"DRAFTWISE_TRITON_ATTN": "0"})):
            try:
                with switched(env):
                    if be.graphs is not None:
                        be.graphs = StepGraphs(be.model, kernels=be.graphs.kernels)
                    cost = measure_cost_curve(be, rows=rows, contexts=contexts, reps=self.args.reps)
                out[name] = [[round(float(x), 3) for x in line] for line in cost.ms]
            finally:
                if fast is not None:
                    be.model.rowinv = fast
            self.rows.append((f"long {shape}, {name}", "; ".join(
                f"ctx {c}: " + " / ".join(f"{m:.2f}" for m in line) for c, line in zip(contexts, out[name]))
                + f" ms at {','.join(map(str, rows))} rows (limit {limit})"))
        del be
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return out

    def gemms(self) -> dict[str, Any]:
        """The largest shape's linear layers alone: the row-invariant Triton GEMM
        (``gpu/rowinv.py``, its configured tiles, fused epilogues) against torch's
        ``F.linear`` (cuBLAS) at 1, 16 and 64 rows, GB/s of weights read; then a sweep
        of tile configs at one row. Weights rotate among copies several times the L2,
        so every call reads them from device memory."""
        import torch
        import torch.nn.functional as F
        from types import SimpleNamespace as NS

        from draftwise.backends.cuda.gpu.rowinv import MMConfig, RowInvariant, config

        if self.device.type != "cuda":
            return {"skipped": "times CUDA kernels"}
        c = config_of(self.args.shapes[-1])
        hid, ff, heads, kvh = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"], c["num_key_value_heads"]
        d = c.get("head_dim", hid // heads)
        ri = RowInvariant(NS(cfg=NS(act="silu"), device=self.device))
        layers = {"qkv": ((heads + 2 * kvh) * d, hid, False), "o": (hid, heads * d, False),
                  "gate_up+silu": (2 * ff, hid, True), "down": (hid, ff, False),
                  "head": (c["vocab_size"], hid, False)}
        l2 = torch.cuda.get_device_properties(self.device).L2_cache_size
        # (bn, bk, warps, stages, bm): the tile height always named (MMConfig's default is BM)
        # (bn, bk, warps, stages, bm, split): split-K in fixed parts of K (DRAFTWISE_MM_SPLIT)
        sweep = [MMConfig(*t) for t in ((32, 128, 4, 4, 16, 1), (64, 128, 4, 4, 16, 1),
                                         (32, 128, 4, 4, 64, 1), (64, 128, 4, 4, 64, 1),
                                         (32, 128, 4, 4, 64, 2), (32, 128, 4, 4, 64, 4),
                                         (32, 128, 4, 4, 64, 8), (64, 128, 4, 4, 64, 4),
                                         (32, 128, 4, 6, 64, 1), (32, 128, 4, 3, 64, 4))]

        def timed(fn: Callable[[Any], Any], ws: list[Any]) -> float:
            """ms a call: 4 passes over the copies captured in one CUDA graph and replayed
            (launched one by one from Python, a Triton kernel's launch, tens of
            microseconds, would be timed instead of the kernel), median of 5 replays."""
            for w in ws[:2]:  # compiled and warm before the capture
                fn(w)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(4):
                    for w in ws:
                        fn(w)
            graph.replay()
            times = []
            for _ in range(5):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                graph.replay()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / (4 * len(ws)))
            del graph
            return sorted(times)[2]

        out: dict[str, Any] = {"shape": self.args.shapes[-1], "l2_MB": round(l2 / 2**20)}
        for name, (n, k, glu) in layers.items():
            nbytes = n * k * 2
            copies = max(2, min(12, -(-4 * l2 // nbytes)))
            torch.manual_seed(0)
            ws = [torch.randn(n, k, device=self.device, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
            row: dict[str, Any] = {"N": n, "K": k, "MB": round(nbytes / 2**20, 1),
                                   "config": vars(config(n // 2 if glu else n, k, ri.sms))}
            for m in (1, 16, 64):
                x = torch.randn(m, k, device=self.device, dtype=torch.bfloat16)
                t_torch = timed(lambda w, x=x: F.linear(x, w), ws)
                t_tri = timed(lambda w, x=x: ri.mm(x, w, glu=glu), ws)
                row[f"m{m}"] = {"torch_ms": round(t_torch, 4), "triton_ms": round(t_tri, 4),
                                "torch_GBps": round(nbytes / t_torch / 1e6), "triton_GBps": round(nbytes / t_tri / 1e6)}
            x = torch.randn(1, k, device=self.device, dtype=torch.bfloat16)
            x64 = torch.randn(64, k, device=self.device, dtype=torch.bfloat16)
            best = None
            for cfg in sweep:
                try:
                    t = timed(lambda w, x=x, cfg=cfg: ri.mm(x, w, glu=glu, cfg=cfg), ws)
                    t64 = timed(lambda w, cfg=cfg: ri.mm(x64, w, glu=glu, cfg=cfg), ws)
                except Exception as exc:  # a config this Triton cannot compile
                    row.setdefault("sweep_errors", []).append(f"{vars(cfg)}: {type(exc).__name__}")
                    continue
                # [bn, bk, warps, stages, bm, split, ms at 1 row, ms at 64 rows]
                row.setdefault("sweep", []).append([cfg.bn, cfg.bk, cfg.warps, cfg.stages, cfg.bm, cfg.split,
                                                    round(t, 4), round(t64, 4)])
                if best is None or t < best[1]:
                    best = (cfg, t)
            if best is not None:
                row["best_m1"] = {**vars(best[0]), "ms": round(best[1], 4), "GBps": round(nbytes / best[1] / 1e6)}
            out[name] = row
            m1 = row["m1"]
            self.rows.append((f"gemm {name} ({n}x{k})", f"1 row: triton {m1['triton_GBps']} GB/s, torch "
                              f"{m1['torch_GBps']}; 64 rows: triton {row['m64']['triton_GBps']}, torch "
                              f"{row['m64']['torch_GBps']}; best tiles at 1 row "
                              + (f"{best[0].bm}x{best[0].bn}x{best[0].bk} w{best[0].warps} s{best[0].stages} "
                                 f"split {best[0].split} "
                                 f"{round(nbytes / best[1] / 1e6)} GB/s" if best else "-")))
            del ws
            torch.cuda.empty_cache()
        return out

    def profile(self) -> dict[str, Any]:
        """Where a fixed-shape step of the largest shape spends its device time: the
        step run eagerly (the kernels a graph replays) under torch's profiler, the
        kernels summed by name over 5 steps, top 12 in ms per step."""
        import torch
        from torch.profiler import ProfilerActivity, profile

        from draftwise.backends.cuda.gpu.graphs import StepGraphs
        from draftwise.core.tree import DraftTree

        shape, ctx = self.args.shapes[-1], self.args.context
        be, _ = self.build(shape, ctx + 128)
        rows = int(os.environ.get("DW_PROFILE_ROWS", "1"))
        be.graphs = StepGraphs(be.model, buckets=(rows,), capture=False)  # the step's kernels
        be.max_tree_nodes = rows - 1
        tokens = torch.randint(10, be.vocab_size - 1, (ctx + 64,)).numpy()
        be.prefill(tokens[:ctx])
        tree = DraftTree.chain(tokens[ctx + 1 : ctx + rows].tolist())

        def step() -> None:
            be.verify(int(tokens[ctx]), tree, need_logits=False)
            be.trim(ctx)

        for _ in range(3):
            step()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        with profile(activities=acts) as prof:
            for _ in range(5):
                step()
        rows_n, rows = rows, []
        for ev in prof.key_averages():
            dev_us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
            # kernels and copies only: an aten:: op's device time is its kernels' again
            if dev_us and not ev.key.startswith(("aten::", "ProfilerStep")):
                rows.append((ev.key[:90], round(dev_us / 5 / 1e3, 3), ev.count // 5))
        rows.sort(key=lambda r: -r[1])
        total = round(sum(r[1] for r in rows), 3)
        self.rows.append((f"profile {shape} ({be.graphs.kernels}, {rows_n}-row step)",
                          f"{total} ms of kernels a step, {sum(r[2] for r in rows)} launches; top: " + "; ".join(
                              f"{n[:40]} {ms} ms x{c}" for n, ms, c in rows[:5])))
        return {"shape": shape, "rows": rows_n, "kernels_used": be.graphs.kernels,
                "kernel_ms_per_step": total, "kernels": rows[:16],
                "launches_per_step": sum(r[2] for r in rows)}

    def buckets(self) -> dict[str, Any]:
        """Which row buckets compute a row as the largest does, on the largest shape,
        under cuBLAS settings that may change the GEMMs' reductions: as found;
        ``allow_bf16_reduced_precision_reduction`` off; the cuBLAS (not cuBLASLt)
        library. Each with its graph curve at 1, 4, 16 and 64 rows."""
        import torch

        from draftwise.backends.cuda.gpu.graphs import BUCKETS, StepGraphs
        from draftwise.core.costprofile import measure_cost_curve

        shape, ctx = self.args.shapes[-1], self.args.context
        be, _ = self.build(shape, ctx + 128)
        out: dict[str, Any] = {"shape": shape}
        cuda = self.device.type == "cuda"
        matmul = torch.backends.cuda.matmul
        variants = [("as found", {})]
        if cuda:
            variants += [("no bf16 reduced-precision reduction", {"reduced": False}),
                         ("cublas library", {"lib": "cublas"})]
        for name, kw in variants:
            saved_reduced = matmul.allow_bf16_reduced_precision_reduction
            saved_lib = torch.backends.cuda.preferred_blas_library() if cuda else None
            try:
                if "reduced" in kw:
                    matmul.allow_bf16_reduced_precision_reduction = kw["reduced"]
                if "lib" in kw:
                    torch.backends.cuda.preferred_blas_library(kw["lib"])
                be.graphs = StepGraphs(be.model, buckets=BUCKETS)
                be.reset()
                cost = measure_cost_curve(be, rows=(1, 4, 16, 64), contexts=(ctx,), reps=self.args.reps)
                ms = [round(float(x), 3) for x in cost.ms[0]]
                out[name] = {"buckets": list(be.graphs.buckets), "graph_ms": ms}
                self.rows.append((f"buckets {shape}, {name}", f"kept {list(be.graphs.buckets)}; "
                                  + " / ".join(f"{m:.2f}" for m in ms) + " ms at 1, 4, 16, 64 rows"))
            except Exception as exc:  # a setting this torch lacks: say so, try the next
                out[name] = {"error": f"{type(exc).__name__}: {exc}"}
                self.rows.append((f"buckets {shape}, {name}", f"error {type(exc).__name__}: {str(exc)[:80]}"))
            finally:
                matmul.allow_bf16_reduced_precision_reduction = saved_reduced
                if saved_lib is not None:
                    torch.backends.cuda.preferred_blas_library(saved_lib)
        return out

    def compiled(self) -> dict[str, Any]:
        """The largest shape's 64-row step with the forward compiled by torch.compile
        (inductor fuses the norms, RoPE and the MLP's elementwise work) and then captured:
        ms per step against the plain captured step, and the largest logit difference."""
        import torch

        from draftwise.backends.cuda.gpu.graphs import StepGraphs
        from draftwise.core.costprofile import measure_cost_curve

        if self.device.type != "cuda":
            return {"skipped": "compiles on CUDA only"}
        shape, ctx = self.args.shapes[-1], self.args.context
        be, _ = self.build(shape, ctx + 128)
        be.graphs = StepGraphs(be.model, buckets=(64,))
        be.max_tree_nodes = 63
        plain = measure_cost_curve(be, rows=(1, 16, 64), contexts=(ctx,), reps=self.args.reps)
        eager_fn = be.model.forward_fixed
        t0 = time.perf_counter()
        be.model.forward_fixed = torch.compile(eager_fn, dynamic=False)
        be.graphs = StepGraphs(be.model, buckets=(64,))
        fast = measure_cost_curve(be, rows=(1, 16, 64), contexts=(ctx,), reps=self.args.reps)
        secs = time.perf_counter() - t0
        out = {"shape": shape, "graph_ms": [round(float(x), 3) for x in plain.ms[0]],
               "compiled_graph_ms": [round(float(x), 3) for x in fast.ms[0]],
               "compile_and_measure_s": round(secs, 1)}
        self.rows.append((f"compiled {shape}", " / ".join(f"{m:.2f}" for m in out["compiled_graph_ms"])
                          + " ms at 1, 16, 64 rows (captured: " + " / ".join(
                              f"{m:.2f}" for m in out["graph_ms"]) + f"); compile {secs:.0f} s"))
        return out

    def probe(self) -> dict[str, Any]:
        """Is a row's output independent of the rows beside it? Row 0 (one token at one
        position over the same cache) in steps of 1, 4, 16 and 64 rows, the others
        random tokens seeing only the cache and themselves: bit-equal logits across
        sizes, and within one size with different neighbours."""
        import torch

        shape = self.args.identity_shape
        be, _ = self.build(shape, 1024)
        ctx = 128 if self.args.tiny else 512
        vocab = be.vocab_size
        g = torch.Generator().manual_seed(0)
        be.prefill(torch.randint(10, vocab - 1, (ctx,), generator=g).numpy())
        model = be.model
        out: dict[str, Any] = {"shape": shape, "context": ctx}
        ref: dict[int, Any] = {}
        for b in (1, 4, 16, 64):
            rows = []
            for seed in (1, 2):
                gg = torch.Generator().manual_seed(seed)
                toks = torch.randint(10, vocab - 1, (b,), generator=gg)
                toks[0] = 77
                tokens = toks.to(self.device)
                pos = torch.full((b,), ctx, device=self.device)
                mask = None
                if b > 1:
                    mask = torch.cat([torch.ones(b, ctx, dtype=torch.bool),
                                      torch.eye(b, dtype=torch.bool)], dim=1).to(self.device)
                with torch.inference_mode():
                    logits = model.forward(tokens, pos, ctx, mask, True)
                rows.append(logits[0].float().cpu())
            ref[b] = rows[0]
            out[f"rows{b}_neighbours_equal"] = bool(torch.equal(rows[0], rows[1]))
        for b in (4, 16, 64):
            out[f"rows{b}_equal_rows1"] = bool(torch.equal(ref[b], ref[1]))
            out[f"rows{b}_maxdiff_rows1"] = float((ref[b] - ref[1]).abs().max())
            out[f"rows{b}_argmax_equal_rows1"] = bool(ref[b].argmax() == ref[1].argmax())
        self.rows.append((f"row invariance {shape}", ", ".join(
            f"{b}:{'same' if out[f'rows{b}_neighbours_equal'] else 'DIFF'}" for b in (1, 4, 16, 64))
            + " with other neighbours; vs 1 row: " + ", ".join(
            f"{b}:{'same' if out[f'rows{b}_equal_rows1'] else 'diff %.2g' % out[f'rows{b}_maxdiff_rows1']}"
            for b in (4, 16, 64))))
        return out

    def tensors(self, model: Any) -> list[Any]:
        """Every weight tensor a step reads (the bandwidth floor's bytes)."""
        import torch

        seen, out = set(), []
        for layer in model.layers:
            for v in vars(layer).values():
                t = getattr(v, "packed", v)
                if isinstance(t, torch.Tensor) and id(t) not in seen:
                    seen.add(id(t))
                    out.append(t)
        for t in (model.norm, model.lm_head):
            if id(t) not in seen:
                seen.add(id(t))
                out.append(t)
        return out

    def copy_bandwidth(self) -> float:
        """Bytes per second of a device-to-device copy (read + write counted once each)."""
        import torch

        n = (256 if self.device.type == "cuda" else 16) * 2**20
        a = torch.empty(n, dtype=torch.uint8, device=self.device)
        b = torch.empty_like(a)
        for _ in range(3):
            b.copy_(a)
        self.sync()
        t0 = time.perf_counter()
        for _ in range(10):
            b.copy_(a)
        self.sync()
        return 2 * n * 10 / (time.perf_counter() - t0)

    def plain(self) -> dict[str, Any]:
        import numpy as np
        import torch

        from draftwise.core.decode import Decoder
        from draftwise.core.drafters.base import NoDrafter
        from draftwise.core.sampling import SamplingParams

        shape, n = self.args.decode_shape, self.args.tokens
        be, hf = self.build(shape, 1024, with_hf=True)
        prompt = np.random.default_rng(0).integers(10, config_of(shape)["vocab_size"] - 1, 32)
        dec = Decoder(be)
        out: dict[str, Any] = {"shape": shape, "tokens": n}

        def ours() -> float:
            dec.reset()
            t0 = time.perf_counter()
            got = sum(len(s.tokens) for s in dec.steps(prompt, NoDrafter(), SamplingParams(), n))
            self.sync()
            return got / (time.perf_counter() - t0)

        ours()  # warm-up (and the graphs' captures)
        out["draftwise_none_tps"] = round(ours(), 1)
        graphs, be.graphs, be.max_tree_nodes = be.graphs, None, None
        ours()
        out["draftwise_none_eager_tps"] = round(ours(), 1)  # the same without graphs
        be.graphs, be.max_tree_nodes = graphs, graphs.max_rows - 1 if graphs else None
        ids = torch.tensor([prompt.tolist()], device=self.device)
        for name, kw in (("hf_eager_tps", {}), ("hf_static_tps", {"cache_implementation": "static"})):
            def theirs(kw: dict[str, Any] = kw) -> float:
                t0 = time.perf_counter()
                with torch.no_grad():
                    hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw)
                self.sync()
                return n / (time.perf_counter() - t0)

            try:
                theirs()  # warm-up (and the static cache's compile)
                out[name] = round(theirs(), 1)
            except Exception as exc:
                out[name] = f"{type(exc).__name__}: {str(exc)[:120]}"
        ratio = out["draftwise_none_tps"] / out["hf_eager_tps"] if isinstance(out["hf_eager_tps"], float) else None
        out["none_vs_hf_eager"] = round(ratio, 2) if ratio else None
        self.rows.append((f"plain {shape}", f"draftwise none {out['draftwise_none_tps']} tok/s "
                          f"(eager {out['draftwise_none_eager_tps']}), "
                          f"transformers eager {out['hf_eager_tps']}, static {out['hf_static_tps']}"))
        return out

    def identity(self) -> dict[str, Any]:
        return self.identity_of(self.args.identity_shape)

    def identity_large(self) -> dict[str, Any]:
        """The same on the largest shape, whose buckets may disagree (some dropped)."""
        return self.identity_of(self.args.shapes[-1])

    def identity_of(self, shape: str) -> dict[str, Any]:
        import numpy as np

        import draftwise
        from draftwise.api import Model
        from draftwise.core.costmodel import CostModel
        from draftwise.models.tokenizer import Tokenizer

        n = self.args.identity_tokens
        cfg = config_of(shape)
        be, _ = self.build(shape, 2048)
        work = Path(tempfile.mkdtemp(prefix="dw-device-"))
        model = Model(be, Tokenizer.from_dir(word_tokenizer(work, cfg["vocab_size"])), work, progress=None)
        model.assets.use_cost_profile(CostModel(rows=[1, 64], ms=[10.0, 11.0]))  # a GPU-like curve
        ckpt = random_redrafter(model, work / "redrafter")
        rng = np.random.default_rng(1)
        # repeated text: drafters find something to propose, so trees are verified
        base = rng.integers(10, cfg["vocab_size"] - 1, 24).tolist()
        prompt = (base * 4)[:80]

        mats: dict[str, float] = {}

        def ids(drafter: str, **kw: Any) -> list[int]:
            last = None
            for r in draftwise.stream_generate(model, prompt, drafter=drafter, max_tokens=n,
                                               chat_template=False, **kw):
                last = r
            if last is None:
                return []
            if not kw:  # greedy: > 1 means drafts were accepted
                mats[drafter] = round(last.mean_accepted, 2)
            return list(last.token_ids)

        want, hot = ids("none"), ids("none", temp=0.8, seed=3)
        out: dict[str, Any] = {"shape": shape, "tokens": len(want), "backend": be.name,
                               "buckets": list(be.graphs.buckets) if be.graphs else None,
                               "rows_agree": be.graphs.agree if be.graphs else None}
        bad = []
        for spec in DRAFTERS:
            full = f"redrafter:bw=2,t=3,path={ckpt}" if spec == "redrafter" else spec
            model.drafter(full).reset()
            same = ids(full) == want
            seeded = ids(full, temp=0.8, seed=3) == hot
            out[spec] = {"greedy": same, "seeded": seeded, "mat": mats.get(full)}
            if not (same and seeded):
                bad.append(spec)
        model.close_drafters()
        self.rows.append((f"identity {shape}", ("all equal none (greedy, seeded T=0.8)" if not bad
                          else f"DIFFER: {', '.join(bad)}") + f" [{be.name}, buckets {out['buckets']}]"))
        if bad:
            raise AssertionError(f"not identical to none: {bad}")
        return out

    def write(self) -> None:
        """``device_check.json`` and ``.md`` under ``--out`` or ``$OUT`` (when set)."""
        out = self.args.out or os.environ.get("OUT")
        table = "\n".join(f"| {k} | {v} |" for k, v in self.rows)
        md = f"# device check\n\n| check | result |\n|---|---|\n{table}\n"
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / "device_check.json").write_text(json.dumps(self.results, indent=1, default=str))
            (Path(out) / "device_check.md").write_text(md)

    def report(self) -> None:
        self.write()
        width = max(len(k) for k, _ in self.rows) if self.rows else 10
        print("\n" + "\n".join(f"{k:<{width}}  {v}" for k, v in self.rows), flush=True)


def word_tokenizer(out: Path, vocab: int) -> Path:
    """A word-level tokenizer of ``vocab`` tokens ``t0 t1 ...`` (generation runs on ids;
    text is only decoded), saved as ``tokenizer.json``."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    tok = HFTokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": None, "bos_token": None}))
    return out


def random_redrafter(model: Any, out: Path) -> Path:
    import torch

    from draftwise.backends.cuda.redrafter.checkpoint import save_redrafter, weights_fingerprint
    from draftwise.backends.cuda.redrafter.net import ReDrafterNet
    from draftwise.core.drafters.redrafter_ckpt import ReDrafterConfig

    embed = model.backend.model.embed
    k = min(2048, int(embed.shape[0]))
    torch.manual_seed(1)
    cfg = ReDrafterConfig(int(embed.shape[1]), int(embed.shape[0]), k, 1,
                          model.drafting.tokenizer_id, weights_fingerprint(embed), context_dim=64)
    net = ReDrafterNet(cfg, embed.float().cpu(), torch.arange(k))
    return save_redrafter(net, out)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--tiny", action="store_true", help="tiny shapes and short runs (the CPU smoke test)")
    p.add_argument("--out", default=None, help="folder for device_check.json/.md (default: $OUT)")
    p.add_argument("--skip", default="", help="comma-separated sections to skip")
    p.add_argument("--only", default="", help="comma-separated sections to run (default: the check's)")
    p.add_argument("--set", default="", metavar="KEY=VALUE,...",
                   help="DRAFTWISE_* switches for the whole run (e.g. "
                        "DRAFTWISE_MM_SPLIT=2,DRAFTWISE_MM_CONFIG=32,128,4,6)")
    p.add_argument("--shapes", dest="shapes_arg", default="", help="comma-separated shapes for the curves (default: all three)")
    a = p.parse_args(argv)
    a.env = {}
    for item in filter(None, re.split(r",(?=DRAFTWISE_)", a.set)):  # a value may hold commas
        key, eq, value = item.partition("=")
        if not eq or not key.startswith("DRAFTWISE_"):
            p.error(f"--set takes DRAFTWISE_KEY=VALUE items, got {item!r}")
        a.env[key] = value
    if a.device not in ("cuda", "cpu"):
        p.error(f"--device must be cuda or cpu, got {a.device!r}")
    if a.tiny:
        a.shapes, a.rows, a.context, a.reps = ["tiny"], (1, 2, 4, 8), 64, 1
        a.decode_shape, a.tokens, a.identity_shape, a.identity_tokens = "tiny", 16, "tiny", 24
        a.pytest_timeout = 300
    else:
        a.shapes, a.rows, a.context, a.reps = (["smollm2-135m", "llama-3.2-1b", "llama-3.1-8b"],
                                               (1, 2, 4, 8, 16, 32, 64), 512, 5)
        a.decode_shape, a.tokens, a.identity_shape, a.identity_tokens = "llama-3.2-1b", 256, "llama-3.2-1b", 64
        a.pytest_timeout = 240
    if a.shapes_arg:
        bad = [x for x in a.shapes_arg.split(",") if x not in SHAPES]
        if bad:
            p.error(f"--shapes: unknown {bad[0]!r} (known: {', '.join(SHAPES)})")
        a.shapes = a.shapes_arg.split(",")
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("device_check: no CUDA device here (use --device cpu --tiny for the smoke test)", file=sys.stderr)
        return 2
    os.environ.update(args.env)
    check = Check(args)
    skip = set(filter(None, args.skip.split(",")))
    only = set(filter(None, args.only.split(",")))
    extra = {"profile": check.profile, "compiled": check.compiled,  # asked for by --only
             "buckets": check.buckets, "gemms": check.gemms, "long": check.long, "best": check.best}
    # the slowest and least certain (transformers' static cache compiles) go last
    for name, fn in (("machine", check.machine), ("curves", check.curves), ("probe", check.probe),
                     ("identity", check.identity), ("identity-large", check.identity_large),
                     ("pytest-cuda", check.cuda_tests),
                     ("plain", check.plain), *extra.items()):
        if name not in skip and (name in only if only else name not in extra):
            check.section(name, fn)
    check.report()
    failed = [k for k, v in check.results.items() if isinstance(v, dict) and "error" in v]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
