"""``TorchBackend``: the ``draftwise.core.backend.Backend`` protocol on plain torch.

Runs the lean llama forward of ``llama.py`` on CUDA when there is a GPU, else on CPU.
Every ``verify`` is ONE forward over ``[root, tree nodes]`` and ONE device->host copy
(argmax, plus the logits when asked for); ``commit`` compacts the kept rows' K/V into
place with one indexed copy over all layers.

Example::

    be = TorchBackend.from_pretrained("path/to/hf_dir", dtype="float32", device="cpu")
    be.prefill(np.array(prompt[:-1]))
    out = be.verify(prompt[-1], DraftTree.empty(), need_logits=False)
    be.commit(np.array([0]))
    next_token = int(out.argmax[0])
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from draftwise.backends.cuda.batch import BatchMixin
from draftwise.backends.cuda.cpu.int4 import int4_available
from draftwise.backends.cuda.cpu.native import native_argmax, native_sample, native_sampling_takes
from draftwise.backends.cuda.gpu.graphs import BUCKETS, StepGraphs
from draftwise.backends.cuda.gpu.sampling import HostStaging, sample_rows
from draftwise.backends.cuda.invariant import (
    MAX_ROWS,
    causal_plan,
    chain_slots,
    chain_tables,
    make_plan,
    min_rows,
    slot_table,
)
from draftwise.backends.cuda.llama import Llama, causal_mask, read_llama_config, read_weights
from draftwise.backends.gguf_q4 import FourBit, gguf_source, read_q4_linears
from draftwise.core.backend import Verified
from draftwise.core.cachebook import CacheBook
from draftwise.core.device import DeviceInfo, cpu_name
from draftwise.core.sampling import SamplingParams, next_token
from draftwise.core.tree import DraftTree
from draftwise.errors import DraftwiseError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# "4bit": 4-bit linear weights (a Q4 GGUF's own codes, else round-to-nearest) with
# bfloat16 activations (which the compiled kernel quantises to int8 per block of 32), on
# CPU (``int4.py``)
TORCH_DTYPES = (*DTYPES, "4bit")
PREFILL_CHUNK = 256  # rows per prefill forward: bounds the (T, S) mask and activations
DEFAULT_MAX_CACHE = 8192  # slots preallocated when max_cache_len is not given
# Where "auto" turns the batch-invariant mode on: measured cheap (a 16-row bf16 forward
# costs about a 1-row one) and needed (bf16 argmax ties flip with the batch shape). And
# float32 on a CPU: without the mode a row's logits differ with the verify's row count
# (by ~3e-5: torch's attention and softmax take other paths), which flipped a seeded
# sample (`redrafter:bw=1,t=1`, T = 0.8, token 94 of a 128-token story, AMD EPYC Zen 3,
# 2026-11-29); with ``csrc/f32.c`` the mode's verify costs what the normal one does
# (40-70 ms at 1-4 rows, contexts 256 and 700, the two alternated).
INVARIANT_AUTO = {("cpu", "bfloat16"), ("cpu", "4bit"), ("cpu", "float32")}


def resolve_invariant(invariant: bool | str, device: torch.device, dtype: str) -> bool:
    """``True``/``False`` as given; ``"auto"``: on where it is measured cheap."""
    if invariant == "auto":
        return (device.type, dtype) in INVARIANT_AUTO
    if not isinstance(invariant, bool):
        raise DraftwiseError(f"invariant must be True, False or 'auto', got {invariant!r}")
    return invariant


def weights_mode(
    model_dir: Path, dtype: str, device: torch.device
) -> tuple[torch.dtype, FourBit | None]:
    """The compute dtype and 4-bit weights of ``dtype`` (one of ``TORCH_DTYPES``): for
    ``4bit``, bfloat16 activations and the codes of the GGUF ``model_dir`` was converted
    from (exact; its tensors without 4-bit codes stay dense), or, with no GGUF, every
    linear rounded to nearest at load."""
    if dtype != "4bit":
        return DTYPES[dtype], None
    if device.type != "cpu" or not int4_available():
        raise DraftwiseError(
            f"dtype '4bit' runs on CPU with torch >= 2.5 (device {device.type}, torch "
            f"{torch.__version__}); use bfloat16 or float32"
        )
    src = gguf_source(model_dir)
    if src is None:
        return torch.bfloat16, FourBit({}, round_missing=True)
    return torch.bfloat16, FourBit(read_q4_linears(src))


def graphs_wanted(device: torch.device, dtype: str, invariant: bool) -> bool:
    """Fixed-shape steps from CUDA graphs (``gpu/graphs.py``): on CUDA, outside the
    invariant mode (its own fixed arithmetic), unless ``DRAFTWISE_CUDA_GRAPHS=0``."""
    if os.environ.get("DRAFTWISE_CUDA_GRAPHS", "1") == "0":
        return False
    return device.type == "cuda" and not invariant and dtype != "4bit"


def _pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda"):
        raise DraftwiseError(f"unknown device {device!r} (use auto, cpu or cuda)")
    if device == "cuda" and not torch.cuda.is_available():
        raise DraftwiseError("device 'cuda' requested but torch sees no CUDA GPU")
    return torch.device(device)


class TorchBackend(CacheBook, BatchMixin):
    """A llama-family model and its KV cache on one torch device (batch size 1)."""

    def __init__(
        self,
        model: Llama,
        max_cache_len: int,
        invariant: bool = False,
        graphs: StepGraphs | None = None,
    ) -> None:
        """``graphs``: run every verify as a fixed-shape step of ``graphs`` (its model is
        ``model``, whose cache needs ``graphs.max_rows`` slots past ``max_cache_len`` for
        the padding rows); None: the eager forward."""
        if graphs is not None:
            if graphs.model is not model or invariant:
                raise DraftwiseError("graph steps run the backend's own model, outside the invariant mode")
            if model.max_cache_len < max_cache_len + graphs.max_rows:
                raise DraftwiseError(
                    f"graph steps need {max_cache_len + graphs.max_rows} cache slots "
                    f"(context {max_cache_len} + {graphs.max_rows} padding rows), the model has "
                    f"{model.max_cache_len}"
                )
        self.graphs = graphs
        # host work run while a launched verify computes (the decoder sets it, Overlapping)
        self.while_waiting: Callable[[], None] | None = None
        # a tree has at most this many nodes (the decoding loop caps its budget to it)
        self.max_tree_nodes = graphs.max_rows - 1 if graphs is not None else None
        self._argmax: torch.Tensor | None = None  # (N+1,) the graph step's, on the device
        self.model = model
        # Batch-invariant verify (see invariant.py): plain decoding and tree verification
        # become two schedules of one bit-exact computation, in any dtype.
        self.invariant = invariant
        self.device = model.device
        self.dtype = "4bit" if model.int4 else str(model.dtype).removeprefix("torch.")
        # The mode is part of the name: tune profiles and bench reports keep them apart.
        self.name = f"torch-{self.device.type}-{self.dtype}" + ("-invariant" if invariant else "")
        if graphs is not None:
            self.name += "-graphs"
        CacheBook.__init__(self, max_cache_len, model.cfg.vocab_size)
        # Reused for every verify's mask: the cache prefix is always fully visible.
        self._ones = torch.ones((1, max_cache_len), dtype=torch.bool, device=self.device)
        self._staging = HostStaging(self.device)  # the step's one (pinned on CUDA) upload
        # Sample at T > 0 on the device (verify_sampled) where logits are off the host;
        # on CPU the host samples only the rows acceptance visits (tests turn it on).
        self.device_sampling = self.device.type == "cuda"
        # read per step (``device.type`` builds a string through a C++ stream: ~5 us cold)
        self._on_cuda, self._on_cpu = self.device.type == "cuda", self.device.type == "cpu"
        # Last-layer hidden states for a drafter (ReDrafter): the residual rows of the
        # last verify, and the row of the last cached token with the cache length it is
        # valid at (-1: none). Device tensors only: reading them never syncs.
        self._rows_x: torch.Tensor | None = None  # (N+1, C)
        # whether _rows_x is a fresh tensor of the last verify that nothing reuses (the
        # compiled step's): commit may then keep a slice of it instead of a copy
        self._rows_fresh = False
        self._chain_rows = 0  # the rows of the last packed verify when they were a chain's
        self._hidden_x: torch.Tensor | None = None  # (C,)
        self._hidden_len = -1
        # The invariant mode's attention: one compiled C call per layer where a C compiler
        # is at hand (CPU, float32 cache; bfloat16 in the 4bit mode), else the torch ops
        # of block_attention; chosen once, so plain and tree steps share one arithmetic.
        self._torch_threads: int | None = None  # torch's count while a step sets its own
        self._native = None
        # the greedy verify's argmax on CPU (csrc/argmax.c), None: torch's
        self._argmax_lib = None
        self._sample_lib = None  # the compiled sampler at T > 0 on CPU (csrc/sample.c)
        if self.device.type == "cpu":
            from draftwise.backends.cuda.cpu.native import argmax_lib, sample_lib

            self._argmax_lib = argmax_lib()
            # DRAFTWISE_NATIVE_SAMPLING=0: numpy samples (the reference the kernel is tested on)
            if os.environ.get("DRAFTWISE_NATIVE_SAMPLING", "1") != "0":
                self._sample_lib = sample_lib()
        if (invariant and self.device.type == "cpu"
                and model.cache_dtype in (torch.float32, torch.bfloat16)
                and model.cfg.plain_attention):
            from draftwise.backends.cuda.cpu.native import attention_lib

            self._native = attention_lib()

    @property
    def thread_counts(self) -> tuple[int, ...]:
        """Kernel thread counts worth trying (``core/threads.py``): torch's count and one
        where a step is the compiled kernels' work (the fused 4bit forward, whose rows have
        the same bits at any count); none elsewhere or with ``DRAFTWISE_ADAPT_THREADS=0``."""
        if self.device.type != "cpu" or getattr(self.model, "fused", None) is None:
            return ()
        if os.environ.get("DRAFTWISE_ADAPT_THREADS", "1") == "0":
            return ()
        n = self._torch_threads or torch.get_num_threads()
        return (n, 1) if n > 1 else ()

    def set_kernel_threads(self, n: int | None) -> None:
        """Threads of a step's work (None: back to torch's own count): the compiled
        kernels' count in the calling thread, and torch's for the few ops around them
        (gathers and the argmax: exact at any count). Two OpenMP runtimes (torch's and
        the kernels') each spinning on a busy core is what made steps slow."""
        from draftwise.backends.cuda.cpu.native import set_kernel_threads

        if n is None:
            if self._torch_threads is not None:
                torch.set_num_threads(self._torch_threads)
                self._torch_threads = None
        else:
            if self._torch_threads is None:
                self._torch_threads = torch.get_num_threads()
            if torch.get_num_threads() != n:
                torch.set_num_threads(n)
        set_kernel_threads(n)

    def device_info(self) -> DeviceInfo:
        """The device, dtype, mode and thread count this backend computes with."""
        if self.device.type == "cuda":
            name, kind, threads = torch.cuda.get_device_name(self.device), "cuda", 1
        else:
            # the cost curve depends on the thread count (OMP_NUM_THREADS)
            name, kind, threads = cpu_name(), self.device.type, torch.get_num_threads()
        mode = "invariant" if self.invariant else "graphs" if self.graphs is not None else "normal"
        kernels = ""
        if self._native is not None:  # the compiled build (its file names its source hash)
            kernels = Path(self._native._name).stem
            if getattr(self.model, "fused", None) is not None:
                kernels += "+fused"
        if getattr(self.model, "native_f32", False) and not kernels:
            from draftwise.backends.cuda.cpu.native import f32_lib

            lib = f32_lib()  # the build (its file names its source hash), as above
            kernels = Path(lib._name).stem if lib is not None else "native"
        if getattr(self.model, "native_f32", False):
            kernels += "+f32"
        return DeviceInfo(
            kind=kind, name=name, dtype=self.dtype, mode=mode, threads=threads, kernels=kernels
        )

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | Path,
        dtype: str = "float32",
        device: str = "auto",
        max_cache_len: int | None = None,
        invariant: bool | str = "auto",
        graphs: bool | str = "auto",
    ) -> TorchBackend:
        """``dtype``: float32, bfloat16, float16 or 4bit (CPU: ``weights_mode``).
        ``invariant``: batch-invariant verification (True/False; "auto" = on for bf16 and
        4bit on CPU). ``graphs``: fixed-shape steps replayed from CUDA graphs (True/False;
        "auto" = on CUDA, see ``graphs_wanted``).
        Example: ``TorchBackend.from_pretrained(d, dtype="bfloat16")``."""
        if dtype not in TORCH_DTYPES:
            raise DraftwiseError(f"unknown dtype {dtype!r} (use {', '.join(TORCH_DTYPES)})")
        if max_cache_len is not None and max_cache_len < 1:
            raise DraftwiseError(f"max_cache_len must be positive, got {max_cache_len}")
        dev = _pick_device(device)
        compute, q4 = weights_mode(Path(model_dir), dtype, dev)
        inv = resolve_invariant(invariant, dev, dtype)
        cfg = read_llama_config(model_dir)
        cap = max_cache_len if max_cache_len is not None else DEFAULT_MAX_CACHE
        limit = min(cfg.max_positions, cap)
        cache_dtype = torch.float32 if inv else None  # see Llama: read as it lies
        if inv and q4 is not None and dev.type == "cpu" and cfg.plain_attention:
            from draftwise.backends.cuda.cpu.native import attention_lib

            if attention_lib() is not None:
                # the 4bit mode's cache, read by the compiled attention only: bfloat16,
                # half the bytes a step streams (1,024 tokens: 3.6 -> 3.0 ms a step)
                cache_dtype = torch.bfloat16
        if graphs == "auto":
            graphs = graphs_wanted(dev, dtype, inv)
        if not isinstance(graphs, bool):
            raise DraftwiseError(f"graphs must be True, False or 'auto', got {graphs!r}")
        weights = read_weights(Path(model_dir))
        pad = max(BUCKETS) if graphs else 0  # slots the padding rows write to
        model = Llama(cfg, weights, compute, dev, limit + pad, cache_dtype, q4)
        return cls(model, limit, inv, StepGraphs(model) if graphs else None)

    # ----- the target's hidden state, for drafters conditioned on it ---------------------
    def last_hidden(self) -> torch.Tensor:
        """(C,) last-layer hidden state (after the final norm) of the last cached token,
        the one that predicts the root: left on the device, no forward, no sync."""
        self._check_hidden()
        with torch.inference_mode():
            return self.model.final_hidden(self._hidden_x)  # (C,)

    def last_residual(self) -> torch.Tensor:
        """(C,) the residual row ``last_hidden`` normalises (``model.norm``,
        ``cfg.norm_eps``): for a drafter that applies the final norm itself."""
        self._check_hidden()
        assert self._hidden_x is not None
        return self._hidden_x

    def _join_rows(self, pieces: list[object]) -> torch.Tensor:
        """Kept residual rows (``CacheBook.hidden_rows``) -> (n, C) after the final norm."""
        with torch.inference_mode():
            x = torch.cat(pieces) if len(pieces) > 1 else pieces[0]  # type: ignore[arg-type]
            return self.model.final_hidden(x)  # type: ignore[arg-type]

    # ----- saved prefixes (core/prefixes.py) ------------------------------------------
    def save_prefix(self, n: int) -> torch.Tensor:
        """A copy of the first ``n`` cached tokens' K/V: (L, 2, H_kv, n, D)."""
        if not 0 < n <= self._len:
            raise DraftwiseError(f"cannot save {n} tokens of a cache holding {self._len}")
        with torch.inference_mode():
            return self.model.cache[:, :, :, :n].clone()

    def load_prefix(self, snapshot: torch.Tensor, n: int) -> None:
        """Make the cache hold the first ``n`` tokens saved in ``snapshot``."""
        if not 0 < n <= snapshot.shape[3]:
            raise DraftwiseError(f"cannot load {n} tokens of a saved prefix of {snapshot.shape[3]}")
        with torch.inference_mode():
            self.model.cache[:, :, :, :n].copy_(snapshot[:, :, :, :n])
        self._len, self._pending, self._hidden_len = n, 0, -1
        if self._rows is not None:  # the loaded positions' rows are not known here
            self._rows = []

    # ----- forward passes --------------------------------------------------------------
    def prefill(self, tokens: np.ndarray) -> None:
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        self._check_room("prefill", ids.size)
        self._check_ids(ids)
        self._pending = 0
        with torch.inference_mode():
            all_ids = torch.from_numpy(ids).to(self.device)  # (T,)
            fused = self._fused_prefill()
            for s in range(0, ids.size, PREFILL_CHUNK):
                chunk = all_ids[s : s + PREFILL_CHUNK]  # (t,)
                t, start = chunk.shape[0], self._len
                pos = torch.arange(start, start + t, device=self.device)  # (t,)
                if fused:  # the verify's own arithmetic: row i sees slots .. start + i
                    plan = causal_plan(start, t, self._native)
                    self.model.forward(chunk, pos, start, None, False, plan=plan, n_write=t)
                else:
                    mask = causal_mask(t, start, self.device) if t > 1 else None  # (t, start+t)
                    self.model.forward(chunk, pos, start, mask, need_logits=False)
                if self._rows is not None:
                    self._record_rows(start, self.model.last_x)
                self._len += t
            if ids.size:
                assert self.model.last_x is not None
                self._hidden_x, self._hidden_len = self.model.last_x[-1], self._len

    def _fused_prefill(self) -> bool:
        """True where the prompt goes through the compiled 4bit forward (``cpu/fused.py``)
        that every verify uses: the invariant mode with the compiled attention. A prompt
        token's K/V then has the bits a plain step at its position would have written
        (the forward is row-invariant), and the prompt costs about a fifth less than
        through torch's ops (300 tokens: 175 -> 130 ms on the AMD EPYC Zen 5 VM)."""
        fused = getattr(self.model, "fused", None)
        return self.invariant and self._native is not None and fused is not None

    def verify(self, root: int, tree: DraftTree, need_logits: bool) -> Verified:
        host = self._pack(root, tree, 0)
        logits = self._tree_logits(host)  # launched; on CUDA not yet computed
        self._overlap()
        return self._finish(logits, need_logits)

    def _overlap(self) -> None:
        """Host work while the device computes the launched verify (``Overlapping``):
        on CUDA only, where the launch returns at once; on CPU the forward has finished
        by now, and the decoder runs the work after the verify's timing instead."""
        if self.while_waiting is not None and self._on_cuda:
            self.while_waiting()

    def verify_sampled(
        self, root: int, tree: DraftTree, params: SamplingParams, u: np.ndarray, recent: np.ndarray
    ) -> np.ndarray:
        """One forward over ``[root, tree nodes]``, every row sampled on the device
        (``device_sampling.sample_rows``) at its uniform ``u`` (N+1,) with its penalty
        window ``recent`` (N+1, W); returns the (N+1,) tokens. One host->device copy
        (ids, positions, mask, windows and uniforms packed) and one device->host copy."""
        w = recent.shape[1]
        host = self._pack(root, tree, w + 1)  # (N+1, 2 + N+1 + W + 1)
        host[:, -1 - w : -1] = recent
        host[:, -1] = np.ascontiguousarray(u, dtype=np.float64).view(np.int64)  # bits
        with torch.inference_mode():
            dev = self._staging.upload(host)  # (N+1, C)
            logits = self._tree_logits(host[:, : -1 - w], dev[:, : -1 - w])  # (N+1, V)
            u_dev = dev[:, -1].contiguous().view(torch.float64)  # (N+1,)
            tokens = sample_rows(logits, dev[:, -1 - w : -1], u_dev, params)  # (N+1,)
            self._overlap()
            return tokens.cpu().numpy()

    def _pack(self, root: int, tree: DraftTree, extra: int) -> np.ndarray:
        """Tokens, positions and the tree mask (and ``extra`` free columns) in one host
        array: (N+1, 2 + N+1 + extra) int64, uploaded with ONE host->device copy."""
        n1 = len(tree) + 1
        self._check_room("verify", n1)
        host = np.empty((n1, 2 + n1 + extra), dtype=np.int64)
        host[0, 0] = root
        host[1:, 0] = tree.tokens
        self._check_ids(host[:, 0])
        host[:, 1] = self._len + tree.verify_positions()
        # a chain (one node a depth, in order: a drafter's beam, ``auto``'s solo way)
        # takes its mask and, in the invariant mode, its slot table from tables made once
        chain = n1 <= MAX_ROWS and tree.max_depth == n1 - 1
        self._chain_rows = n1 if chain else 0
        if n1 == 1:
            host[:, 2] = 1
        else:
            host[:, 2 : 2 + n1] = chain_tables(n1)[1] if chain else tree.verify_mask()
        return host

    def _tree_logits(self, host: np.ndarray, dev: torch.Tensor | None = None) -> torch.Tensor:
        """(N+1, V) logits of the rows packed in ``host`` (``dev``: already uploaded;
        uploaded here when None). The invariant mode makes its own per-chunk copies."""
        n1, start = host.shape[0], self._len
        if self.invariant:
            return self._verify_invariant(host)
        if self.graphs is not None:
            # tokens, positions and tree bits: the graph step's own (pinned) upload
            logits, self._argmax = self.graphs.run(host[:, : 2 + n1], start)  # (N+1, V), (N+1,)
            self._rows_x = self.model.last_x  # (N+1, C)
            self._pending = n1
            return logits
        with torch.inference_mode():
            dev = self._staging.upload(host) if dev is None else dev  # (N+1, 2 + N+1)
            mask = None
            if n1 > 1:  # a single row sees the whole cache: no mask needed
                mask = torch.cat(
                    [self._ones[:, :start].expand(n1, start), dev[:, 2 : 2 + n1].bool()], dim=1
                )  # (N+1, start + N+1)
            logits = self.model.forward(dev[:, 0], dev[:, 1], start, mask, need_logits=True)
            assert logits is not None
            self._rows_x = self.model.last_x  # (N+1, C)
            self._pending = n1
            return logits

    def _verify_invariant(self, host: np.ndarray) -> torch.Tensor:
        """``verify`` in batch-invariant mode: chunks of at most MAX_ROWS rows, padded to
        ``min_rows`` with copies of the chunk's first row (their K/V is not written, their
        attention not computed: only the linear layers see them)."""
        n1, start = host.shape[0], self._len
        step = getattr(getattr(self.model, "fused", None), "step", None)
        if (step is not None and self._native is not None and n1 <= MAX_ROWS
                and min_rows(self.dtype) == 1 and not self.model.cfg.window_layers):
            # the compiled forward from numpy tables, one chunk (``FusedForward.step``:
            # the same kernel arguments as the plan's path below, without its torch glue)
            if self._chain_rows == n1:  # (``_pack``: these rows are a chain's)
                extra, n_extra = chain_slots(start, n1)
            else:
                extra, n_extra = slot_table(start, host[:, 2 : 2 + n1])
            tokens, positions = host[:, 0].copy(), host[:, 1].copy()  # (N+1,) each
            with torch.inference_mode():
                last_x, xn = step(tokens, positions, start, start, extra, n_extra, n1)
                self.model.last_x = last_x
                logits = self.model.logits(xn)  # (N+1, V)
            self._rows_x, self._rows_fresh = last_x, True  # (N+1, C), FusedForward.step's own
            self._pending = n1
            return logits
        # Row i sees the cache, then its ancestors and itself among the new slots.
        vis = host[:, 2:].astype(bool) if n1 > 1 else np.ones((1, 1), bool)  # (N+1, N+1)
        rows = [(start + np.flatnonzero(vis[i])).tolist() for i in range(n1)]
        # the compiled float32 matmul is row-invariant at any row count (f32.py)
        pad = 1 if getattr(self.model, "native_f32", False) else min_rows(self.dtype)
        parts, xs = [], []
        with torch.inference_mode():
            for c0 in range(0, n1, MAX_ROWS):
                c1 = min(n1, c0 + MAX_ROWS)
                sel = list(range(c0, c1)) + [c0] * max(0, pad - (c1 - c0))
                # padding rows need no attention of their own (see block_attention)
                win = None
                if self.model.cfg.window_layers:  # (W, rows' positions, every slot's)
                    slot_pos = np.concatenate([np.arange(start), host[:, 1]])
                    win = (self.model.cfg.sliding_window, host[c0:c1, 1], slot_pos)
                plan = make_plan(start, rows[c0:c1], self.device, self._native, win)
                ids = torch.from_numpy(host[sel, :2]).to(self.device)  # (R, 2)
                logits = self.model.forward(
                    ids[:, 0], ids[:, 1], start + c0, None, True, plan=plan, n_write=c1 - c0
                )
                assert logits is not None and self.model.last_x is not None
                parts.append(logits[: c1 - c0])  # (c1 - c0, V)
                xs.append(self.model.last_x[: c1 - c0])  # (c1 - c0, C)
            self._rows_x = torch.cat(xs) if len(xs) > 1 else xs[0]  # (N+1, C)
            self._pending = n1
            return torch.cat(parts) if len(parts) > 1 else parts[0]

    def _finish(self, logits: torch.Tensor, need_logits: bool) -> Verified:
        """Argmax (and logits when asked for) of the verified rows, on the host."""
        with torch.inference_mode():
            if self._on_cpu:
                # Already on the host: .numpy() shares memory, no copy at all. torch's CPU
                # argmax over bfloat16 is slow (0.15 ms a row, 8 ms for 8 rows on 2 threads
                # on this project's CPU); over the exact float32 copy it is 0.03 ms a row,
                # with the same answer (first index of the maximum).
                native = (self._argmax_lib is not None and logits.is_contiguous()
                          and logits.dtype in (torch.bfloat16, torch.float32))
                if not need_logits and native:
                    # greedy: the compiled argmax reads the logits in place (same answer)
                    return Verified(argmax=native_argmax(self._argmax_lib, logits))
                lib = self._argmax_lib

                def argmax() -> np.ndarray:  # (N+1,) the same argmax, read in place
                    if native:
                        return native_argmax(lib, logits)
                    return logits.float().argmax(-1).numpy()

                if not need_logits:
                    return Verified(argmax=argmax())
                # sampling: the decoder samples the rows it descends through (``sample``
                # reads them in place); the float32 copy of every row and their argmax
                # only if read (``logits`` is this verify's own tensor: nothing overwrites it)
                return Verified(lazy_argmax=argmax, lazy_logits=lambda: logits.float().numpy(),
                                sample=self._row_sampler(logits))
            argmax = logits.argmax(dim=-1) if self._argmax is None else self._argmax  # (N+1,)
            self._argmax = None
            if not need_logits:
                return Verified(argmax=argmax.cpu().numpy())
            # One transfer: argmax rides along as an extra float32 column (exact: V < 2^24).
            packed = torch.cat([logits.float(), argmax[:, None].float()], dim=1).cpu()
            return Verified(
                argmax=packed[:, -1].numpy().astype(np.int64), logits=packed[:, :-1].numpy()
            )

    def _row_sampler(
        self, logits: torch.Tensor
    ) -> Callable[[int, np.ndarray, SamplingParams, float], int] | None:
        """``Verified.sample`` on CPU: a row's token from the compiled sampler
        (``csrc/sample.c``, read in place: 0.04 ms a row where numpy took 0.24 on this
        project's Zen 5 CPU) for a temperature and a penalty, ``next_token`` otherwise."""
        lib = self._sample_lib
        if lib is None or not logits.is_contiguous() or logits.dtype not in (torch.bfloat16, torch.float32):
            return None

        def sample(row: int, recent: np.ndarray, params: SamplingParams, u: float) -> int:
            if not native_sampling_takes(params):  # (the row as float32: exact)
                return next_token(logits[row].float().numpy(), recent, params, u)
            tokens = native_sample(lib, logits[row : row + 1], recent[None, :], np.array([u]), params)
            return int(tokens[0])

        return sample

    def commit(self, keep: np.ndarray) -> None:
        keep = np.asarray(keep, dtype=np.int64).reshape(-1)
        if not self._pending:
            raise DraftwiseError("commit() without a preceding verify()")
        kl = keep.tolist()  # a step's few rows: checked in plain Python (a per-step path)
        ordered = bool(kl) and kl[0] == 0 and all(a < b for a, b in zip(kl, kl[1:], strict=False))
        if not ordered or kl[-1] >= self._pending:
            raise DraftwiseError(
                f"commit rows {kl} must start at 0 and increase below {self._pending}"
            )
        k = len(kl)
        # Rows 0..k-1 kept in order (plain decoding, an accepted chain prefix) are already
        # in place; otherwise gather the kept slots down with one op over all layers.
        if kl[-1] != k - 1:
            with torch.inference_mode():
                src = torch.from_numpy(self._len + keep).to(self.device)  # (K,)
                self.model.move_slots(src, self._len)
        if self._rows is not None and self._rows_x is not None:
            if self._rows_fresh and kl[-1] == k - 1 and self._pending <= 4:
                # a chain prefix of a small step's own rows: a slice, no torch op (0.073 ->
                # 0.032 ms a commit in a live decode, AMD EPYC Zen 4, alternating; it keeps
                # at most 8 rows of memory for the 1-4 it records)
                self._record_rows(self._len, self._rows_x[:k])  # (K, C)
            else:
                with torch.inference_mode():  # a copy of the kept rows (the rest is freed)
                    at = torch.from_numpy(keep).to(self.device)  # (K,)
                    self._record_rows(self._len, self._rows_x.index_select(0, at))  # (K, C)
        self._len += k
        self._pending = 0
        self._rows_fresh = False
        if self._rows_x is not None:  # a view of the last kept row: no copy, no sync
            self._hidden_x, self._hidden_len = self._rows_x[kl[-1]], self._len
