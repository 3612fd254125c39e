"""Verify steps of fixed shapes, replayed from CUDA graphs: one graph per row bucket.

Eager PyTorch launches a few dozen kernels per layer, each paying microseconds of launch:
a 32-layer model spends milliseconds a step on launches whatever its size, which hides
what verifying a tree costs. Here every step (plain steps included) runs ``B`` rows, the
smallest bucket holding the tree, padded with copies of the root that see only the cache
and themselves. Everything the step needs is on the device before it starts: tokens,
positions, the cache length and the tree's ancestor bits go up in ONE host->device copy
(``(B, 3 + B)`` int64); the (B, S) attention bias over every cache slot and the slots the
rows' K/V go to are computed on the device from them, so one captured graph per bucket
replays at every cache length. The rows' argmax is computed in the graph; the backend
brings down only that (one sync a step), never the logits, at temperature 0.

Lossless: every shape in a bucket's graph is fixed, so a row's logits cannot depend on
how many real rows the step carries. Across buckets (a plain step runs bucket 1, a tree
bucket 16) the GEMMs have other shapes; ``rows_agree`` checks, once per model, that a
row's logits are bit-equal in every bucket, and drops the buckets where they differ from
the largest one's (at worst every step has the largest bucket's shapes, as the CPU's
invariant mode does).

Example::

    graphs = StepGraphs(model)                    # model: Llama, cache of S slots
    logits, argmax = graphs.run(host, start=120)  # host: (N+1, 2 + N+1), see TorchBackend._pack
    next_token = int(argmax[0].cpu())
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from draftwise.errors import DraftwiseError

BUCKETS = (1, 4, 16, 64)  # rows per captured step


@dataclass
class _Bucket:
    """One row count's static buffers (and graph, on CUDA)."""

    rows: int
    host: torch.Tensor  # (B, 3 + B) int64, pinned on CUDA: tokens, positions, start, bits
    dev: torch.Tensor  # (B, 3 + B) int64 on the device: the graph's input
    graph: torch.cuda.CUDAGraph | None = None
    outputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = field(default=None)


