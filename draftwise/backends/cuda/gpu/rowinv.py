"""The fixed-shape CUDA step on row-invariant Triton kernels (``rowinv_kernels.py``).

``StepGraphs`` runs every verify step in a row bucket (1, 4, 16 or 64 rows) and keeps
only the buckets whose rows compute bit-equal to the largest bucket's. With cuBLAS the
Llama-3.1-8B shape kept only 64 (a split-K GEMM at other row counts), so a plain step
paid for 64 rows. Here every linear layer is ``_mm``, whose reduction order is fixed by
(N, K) alone, so every bucket computes a row the same way and a plain step runs 1 row
(measured on an H200, Llama-3.1-8B shape: 4.68 / 4.71 / 5.54 ms a step at 1 / 16 / 64
rows, against 7.30 with every step at cuBLAS's 64 rows: bench/results/gpu-nvidia-h200/
defaults-6). A layer also launches fewer kernels (9 instead of about 19): the RMSNorm,
the q/k/v projection (bias fused), RoPE with the K/V write, attention in slot chunks and
their merge, the output projection with the residual add fused, the RMSNorm, the
gate/up projection with ``act(gate) * up`` fused, and the down projection with the
residual add.

Used on CUDA when Triton imports and ``DRAFTWISE_TRITON`` is not ``0``
(``RowInvariant.build``); the torch step stays the reference and the fallback. On CPU
the kernels run under Triton's interpreter for the tests (``TRITON_INTERPRET=1``).

Example::

    fast = RowInvariant.build(model)            # None where it does not apply
    logits = fast.forward_fixed(ids, pos, slots, bias)   # as Llama.forward_fixed
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

import torch

from draftwise.errors import DraftwiseError

BM = 64  # GEMM rows per tile above 16 rows (16-row tiles up to 16: ``config``); fixed per (N, K)
BQ = 16  # query rows per program of the attention kernel (fixed, likewise)
BMS = (16, 32, 64)  # the tile heights DRAFTWISE_MM_BM may choose (one for every call)
ACTS = {"silu": 1, "gelu_pytorch_tanh": 2}
ATTN_BS = 64  # cache slots per block of the attention kernel (fixed: the softmax's order)


@dataclass(frozen=True)
class MMConfig:
    """One GEMM's tiles: ``bm`` rows, ``bn`` outputs and ``bk`` of the reduction a step,
    launched with ``warps`` warps and ``stages`` pipeline stages. ``bk`` (and, on a GPU,
    ``bm``: the matrix instructions' shape) may change a row's rounding; all five depend
    on (N, K) and the environment only, never on the row count."""

    bn: int
    bk: int
    warps: int = 4
    stages: int = 4
    bm: int = BM
    split: int = 1  # K in this many fixed parts walked side by side (``mm_split``)


def config(n: int, k: int, sms: int = 132) -> MMConfig:
    """Tiles for an (N, K) weight, the same for every row count.

    By default every GEMM takes tiles of 32 outputs by 128 of K, 6 pipeline stages
    deep, 64 rows high (``BM``: a tree of up to 64 rows reads each weight once), and
    ``RowInvariant.mm`` makes them 16 rows high for calls of up to 16 rows
    (``DRAFTWISE_MM_BM=bucket``, the default): the same K steps, so the same sums, on
    Hopper's 16-row matrix instructions instead of its 64-row ones. On an H200 the
    Llama-3.1-8B step took 5.45 / 5.42 / 6.10 ms at 1 / 16 / 64 rows with every bucket
    bit-equal, against 6.34 / 6.41 / 6.52 with 64-row tiles of 4 stages and one
    program walking the whole cache (bench/results/gpu-nvidia-h200/defaults-3; buckets
    that ever disagreed would be dropped by ``StepGraphs.rows_agree``). 16-row tiles for
    64 rows read each weight four times (14.2 ms). ``DRAFTWISE_MM_BM`` (16, 32 or 64)
    sets one tile height for every call; with 16 or 32 the tiles are the first H200
    session's. ``DRAFTWISE_MM_CONFIG=bn,bk,warps,stages`` overrides (for sweeps).
    ``DRAFTWISE_MM_SPLIT`` splits K where tiles are few (``mm_split``; measured no
    gain).

    >>> config(4096, 14336)
    MMConfig(bn=32, bk=128, warps=4, stages=6, bm=64, split=1)
    """
    bm, _ = _bm_mode()
    c = _tiles(n, k, sms, bm)
    return replace(c, split=mm_split(n, k, c, sms))


def _tiles(n: int, k: int, sms: int, bm: int) -> MMConfig:
    env = os.environ.get("DRAFTWISE_MM_CONFIG")
    if env:
        try:
            bn, bk, warps, stages = (int(v) for v in env.split(","))
        except ValueError:
            raise DraftwiseError(
                f"DRAFTWISE_MM_CONFIG must be 'bn,bk,warps,stages', got {env!r}"
            ) from None
        pow2 = all(v >= 16 and v & (v - 1) == 0 for v in (bn, bk))
        if not pow2 or warps not in (1, 2, 4, 8, 16) or not 1 <= stages <= 8:
            raise DraftwiseError(
                f"DRAFTWISE_MM_CONFIG={env!r}: bn and bk must be powers of two >= 16, warps "
                "1-16 (a power of two), stages 1-8"
            )
        return MMConfig(bn, bk, warps, stages, bm)
    if bm == 64:  # 6 stages of (64 + 2 x 32) x 128 bfloat16: 192 KiB of shared memory
        return MMConfig(32, 128, 4, 6, bm)
    for bn in (64, 32):
        if n // bn >= 2 * sms:
            return MMConfig(bn, 128 if bn == 64 else 256, bm=bm)
    return MMConfig(16, 256, bm=bm)


def mm_split(n: int, k: int, c: MMConfig, sms: int = 132) -> int:
    """``DRAFTWISE_MM_SPLIT``: split-K for the GEMMs with few weight tiles. ``0`` (the
    default) never splits; ``T`` (1-16) doubles a GEMM's parts of K while it has fewer
    than T x SMs programs, each part at least 2 K steps (a fixed split per (N, K),
    so every row count sums a row in the same parts; ``_mm_reduce`` adds them in order).

    >>> mm_split(4096, 4096, MMConfig(32, 128))
    1
    >>> os.environ["DRAFTWISE_MM_SPLIT"] = "2"; mm_split(4096, 4096, MMConfig(32, 128))
    4
    >>> del os.environ["DRAFTWISE_MM_SPLIT"]
    """
    env = os.environ.get("DRAFTWISE_MM_SPLIT", "").strip() or "0"
    if not env.isdigit() or int(env) > 16:
        raise DraftwiseError(f"DRAFTWISE_MM_SPLIT must be 0-16 (programs per SM to aim for), got {env!r}")
    target = int(env) * sms
    tiles = -(-n // c.bn)
    split = 1
    while tiles * split < target and k % (2 * split * c.bk * 2) == 0 and split < 16:
        split *= 2
    return split


SMALL_CACHE = 2048  # caches of up to this many slots take attention chunks of 128, larger 256


def attn_chunk() -> int | None:
    """``DRAFTWISE_ATTN_CHUNK``: cache slots per program of the attention kernel, a
    multiple of ``ATTN_BS`` (0: one program walks every slot of its rows); unset: by the
    cache's size (``chunk_slots``). Programs walk the chunks side by side and a second
    kernel merges them in a fixed order (flash decoding), so long contexts take as many
    programs as chunks. A row's bits depend on the chunk, which is fixed by the cache's
    size, never by the step's rows.

    >>> attn_chunk() is None
    True
    """
    env = os.environ.get("DRAFTWISE_ATTN_CHUNK", "").strip()
    if not env:
        return None
    if not env.isdigit() or int(env) % ATTN_BS or int(env) > 1 << 20:
        raise DraftwiseError(
            f"DRAFTWISE_ATTN_CHUNK must be 0 or a multiple of {ATTN_BS} slots, got {env!r}"
        )
    return int(env)


def chunk_slots(chunk: int | None, slots: int) -> int:
    """The attention chunk for a cache of ``slots`` slots: ``chunk`` where set
    (``attn_chunk``), else 128 slots up to ``SMALL_CACHE`` slots and 256 above. On an
    H200 (Llama-3.1-8B) the one-row step took 4.68 ms in chunks of 128 against 4.91 in
    chunks of 256 at context 512 (a 640-slot cache; bench/results/gpu-nvidia-h200/
    defaults-6), and 6.12 ms in chunks of 256 against 6.85 in chunks of 128 at context
    7,936 of an 8,192-slot cache (defaults-4, before the pipelined loop), where the merge
    walks twice the chunks; one program a kv head took 13.9 ms there.

    >>> chunk_slots(None, 640), chunk_slots(None, 8192), chunk_slots(64, 8192)
    (128, 256, 64)
    """
    if chunk is not None:
        return chunk
    return 128 if slots <= SMALL_CACHE else 256


def mm_narrow() -> int:
    """``DRAFTWISE_MM_NARROW``: GEMMs of at most this many outputs keep the 64-row tiles
    in calls of up to 16 rows too (4096 by default: the 8B shape's o and down
    projections; 0: none do). The same K steps either way.

    >>> mm_narrow()
    4096
    """
    env = os.environ.get("DRAFTWISE_MM_NARROW", "").strip() or "4096"
    if not env.isdigit() or int(env) > 1 << 24:
        raise DraftwiseError(f"DRAFTWISE_MM_NARROW must be a count of outputs (0 or more), got {env!r}")
    return int(env)


def attn_pipe() -> int:
    """``DRAFTWISE_ATTN_PIPE``: 1-4 (2 by default) walks an attention chunk's slot
    blocks in a loop bounded by values (the step's last slot), whose K and V loads
    Triton pipelines that many stages deep; 0 walks the same blocks in the same order in
    a loop of constant bounds, each block behind an ``if``: the same bits. GPU only (the
    interpreter runs 0).

    >>> attn_pipe()
    2
    """
    env = os.environ.get("DRAFTWISE_ATTN_PIPE", "").strip() or "2"
    if env not in ("0", "1", "2", "3", "4"):
        raise DraftwiseError(f"DRAFTWISE_ATTN_PIPE must be 0-4 (pipeline stages; 0: off), got {env!r}")
    return int(env)


def switch(name: str, default: bool) -> bool:
    """An on/off environment switch, ``0`` or ``1`` (checked, the bad value named).

    >>> switch("DRAFTWISE_MM_WIDE", True)
    True
    """
    choice = os.environ.get(name, "1" if default else "0")
    if choice not in ("0", "1"):
        raise DraftwiseError(f"{name} must be 0 or 1, got {choice!r}")
    return choice == "1"


def _bm_mode() -> tuple[int, bool]:
    """``DRAFTWISE_MM_BM``, checked: (the tiles' height in ``config``, whether calls of
    up to 16 rows take 16-row tiles). ``bucket`` (the default): (``BM``, True); 16, 32 or
    64: that height for every call."""
    env = os.environ.get("DRAFTWISE_MM_BM", "").strip()
    if not env or env == "bucket":
        return BM, True
    if env not in {str(b) for b in BMS}:
        raise DraftwiseError(
            f"DRAFTWISE_MM_BM must be one of {', '.join(map(str, BMS))} or bucket, got {env!r}"
        )
    return int(env), False


class RowInvariant:
    """Launchers of the row-invariant kernels for one ``Llama`` and its fixed step."""

    def __init__(self, model: Any, interpret: bool = False) -> None:
        from draftwise.backends.cuda.gpu import rowinv_kernels as kern

        self.model, self.k, self.interpret = model, kern, interpret
        cfg = model.cfg
        self.act = ACTS[cfg.act]
        dev = model.device
        self.sms = (
            torch.cuda.get_device_properties(dev).multi_processor_count
            if dev.type == "cuda"
            else 132
        )
        self._cfg: dict[tuple[int, int], MMConfig] = {}
        # DRAFTWISE_MM_BM=bucket (the default): 16-row tiles up to 16 rows, 64-row ones above
        # (bit-equal on an H200; StepGraphs.rows_agree drops a bucket where they are not)
        _, self.bm_by_rows = _bm_mode()
        # DRAFTWISE_MM_WIDE (on by default): those 16-row tiles 64 outputs wide where a GEMM
        # has one such tile an SM or more (gate/up, the head), and DRAFTWISE_TRITON_NORM (on
        # by default): the RMSNorms on ``_rmsnorm`` (one program a row) instead of torch's
        # fused kernel. On an H200 the 8B one-row step took 5.05 ms with both against 5.30
        # without (16 rows 5.12 against 5.37, 64 rows 5.77 against 6.13; every bucket
        # agreeing: bench/results/gpu-nvidia-h200/defaults-4)
        self.wide = switch("DRAFTWISE_MM_WIDE", True)
        self.own_norm = switch("DRAFTWISE_TRITON_NORM", True)
        # DRAFTWISE_MM_NARROW=N: GEMMs of at most N outputs keep the 64-row tiles at every
        # row count (alone on an H200 the 8B o and down projections read 2,755 and 3,457
        # GB/s at one row in 64-row tiles against 2,616 and 3,170 in 16-row ones). With it
        # and the pipelined attention loop (DRAFTWISE_ATTN_PIPE) the 8B one-row step took
        # 4.76 ms against 4.94 (16 rows 4.84 against 4.96, 64 rows 5.56 against 5.75; every
        # bucket agreeing, identity on 1B and 8B: bench/results/gpu-nvidia-h200/defaults-5)
        self.narrow = mm_narrow()
        # DRAFTWISE_PDL (on by default, Hopper and later): every kernel launched with
        # programmatic dependent launch, so it is scheduled while the one before drains,
        # and waits for that one's writes (``gdc_wait``) before it reads anything. On an
        # H200 the 1B one-row step took 1.32 ms against 1.47, the 8B one 4.93 against 4.91;
        # with attention chunks of 128 the 8B one 4.68 (bench/results/gpu-nvidia-h200/defaults-6)
        hopper = dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9
        self.pdl = switch("DRAFTWISE_PDL", True) and hopper and not interpret
        self.launch = {"PDL": self.pdl, "launch_pdl": self.pdl}  # every launcher's PDL arguments
        # the attention kernel instead of SDPA (DRAFTWISE_TRITON_ATTN=0 for SDPA): on an H100
        # the 8B shape's one-row step 6.55 ms against SDPA's 7.02 (every bucket agreeing)
        self.attn = switch("DRAFTWISE_TRITON_ATTN", True)
        self.chunk = attn_chunk()
        self.pipe = 0 if interpret else attn_pipe()
        # RMSNorm inside the GEMMs that read it (DRAFTWISE_NORM_IN_GEMM=1): 65 launches
        # fewer a step of the 8B shape (0.39 ms of kernels on an H200); off until timed
        self.norm_in_gemm = switch("DRAFTWISE_NORM_IN_GEMM", False)

    @classmethod
    def supported(cls, model: Any) -> str | None:
        """Why the kernels cannot run ``model`` (None: they can)."""
        if model.int4 or model.native_f32:
            return "packed CPU weights"
        if model.device.type == "cuda" and model.dtype not in (torch.bfloat16, torch.float16):
            return f"dtype {model.dtype} (the kernels run bfloat16 or float16 on a GPU)"
        if model.cfg.act not in ACTS:
            return f"activation {model.cfg.act!r}"
        lins = [w for layer in model.layers for w in (layer.wqkv, layer.wo, layer.w13, layer.w2)]
        if not all(isinstance(w, torch.Tensor) for w in lins + [model.lm_head]):
            return "packed weights"
        return None

    @classmethod
    def build(cls, model: Any) -> RowInvariant | None:
        """The kernels for ``model`` on CUDA (on CPU only under Triton's interpreter,
        ``TRITON_INTERPRET=1`` set before anything imports Triton: the tests), None where
        they do not apply: no Triton, ``DRAFTWISE_TRITON=0``, or a model they do not
        cover (``supported``)."""
        if not switch("DRAFTWISE_TRITON", True):
            return None
        interpret = os.environ.get("TRITON_INTERPRET") == "1"
        if model.device.type != "cuda" and not interpret:
            return None
        if cls.supported(model) is not None:
            return None
        try:
            import triton  # noqa: F401
        except ImportError:
            return None
        return cls(model, interpret)

    # ----- launchers ------------------------------------------------------------------
    def mm(
        self,
        x: torch.Tensor,
        w: torch.Tensor,
        *,
        bias: torch.Tensor | None = None,
        glu: bool = False,
        res: torch.Tensor | None = None,
        heads: tuple[int, int] | None = None,
        rows: int | None = None,
        norm: torch.Tensor | None = None,
        cfg: MMConfig | None = None,
    ) -> torch.Tensor:
        """``x`` (M, K) @ ``w`` (N, K).T -> (M, N) (``glu``: w is (2F, K), gate rows then
        up rows, and out (M, F) = act(gate) * up), plus ``bias`` (N,), plus ``res``
        (M, N). ``heads=(head_dim, rep)``: ``x`` is attention's output (1, G, rep*M, D)
        and ``rows`` is M. ``norm`` (K,): ``x`` is the input of an RMSNorm of that weight
        (the model's eps), applied inside the GEMM. ``cfg``: other tiles than
        ``config``'s (sweeps only: a row's rounding then differs from the step's)."""
        n_all, k = w.shape
        n = n_all // 2 if glu else n_all
        if heads is None:
            m = x.shape[0]
            if x.stride(-1) != 1:
                x = x.contiguous()
            sxm, sxg, sxr, hd, rep = x.stride(0), 0, 0, 1, 1
        else:
            hd, rep = heads
            assert rows is not None
            m = rows
            if x.stride(-1) != 1:
                x = x.contiguous()
            sxm, sxg, sxr = 0, x.stride(1), x.stride(2)
        if w.stride(-1) != 1:
            raise DraftwiseError("row-invariant GEMM needs a row-major weight")
        out = torch.empty((m, n), dtype=w.dtype, device=w.device)
        if res is not None and res.stride(-1) != 1:
            res = res.contiguous()
        c = cfg or self._cfg.get((n, k))
        if c is None:
            c = self._cfg[(n, k)] = config(n, k, self.sms)
        if self.bm_by_rows and m <= 16 and cfg is None and n > self.narrow:  # DRAFTWISE_MM_BM=bucket
            wide = self.wide and n // 64 >= self.sms
            c = replace(c, bm=16, bn=64 if wide else c.bn)
        split = c.split if k % (c.split * c.bk) == 0 else 1
        ws = out
        if split > 1:  # the parts' float32 sums (and the GLU's up sums, the norm's squares)
            ws = torch.empty(split * m * (n * (2 if glu else 1) + (1 if norm is not None else 0)),
                             dtype=torch.float32, device=w.device)
        eps = float(self.model.cfg.norm_eps) if norm is not None else 0.0
        grid = (triton_cdiv(m, c.bm) * triton_cdiv(n, c.bn) * split,)
        self.k._mm[grid](
            x,
            w,
            out,
            res if res is not None else out,
            bias if bias is not None else out,
            norm if norm is not None else out,
            ws,
            eps,
            m,
            n,
            k,
            sxm,
            sxg,
            sxr,
            w.stride(0),
            out.stride(0),
            res.stride(0) if res is not None else 0,
            n,
            A_HEADS=heads is not None,
            HD=hd,
            REP=rep,
            HAS_BIAS=bias is not None,
            ACT=self.act if glu else 0,
            HAS_RES=res is not None,
            NORM=norm is not None,
            EVEN_K=k % c.bk == 0,
            UPCAST=self.interpret,
            BM=c.bm,
            BN=c.bn,
            BK=c.bk,
            SPLIT=split,
            num_warps=c.warps,
            num_stages=c.stages,
            **self.launch,
        )
        if split > 1:
            self.k._mm_reduce[(triton_cdiv(m, 16), triton_cdiv(n, 64))](
                ws,
                out,
                res if res is not None else out,
                bias if bias is not None else out,
                eps,
                m,
                n,
                k,
                out.stride(0),
                res.stride(0) if res is not None else 0,
                HAS_BIAS=bias is not None,
                ACT=self.act if glu else 0,
                HAS_RES=res is not None,
                NORM=norm is not None,
                SPLIT=split,
                BM=16,
                BN=64,
                **self.launch,
            )
        return out

    def norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """RMSNorm of rows ``x`` (B, C) with weight ``w`` (C,) and the model's eps: torch's
        fused kernel (``Llama.norm_rows``) with ``DRAFTWISE_TRITON_NORM=0``, else ``_rmsnorm``."""
        if not self.own_norm:
            return self.model.norm_rows(x, w)
        if x.stride(-1) != 1:
            x = x.contiguous()
        b, c = x.shape
        out = torch.empty_like(x)
        self.k._rmsnorm[(b,)](x, w, out, float(self.model.cfg.norm_eps), c, x.stride(0), out.stride(0),
                              BC=triton_next_pow2(c), **self.launch)
        return out

    def rope_kv(
        self,
        qk: torch.Tensor,
        v: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        kv: torch.Tensor,
    ) -> torch.Tensor:
        """RoPE of ``qk`` (B, H + H_kv, D) at ``positions`` (B,), k and ``v`` (B, H_kv, D)
        into ``kv`` (2, H_kv, S, D) at ``slots`` (B,); returns q (1, H_kv, rep B, D)."""
        cfg = self.model.cfg
        b = qk.shape[0]
        h, hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        rep = h // hkv
        q = torch.empty((1, hkv, rep * b, d), dtype=qk.dtype, device=qk.device)
        assert qk.stride(-1) == 1 and qk.stride(-2) == d and v.stride(-1) == 1 and v.stride(-2) == d
        assert kv.stride(-1) == 1 and cos.stride(-1) == 1 and slots.stride(0) == 1
        self.k._rope_kv[(b, h + 2 * hkv)](
            qk,
            v,
            cos,
            sin,
            positions,
            slots,
            q,
            kv,
            b,
            positions.stride(0),
            qk.stride(0),
            v.stride(0),
            cos.stride(0),
            q.stride(1),
            q.stride(2),
            kv.stride(0),
            kv.stride(1),
            kv.stride(2),
            H=h,
            HKV=hkv,
            D=d,
            R=cfg.rot_dim,
            REP=rep,
            BD=triton_next_pow2(d),
            **self.launch,
        )
        return q

    def attend(
        self, q: torch.Tensor, kv: torch.Tensor, bias: torch.Tensor, slots: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Attention of ``q`` (1, H_kv, rep B, D) (``rope_kv``'s) over the slots of ``kv``
        (2, H_kv, S, D) under ``bias`` (B, S) additive -> (B, H D), the layout the output
        projection reads as plain rows. ``slots`` (B,): the step rows' own slots, the last
        the highest; the kernel stops after it (the bias must hide every later slot), with
        the bits of walking all S."""
        cfg = self.model.cfg
        _, g, r, d = q.shape
        b, s = bias.shape[0], kv.shape[2]
        if bias.shape[1] != s or r % b:
            raise DraftwiseError(f"attention bias {tuple(bias.shape)} for {r} query rows over {s} slots")
        rep = r // b
        out = torch.empty((b, g * rep * d), dtype=q.dtype, device=q.device)  # (B, H D)
        if bias.stride(-1) != 1:
            bias = bias.contiguous()
        assert q.stride(-1) == 1 and kv.stride(-1) == 1
        scale = cfg.attn_scale if cfg.attn_scale is not None else d**-0.5
        cap = cfg.attn_softcap
        bd, tiles = max(16, triton_next_pow2(d)), triton_cdiv(r, BQ)
        chunk = chunk_slots(self.chunk, s)
        split = 0 < chunk < s
        chunk = chunk if split else s
        nc = triton_cdiv(s, chunk)
        # the chunks' running max, sum and unnormalised output: (G, T, NC, BQ, BD + 2)
        part = torch.empty((g, tiles, nc, BQ, bd + 2), dtype=torch.float32, device=q.device) if split else out
        bound = bias if slots is None else slots
        self.k._attn[(g, tiles, nc)](
            q,
            kv,
            bias,
            out,
            bound,
            part,
            b,
            r,
            q.stride(1),
            q.stride(2),
            kv.stride(0),
            kv.stride(1),
            kv.stride(2),
            bias.stride(0),
            out.stride(0),
            float(scale),
            float(cap or 1.0),
            S=s,
            D=d,
            REP=rep,
            BD=bd,
            BQ=BQ,
            BS=ATTN_BS,
            CHUNK=chunk,
            SOFTCAP=cap is not None,
            UPCAST=self.interpret,
            BOUNDED=slots is not None,
            SPLIT=split,
            PIPE=self.pipe,
            **self.launch,
        )
        if split:
            self.k._attn_combine[(g, tiles)](
                part, out, bound, b, r, out.stride(0),
                S=s, D=d, REP=rep, BD=bd, BQ=BQ, CHUNK=chunk, NC=nc, BOUNDED=slots is not None,
                **self.launch,
            )
        return out

    # ----- the step -------------------------------------------------------------------
    def forward_fixed(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        bias: torch.Tensor,
        local: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``Llama.forward_fixed`` on these kernels: same arguments, logits (B, V)."""
        model = self.model
        cfg = model.cfg
        t = tokens.shape[0]
        h, hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        rep = model.n_rep
        rows_bias, rows_local = bias, local  # (B, S): the attention kernel's
        bias = bias.to(model.dtype).repeat(rep, 1)  # (rep B, S): SDPA's
        if local is not None:
            local = local.to(model.dtype).repeat(rep, 1)  # (rep B, S)
        x = model.embed_rows(tokens)  # (B, C)
        fold = self.norm_in_gemm
        for li, layer in enumerate(model.layers):
            if fold:
                qkv = self.mm(x, layer.wqkv, bias=layer.bqkv, norm=layer.attn_norm)
            else:
                hn = self.norm(x, layer.attn_norm)  # (B, C)
                qkv = self.mm(hn, layer.wqkv, bias=layer.bqkv)  # (B, (H + 2 H_kv) D)
            qk = qkv[:, : (h + hkv) * d].view(t, h + hkv, d)  # (B, H + H_kv, D)
            if layer.q_norm is not None:
                qk = model.qk_norm(layer, qk).contiguous()
            v = qkv[:, (h + hkv) * d :].view(t, hkv, d)  # (B, H_kv, D)
            cos, _ = model.ropes[layer.rope]
            kv = model.cache[li]  # (2, H_kv, S, D)
            q = self.rope_kv(qk, v, cos, model.sins_signed[layer.rope], positions, slots, kv)
            windowed = layer.window and local is not None
            if self.attn:
                o = self.attend(q, kv, rows_local if windowed else rows_bias, slots)  # (B, H D)
                heads, rows = None, None
            else:
                mask = local if windowed else bias
                o = model.attention(
                    q, kv[0].unsqueeze(0), kv[1].unsqueeze(0), mask
                )  # (1, H_kv, rep B, D)
                heads, rows = (d, rep), t
            if layer.post_attn_norm is None:
                x = self.mm(o, layer.wo, res=x, heads=heads, rows=rows)  # (B, C)
            else:  # gemma: the norm comes between the projection and the residual
                a = self.mm(o, layer.wo, heads=heads, rows=rows)
                x = x + self.norm(a, layer.post_attn_norm)
            if fold:
                g = self.mm(x, layer.w13, glu=True, norm=layer.mlp_norm)  # (B, F)
            else:
                hn = self.norm(x, layer.mlp_norm)  # (B, C)
                g = self.mm(hn, layer.w13, glu=True)  # (B, F)
            if layer.post_mlp_norm is None:
                x = self.mm(g, layer.w2, res=x)  # (B, C)
            else:
                x = x + self.norm(self.mm(g, layer.w2), layer.post_mlp_norm)
        model.last_x = x  # (B, C)
        if fold:
            out = self.mm(x, model.lm_head, norm=model.norm)  # (B, V)
        else:
            out = self.mm(self.norm(x, model.norm), model.lm_head)  # (B, V)
        if cfg.final_softcap is not None:
            out = torch.tanh(out / cfg.final_softcap) * cfg.final_softcap
        return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def triton_next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()