class StepGraphs:
    """Fixed-shape steps of one ``Llama`` (``forward_fixed``), captured per bucket on CUDA
    (``capture``; eager elsewhere: the same shapes and arithmetic, for CPU tests)."""

    def __init__(self, model, buckets: tuple[int, ...] = BUCKETS, capture: bool | None = None,
                 kernels: str = "auto") -> None:
        """``kernels``: "auto" (the row-invariant Triton kernels of ``rowinv.py`` on CUDA
        where they apply, captured or not, else torch's), "triton" (required; on CPU under Triton's
        interpreter, ``TRITON_INTERPRET=1``: the tests) or "torch"."""
        if not buckets or any(not isinstance(b, int) or b < 1 for b in buckets):
            raise DraftwiseError(f"graph buckets must be positive row counts, got {buckets!r}")
        if kernels not in ("auto", "triton", "torch"):
            raise DraftwiseError(f"graph kernels must be auto, triton or torch, got {kernels!r}")
        self.model = model
        self.buckets = tuple(sorted(set(buckets)))
        self.device = model.device
        self.capture = self.device.type == "cuda" if capture is None else capture
        if self.capture and self.device.type != "cuda":
            raise DraftwiseError("CUDA graphs need a CUDA device")
        self.slots = model.max_cache_len  # S: every step attends over all of them
        self._cols = torch.arange(self.slots, device=self.device)  # (S,)
        self._bufs: dict[int, _Bucket] = {}
        self.agree: bool | None = None  # rows_agree's answer, once asked
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        from draftwise.backends.cuda.gpu.rowinv import RowInvariant

        if kernels == "torch":
            model.rowinv = None
        elif kernels == "auto":
            model.rowinv = RowInvariant.build(model) if self.device.type == "cuda" else None
        else:
            why = RowInvariant.supported(model)
            if why is not None:
                raise DraftwiseError(f"the row-invariant kernels cannot run this model: {why}")
            model.rowinv = RowInvariant.build(model)
            if model.rowinv is None:
                raise DraftwiseError("the row-invariant kernels need Triton (pip install triton), "
                                     "DRAFTWISE_TRITON unset, and CUDA or TRITON_INTERPRET=1")
        self.kernels = "triton" if model.rowinv is not None else "torch"
        self._fallback = kernels == "auto"  # Triton kernels that fail fall back to torch's

    @property
    def max_rows(self) -> int:
        """The most rows one step carries (the largest bucket)."""
        return self.buckets[-1]

    def bucket(self, n: int) -> int:
        """The bucket ``n`` rows run in (``n`` <= ``max_rows``)."""
        if not 0 < n <= self.max_rows:
            raise DraftwiseError(f"a fixed-shape step carries 1..{self.max_rows} rows, got {n}")
        return next(b for b in self.buckets if b >= n)

    # ----- the step ---------------------------------------------------------------------
    def _compute(self, dev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The device work of one step from its input ``dev`` (B, 3 + B): logits (B, V),
        argmax (B,) and the last-layer residual rows (B, C)."""
        b = dev.shape[0]
        ids, pos, start = dev[:, 0], dev[:, 1], dev[:, 2:3]  # (B,), (B,), (B, 1)
        rel = self._cols[None, :] - start  # (B, S): slot index relative to the first new row
        inside = (rel >= 0) & (rel < b)  # (B, S): the step's own slots
        bits = dev[:, 3:].gather(1, rel.clamp(0, b - 1)) != 0  # (B, S): ancestor or self
        see = (rel < 0) | (inside & bits)  # (B, S): the cache prefix, then the tree
        bias = torch.zeros(see.shape, dtype=torch.float32, device=self.device)
        bias = bias.masked_fill(~see, float("-inf"))  # (B, S)
        slots = start[:, 0] + torch.arange(b, device=self.device)  # (B,)
        local = None
        w = self.model.cfg.sliding_window
        if w is not None and self.model.cfg.window_layers:  # gemma's sliding-window layers
            own = pos.gather(0, rel.clamp(0, b - 1).reshape(-1)).view(rel.shape)  # (B, S)
            keys = torch.where(inside, own, self._cols[None, :])  # (B, S): each slot's position
            local = bias.masked_fill(keys <= pos[:, None] - w, float("-inf"))  # (B, S)
        logits = self.model.forward_fixed(ids, pos, slots, bias, local)  # (B, V)
        assert self.model.last_x is not None
        return logits, logits.argmax(dim=-1), self.model.last_x

    def _buffer(self, b: int) -> _Bucket:
        buf = self._bufs.get(b)
        if buf is None:
            pin = self.device.type == "cuda"
            host = torch.zeros((b, 3 + b), dtype=torch.int64, pin_memory=pin)
            buf = _Bucket(b, host, torch.zeros((b, 3 + b), dtype=torch.int64, device=self.device))
            self._bufs[b] = buf
        return buf

    def _capture(self, buf: _Bucket) -> None:
        """Warm the step up on a side stream (cuBLAS picks its kernels there), then
        capture it; its outputs are the graph's own tensors, rewritten by each replay."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._compute(buf.dev)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            buf.outputs = self._compute(buf.dev)
        buf.graph = graph

    def run(self, host: np.ndarray, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows packed in ``host`` (N+1, 2 + N+1) int64 (token, position, tree mask among
        the rows) over a cache of ``start`` tokens -> device logits (N+1, V) and argmax
        (N+1,): views of the bucket's outputs, valid until the next step. Their K/V is
        written to slots ``start .. start+N`` (the padding rows' beyond, never seen)."""
        n1 = host.shape[0]
        if start + self.bucket(n1) > self.slots:
            raise DraftwiseError(
                f"a step of {n1} rows at cache length {start} passes the {self.slots} slots"
            )
        if self.agree is None:
            self._first_step(int(host[0, 0]), start)
        b = self.bucket(n1)
        buf = self._buffer(b)
        pack = buf.host.numpy()  # (B, 3 + B), shares the (pinned) memory
        pack[:n1, :2] = host[:, :2]
        pack[n1:, :2] = host[0, :2]  # padding: the root again
        pack[:, 2] = start
        pack[:, 3:] = 0
        pack[:n1, 3 : 3 + n1] = host[:, 2 : 2 + n1]
        pad = np.arange(n1, b)
        pack[pad, 3 + pad] = 1  # a padding row sees the cache and itself
        with torch.inference_mode():
            # the previous step's sync is done, so the pinned buffer is free to refill
            buf.dev.copy_(buf.host, non_blocking=True)
            if self.capture:
                if buf.graph is None:
                    self._capture(buf)
                assert buf.graph is not None
                buf.graph.replay()
                assert buf.outputs is not None
                logits, argmax, x = buf.outputs
            else:
                logits, argmax, x = self._compute(buf.dev)
            self.model.last_x = x[:n1]
            return logits[:n1], argmax[:n1]

    def _first_step(self, token: int, start: int) -> None:
        """``rows_agree`` at the first step, where the Triton kernels compile: if they
        fail to (a GPU or Triton they do not support) and were chosen automatically, the
        step falls back to torch's kernels, with a warning, before any output exists."""
        try:
            self.rows_agree(token, start)
        except Exception as exc:
            if self.kernels != "triton" or not self._fallback:
                raise
            import warnings

            warnings.warn(
                f"draftwise: the row-invariant Triton kernels failed ({type(exc).__name__}: "
                f"{str(exc)[:200]}); using torch's kernels (DRAFTWISE_TRITON=0 skips them)",
                RuntimeWarning, stacklevel=3,
            )
            self.model.rowinv, self.kernels = None, "torch"
            self._bufs.clear()
            self.rows_agree(token, start)

    def rows_agree(self, token: int, start: int) -> bool:
        """Are one row's logits bit-equal in every bucket (the row at the same position
        over the same cache, its neighbours padding)? Buckets whose row differs from the
        largest bucket's are dropped (a 1-row step may take a GEMV where 4 rows take a
        GEMM), so that every step kept computes a row as the largest bucket does. Asked
        once, at the first step; the K/V it writes lands past the cache (free slots).
        Returns whether all agreed."""
        self.agree = True
        if len(self.buckets) > 1 and start + self.max_rows <= self.slots:
            rows = {}
            with torch.inference_mode():
                for b in self.buckets:
                    dev = torch.zeros((b, 3 + b), dtype=torch.int64, device=self.device)
                    dev[:, 0], dev[:, 1], dev[:, 2] = token, start, start
                    dev[:, 3:] = torch.eye(b, dtype=torch.int64, device=self.device)
                    rows[b] = self._compute(dev)[0][0].clone()  # (V,)
                ref = rows[self.max_rows]
                keep = tuple(b for b in self.buckets if torch.equal(rows[b], ref))
            self.agree = keep == self.buckets
            self.buckets = keep
        return self.agree
