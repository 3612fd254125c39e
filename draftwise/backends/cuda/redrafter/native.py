"""The ReDrafter drafting step compiled (``cpu/csrc/redrafter.c``): one C call a beam step.

``TorchRecurrentStep`` with ``int8=True`` runs a beam step as about thirty torch ops,
seven of them ``_weight_int8pack_mm`` calls. ``NativeRecurrentStep`` computes the same
network in three compiled calls: ``dw_rd_start`` once per proposal (the final norm of
the target's last residual row, then its parts of the first ResBlock, the query and the
gate), ``dw_rd_entries`` for the context's new entries (their keys and values), and
``dw_rd_step`` for each beam step (cell, attention, copy gate, ResBlocks, head, extra
ids, the mixture); ``dw_rd_chain`` runs a whole one-beam draft (``ReDrafter`` at
``bw=1``) in one call. Weights are int8 with one float32 scale per output row, rounded as
the torch step rounds them (the head and the cell in 4-bit values, ``step.FOUR_BIT``,
which the int8 products read packed two a byte: ``pack4``), and the other layers
(``step.GROUPED``) in 4-bit values with a bfloat16 scale per 32 inputs, packed too
(``groups=True``, the default where the int8 products exist; AMD EPYC Zen 4, live, a
one-token proposal 0.342 -> 0.295 ms, the same tokens a step); activations are float32
(the torch step rounds them to bfloat16) or int8 with one scale per group of 4 inputs, multiplied by ``vpdpbusd`` where
the CPU has ``avx512_vnni`` and by ``vpmaddubsw`` elsewhere (AVX2; ``csrc/redrafter.c``;
an AMD EPYC Zen 3, warm, a three-token chain at 112 entries: 0.52 ms against 0.71 with
float32 activations, 0.74-0.85 before its softmax, SiLU and context attention had 8-lane
paths), so the drafts can differ from
the torch step's at near-ties; the output never does (the target verifies every token).
``tests/backends/cuda/redrafter`` checks both give the same draft distributions within
the weights' rounding and the same drafts on the real model. The weights come cold (the
target's forward evicts them): each output group prefetches the next ones.

Measured in a live decode (default model, 4bit mode, 6 corpus prompts x 128 tokens,
``redrafter:bw=1,t=3``, AMD EPYC Zen 5, 2 threads; medians): a beam step 0.13 ms
(torch: 0.41), a proposal's start 0.17 ms (torch: 0.42), a whole proposal 0.6 ms with
``chain`` (0.75 through ``step``; torch: 2.1), 406-436 tok/s (torch: 300). Later (the
entries' scores, the extra ids' dot products, maxima, sums and SiLU vectorised; 13
Spec-Bench prompts, ``redrafter:bw=1,t=1``, same CPU): a one-token chain 0.17 -> 0.12 ms
(median), 0.41-0.43 -> 0.23 ms at 400-1,600 context entries. With ``vpdpbusd`` (AMD
EPYC Zen 5, 2 threads): a three-token chain 0.15-0.16 ms against 0.22-0.24 with float32
products (warm, a short prompt); with the context attention's heads on the threads too,
``redrafter:bw=1,t=3`` drafted 0.37-0.39 ms a step in Spec-Bench against 0.46-0.51
(``bench/results/specbench-4bit-rdvnni``). Its 4-bit layers read packed there too (half
their bytes; AMD EPYC Zen 4, a live decode of 26 Spec-Bench prompts, alternating in one
process: a three-token chain 0.51-0.53 ms against 0.66-0.71 read as bytes, the whole
proposal 0.82-0.84 against 0.96-1.01).

Where the build has avx512_vnni, every 4-bit layer is also held in tiles of 16 outputs x
32 inputs (``tile4``) and multiplied as the target's 4-bit kernel does (a vpdpbusd lane
is an output; the activations int8 per 32 inputs instead of 4: one int32 sum, one
conversion and one FMA per 16 outputs and block; ``csrc/redrafter.c``, ``tile_mv``).
AMD EPYC Zen 4, 2 threads, warm: a one-token chain 0.082 -> 0.045 ms, a three-token
chain 0.25 -> 0.136; in a live decode (56 held-out corpus prompts x 128 tokens,
``redrafter:bw=1,t=3``, alternating in one process) drafting 0.76 -> 0.63 ms a step,
MAT 2.089 -> 2.086 and the same 56 texts (``bench/results/specbench-4bit-zen4/session-p``).

Example::

    step = NativeRecurrentStep(net, backend, extend=True)   # needs redrafter_lib()
    step.start(cache_len, context)
    logp = step.step(np.array([root]), np.array([-1]))      # (1, K + E) float32
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import torch

from draftwise.backends.cuda.cpu.native import kernel_threads, redrafter_lib
from draftwise.backends.cuda.redrafter.net import ReDrafterNet
from draftwise.backends.cuda.redrafter.step import (
    GROUP,
    GROUPED,
    INT8_LEVELS,
    TorchRecurrentStep,
    levels_of,
    quantize_groups,
    quantize_rows,
)

P, I64, F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
# the residual rows C reads where they are, and its flag for each dtype
_ROW_DTYPES = {torch.float32: 0, torch.bfloat16: 1}


class _I8(ctypes.Structure):
    """``DwI8``: one int8 layer (codes (n, k), scales (n,), bias (n,) or NULL, the codes +
    128 as uint8 (n, k) or NULL, the 4-bit codes packed (n, k / 2) (``pack4``) or NULL,
    a ``GROUPED`` layer's bfloat16 scales (n, k / 32) or NULL, the 4-bit codes in tiles
    (n / 16, k / 32, 256) (``tile4``) or NULL, and the group scales in the tiles' order
    (n / 16, k / 32, 16) or NULL)."""

    _fields_ = [
        ("w", P), ("scale", P), ("bias", P), ("wu", P), ("w4", P), ("n", I64), ("k", I64),
        ("gs", P), ("tw", P), ("tg", P),
    ]


class _Net(ctypes.Structure):
    """``DwRdNet``: sizes, layers, the gate's [s, o] row and the target's embedding."""

    _fields_ = [
        ("c", I64), ("d", I64), ("heads", I64), ("kdraft", I64), ("vocab", I64), ("nres", I64),
        ("w", _I8), ("u", _I8), ("res_s", _I8), ("proj", _I8), ("head", _I8),
        ("q_se", _I8), ("wo", _I8), ("res", P), ("g_so", P), ("embed", P),
    ]


class _Proposal(ctypes.Structure):
    """``DwRdProposal``: what one proposal holds for all its beam steps."""

    _fields_ = [
        ("h", P), ("hr", P), ("hq", P), ("hg", F32), ("xbias", F32),
        ("keys", P), ("vals", P), ("cols", P), ("m", I64), ("extra", P), ("e", I64),
    ]


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def native_supported(net: ReDrafterNet) -> bool:
    """Whether the compiled step exists here and takes this network's sizes (every
    layer's outputs a multiple of 4, inputs of 16)."""
    cfg = net.cfg
    dims = [cfg.hidden, 2 * cfg.hidden, cfg.draft_vocab, cfg.context_dim]
    return redrafter_lib() is not None and all(n % 16 == 0 for n in dims)


def _quantize(
    weight: torch.Tensor, bias: torch.Tensor | None, levels: int = INT8_LEVELS
) -> tuple[torch.Tensor, ...]:
    """(N, K) weight -> int8 codes (N, K), float32 scales (N,) and bias (N,) or an empty
    tensor: the rounding of ``step.StepLinear`` (``quantize_rows``)."""
    codes, scale = quantize_rows(weight, levels)
    b = torch.empty(0) if bias is None else bias.detach().float().contiguous()
    return codes, scale, b


def pack4(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) int8 codes in -7..7 (K a multiple of 32) -> (N, K / 2) uint8, as the int8
    step reads them: in each group of 32 inputs, byte t holds code t + 8 in its low four
    bits and code 16 + t + 8 in its high four.

    Example::

        >>> c = torch.arange(32, dtype=torch.int8)[None] % 15 - 7
        >>> p = pack4(c)
        >>> p.shape, int(p[0, 0]) & 15, int(p[0, 0]) >> 4   # codes -7 and 16 % 15 - 7 = -6
        (torch.Size([1, 16]), 1, 2)
    """
    n, k = codes.shape
    if k % 32 or int(codes.min()) < -7 or int(codes.max()) > 7:
        raise ValueError(f"4-bit packing needs codes in -7..7 and K % 32 == 0, got K = {k}")
    c = (codes.to(torch.int16) + 8).to(torch.uint8).view(n, k // 32, 2, 16)
    return (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(n, k // 2).contiguous()


def tile4(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) int8 codes in -7..7 (N a multiple of 16, K of 32) -> (N / 16, K / 32, 256)
    uint8 tiles of 16 outputs x 32 inputs, as ``csrc/redrafter.c``'s tiled products read
    them: in a tile's 64-byte group g, byte 4 i + e holds output i's code + 8 of input
    8 g + e in its low four bits and of input 8 g + 4 + e in its high four.

    Example::

        >>> c = (torch.arange(32 * 32).reshape(32, 32) % 15 - 7).to(torch.int8)
        >>> t = tile4(c)
        >>> t.shape, int(t[0, 0, 4]) & 15, int(t[0, 0, 4]) >> 4   # output 1: inputs 0, 4
        (torch.Size([2, 1, 256]), 3, 7)
    """
    n, k = codes.shape
    if n % 16 or k % 32 or int(codes.min()) < -7 or int(codes.max()) > 7:
        raise ValueError(
            f"4-bit tiles need codes in -7..7, N % 16 == 0 and K % 32 == 0, got {n} x {k}")
    c = (codes.to(torch.int16) + 8).to(torch.uint8)
    # (tile, i, block, g, half, e) -> (tile, block, g, i, e, half)
    c = c.view(n // 16, 16, k // 32, 4, 2, 4).permute(0, 2, 3, 1, 5, 4)
    return (c[..., 0] | (c[..., 1] << 4)).reshape(n // 16, k // 32, 256).contiguous()


def tile_scales(gs: torch.Tensor) -> torch.Tensor:
    """(N, K / 32) group scales -> (N / 16, K / 32, 16) in ``tile4``'s order."""
    n, nb = gs.shape
    return gs.view(n // 16, 16, nb).permute(0, 2, 1).contiguous()


class NativeRecurrentStep(TorchRecurrentStep):
    """``TorchRecurrentStep`` (int8, on CPU) whose beam step is one compiled call."""

    compiled = True  # ``auto`` prices its drafting as the compiled step's (member_pays)

    def __init__(
        self, net: ReDrafterNet, backend: Any, extend: bool = False, pack4: bool = True,
        groups: bool = True, tiles: bool = True,
    ) -> None:
        super().__init__(net, backend, int8=True, extend=extend, torch_layers=False)
        # the 4-bit layers read packed (``pack4``) where the int8 products run (vpdpbusd
        # or AVX2's): half their bytes, the same results (False: from their int8 codes;
        # tests compare the two)
        self.pack4 = pack4
        # the ``GROUPED`` layers in 4-bit values with a scale per 32 inputs, read packed
        # (False: int8 rows, as before; a live decode on an AMD EPYC Zen 4 alternating
        # both: see ``step.GROUPED``)
        self.groups = groups
        lib = redrafter_lib()
        # the 4-bit layers also in tiles of 16 outputs x 32 inputs, where the build has
        # the tiled products (avx512_vnni; ``tile4``: one int32 sum a block and output,
        # the activations rounded per 32 inputs; False: dot4q's products only)
        self.tiles = bool(tiles and lib is not None and lib.dw_rd_tiles())
        if lib is None or not native_supported(net):
            raise ValueError("the compiled ReDrafter step is not available for this network")
        self._fn = lib.dw_rd_step
        # 1: avx512_vnni's vpdpbusd, which reads the codes + 128 as well; 2: AVX2's
        # vpmaddubsw (the codes alone)
        self._int8 = int(lib.dw_rd_vnni())
        self._fn.argtypes = [
            ctypes.POINTER(_Net), ctypes.POINTER(_Proposal), P, P, I64, P, P, P, ctypes.c_int,
        ]
        cfg, c = net.cfg, net.cfg.hidden
        self._keep: list[Any] = []  # every buffer the C structs point into
        with torch.no_grad():
            h_part, rest = slice(0, c), slice(c, None)
            layers = {
                "w": (net.w.weight, net.w.bias),
                "u": (net.u.weight, None),
                "res_s": (net.res[0].weight[:, rest], None),
                "proj": (net.proj.weight, net.proj.bias),
                "head": (net.rows, net.bias),
            }
            if cfg.context_dim:
                layers["q_se"] = (net.wq.weight[:, rest], None)
                layers["wo"] = (net.wo.weight, net.wo.bias)
            self.vocab_size = cfg.vocab_size
            embed = self.embed.to(torch.bfloat16).contiguous()  # (V, C)
            self._keep.append(embed)
            st = _Net(
                c=c, d=cfg.context_dim, heads=cfg.context_heads, kdraft=cfg.draft_vocab,
                vocab=cfg.vocab_size, nres=len(net.res) - 1, embed=embed.data_ptr(),
            )
            for name, (w, b) in layers.items():
                setattr(st, name, self._layer(w, b, levels_of(name), name in GROUPED))
            res = (_I8 * max(1, len(net.res) - 1))()
            for i, r in enumerate(net.res[1:]):
                res[i] = self._layer(r.weight, r.bias, grouped="res" in GROUPED)
            self._keep.append(res)
            st.res = ctypes.addressof(res)
            if cfg.context_dim:
                g_so = net.gate.weight.detach()[0, rest].float().contiguous()  # (C + D,)
                self._keep.append(g_so)
                st.g_so = g_so.data_ptr()
            lin = {"res_h": (net.res[0].weight[:, h_part], net.res[0].bias)}
            self._g_h, self._g_b = np.zeros(c, np.float32), 0.0  # the gate's h part
            if cfg.context_dim:
                lin["q_h"] = (net.wq.weight[:, h_part], net.wq.bias)
                lin["wk"] = (net.wk.weight, net.wk.bias)
                lin["wv"] = (net.wv.weight, net.wv.bias)
                self._g_h = net.gate.weight.detach()[0, h_part].float().numpy().copy()  # (C,)
                self._g_b = float(net.gate.bias.detach().float()[0])
            self._lin = {
                name: self._layer(w, b, grouped=name in GROUPED) for name, (w, b) in lin.items()
            }
            self._embed_bits = embed.view(torch.int16).numpy().view(np.uint16)  # (V, C)
            model = backend.model
            self._norm = model.norm.detach().float().numpy().copy()  # (C,) the final norm
            self._eps = float(model.cfg.norm_eps)
            if self._norm.shape != (c,):
                raise ValueError(f"the target's final norm has shape {self._norm.shape}, not ({c},)")
        self._start_fn = lib.dw_rd_start
        self._start_fn.argtypes = [
            ctypes.POINTER(_I8), ctypes.POINTER(_I8), P, F32, P, ctypes.c_int, P, F32, I64, P,
            P, P, P, ctypes.c_int,
        ]
        self._start_fn.restype = ctypes.c_int
        self._entries_fn = lib.dw_rd_entries
        self._entries_fn.argtypes = [
            ctypes.POINTER(_I8), ctypes.POINTER(_I8), P, ctypes.c_int, I64, P, F32, P, P, I64,
            P, P, ctypes.c_int,
        ]
        self._entries_fn.restype = ctypes.c_int
        self._chain_fn = lib.dw_rd_chain
        self._chain_fn.argtypes = [
            ctypes.POINTER(_Net), ctypes.POINTER(_Proposal), I64, I64, P, P, P, P, P,
            ctypes.c_int,
        ]
        self._chain_fn.restype = ctypes.c_int
        self._made = ctypes.c_int64(0)
        self._made_ref = ctypes.byref(self._made)
        self._kv_np: tuple[np.ndarray, np.ndarray] | None = None  # (cap, D) keys, values
        self._kv_ptrs: tuple[int, int] = (0, 0)  # their data pointers
        self._net = st
        self._net_ref = ctypes.byref(st)
        self._ids_of: np.ndarray | None = None  # the vocab_ids self._ids was made from
        self._ids, self._ids_ptr = np.zeros(0, np.int64), 0
        self._s_np: np.ndarray | None = None  # (B, C) float32: the last step's states
        # one proposal's buffers, made once: start() fills them for each proposal
        d = cfg.context_dim
        self._c, self._d = c, d
        self._hbuf = np.empty(c, np.float32)  # (C,) the final-normed hidden state
        # (C,) the target's residual row copied in, where it is not a float32 or bfloat16
        # row in CPU memory (which C reads where it is)
        self._x_np = np.empty(c, np.float32)
        self._x_t, self._x_ptr = torch.from_numpy(self._x_np), self._x_np.ctypes.data
        hr, hq = np.empty(2 * c, np.float32), np.empty(max(d, 1), np.float32)  # (2C,), (D,)
        self._hg = ctypes.c_float(0.0)
        self._bufs = (hr, hq)
        self._no_extra = np.zeros(0, np.int64)
        self._extra_checked: np.ndarray | None = None  # the extra ids last bounds-checked
        self._extra_ptr: int | None = None
        self._prop = _Proposal(h=self._hbuf.ctypes.data, hr=hr.ctypes.data, xbias=self._xbias)
        self._prop_ref = ctypes.byref(self._prop)
        if d:
            self._prop.hq = hq.ctypes.data
        self._prop_keep: Any = None  # the context columns the struct points into
        # dw_rd_start's arguments around the residual row: fixed for the step's life
        lin = self._lin
        self._start_head = (
            ctypes.byref(lin["res_h"]), ctypes.byref(lin["q_h"]) if d else None,
            self._g_h.ctypes.data if d else None, self._g_b,
        )
        if d:  # dw_rd_entries' fixed arguments
            self._entries_head = (ctypes.byref(lin["wk"]), ctypes.byref(lin["wv"]))
            self._entries_mid = (self._norm.ctypes.data, self._eps, self._embed_bits.ctypes.data)
        self._start_tail = (
            self._norm.ctypes.data, self._eps, c, self._hbuf.ctypes.data, hr.ctypes.data,
            hq.ctypes.data, ctypes.byref(self._hg),
        )

    def _layer(
        self, weight: torch.Tensor, bias: torch.Tensor | None, levels: int = INT8_LEVELS,
        grouped: bool = False,
    ) -> _I8:
        n, k = weight.shape
        if grouped and self.groups and k % (2 * GROUP) == 0 and self._int8 in (1, 2):
            # 4-bit codes with a bfloat16 scale per 32 inputs (``step.quantize_groups``),
            # always read packed; the per-row scales are ones
            codes, gs = quantize_groups(weight)  # (n, k) int8, (n, k / 32) bfloat16
            scale = torch.ones(n, dtype=torch.float32)
            b = torch.empty(0) if bias is None else bias.detach().float().contiguous()
            w4, gbits = pack4(codes), gs.view(torch.int16)
            tw, tg = self._tiles(codes, gbits)
            self._keep.extend((codes, scale, b, w4, gbits, tw, tg))
            return _I8(
                w=codes.data_ptr(), scale=scale.data_ptr(),
                bias=b.data_ptr() if b.numel() else None, wu=None, w4=w4.data_ptr(),
                n=n, k=k, gs=gbits.data_ptr(), tw=_ptr(tw), tg=_ptr(tg),
            )
        codes, scale, b = _quantize(weight, bias, levels)
        # (n, k / 2) a 4-bit layer's codes two a byte, where the int8 products run (the
        # same values as ``codes``: the int32 sums, so the bits, do not change)
        w4 = pack4(codes) if levels <= 7 and k % 64 == 0 and self._int8 in (1, 2) and self.pack4 else None
        # (n, k) the codes + 128 (vpdpbusd's unsigned side), where that path runs unpacked
        wu = None
        if k % 64 == 0 and self._int8 == 1 and w4 is None:
            wu = (codes.to(torch.int16) + 128).to(torch.uint8).contiguous()
        tw = self._tiles(codes, None)[0] if levels <= 7 else None
        self._keep.extend((codes, scale, b, wu, w4, tw))
        return _I8(
            w=codes.data_ptr(), scale=scale.data_ptr(),
            bias=b.data_ptr() if b.numel() else None,
            wu=None if wu is None else wu.data_ptr(),
            w4=None if w4 is None else w4.data_ptr(), n=n, k=k, tw=_ptr(tw),
        )

    def _tiles(
        self, codes: torch.Tensor, gbits: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """A 4-bit layer's tiles (``tile4``) and its group scales in their order, where
        this step takes the tiled products and the layer's sizes fit them; else Nones."""
        n, k = codes.shape
        if not self.tiles or n % 16 or k % 32:
            return None, None
        return tile4(codes), None if gbits is None else tile_scales(gbits)

    def start(self, cache_len: int, context: np.ndarray) -> bool:
        """As ``TorchRecurrentStep.start`` (the same quantities, in float32 through the
        compiled layers): the hidden state's parts, the context's new entries, the extra
        ids; False when the backend holds no hidden state for ``cache_len``. A per-step
        path: the proposal's buffers, pointers and struct are made once and reused (the
        previous proposal being over), and C reads the target's float32 or bfloat16
        residual rows where they are (AMD EPYC Zen 3, live Spec-Bench decode, median:
        0.74 -> 0.45 ms a start with the numpy trims of the drafting path)."""
        if self.backend.hidden_len != cache_len or cache_len < 1:
            return False
        ctx = np.asarray(context, np.int64)
        x = self.backend.last_residual()  # (C,) before the final norm
        if tuple(x.shape) != (self._c,):
            raise ValueError(f"the target's residual row has shape {tuple(x.shape)}, not ({self._c},)")
        # (``is_cpu``: ``device.type`` builds a string through a C++ stream, ~5 us cold)
        flag = _ROW_DTYPES.get(x.dtype) if x.is_cpu and x.is_contiguous() else None
        if flag is None:  # another dtype or device: a float32 copy (one torch op)
            with torch.inference_mode():
                self._x_t.copy_(x)
            ptr, flag = self._x_ptr, 0
        else:  # read where it is: no torch op (~0.06 ms cold, a tenth of start)
            ptr = x.data_ptr()
        self._start_fn(*self._start_head, ptr, flag, *self._start_tail, kernel_threads())
        self._h = self._hr = self._hbuf  # type: ignore[assignment]  # marks a started proposal
        pr = self._prop
        pr.keys = pr.vals = pr.cols = None
        pr.m = 0
        # the vocabulary, the entries' positions and columns (ids checked in range)
        got = self._ctx.update(ctx, self._residual_rows)
        self.vocab_ids = self._ctx.vocab_ids  # (K + E,)
        if self._d:
            pr.hg = self._hg.value
            self._add_entries_np(ctx, got)
            if self._m and self._kv_np is not None:
                cols = self._ctx.cols  # (m,) a view of the book's buffer
                self._check_cols(cols, self._ctx.fresh)
                self._prop_keep = cols
                self._cols = cols  # as the torch step keeps them (numpy here)
                pr.keys, pr.vals = self._kv_ptrs
                pr.cols, pr.m = cols.ctypes.data, self._m
        extra = self._vocab.extra if self.extend else self._no_extra
        if extra is not self._extra_checked:  # the ids ContextVocab checked in range
            self._extra_checked = extra
            self._extra_ptr = extra.ctypes.data if extra.size else None
        pr.extra, pr.e = self._extra_ptr, self._extra_checked.size
        self._s_np = None
        return True

    def index(self, context: np.ndarray) -> None:
        """What ``start`` adds for ``context`` (the cached tokens and the root) ahead of
        it: the extra ids and the new context entries (``ReDrafter.begin`` calls it)."""
        ctx = np.asarray(context, np.int64)
        got = self._ctx.update(ctx, self._residual_rows)
        self.vocab_ids = self._ctx.vocab_ids  # (K + E,)
        if self._d:
            self._add_entries_np(ctx, got)
            self._check_cols(self._ctx.cols, self._ctx.fresh)

    def _check_cols(self, cols: np.ndarray, fresh: int) -> None:
        """The columns C indexes the step's output by: each in -1 .. K + E - 1, one per
        entry. ``fresh`` (``ContextBook.fresh``): the columns before it were checked by
        an earlier ``start`` or ``index`` (every update of the book is followed by one),
        against no more columns than now (the book's width only grows on its fast path);
        plain Python on the few new ones: numpy's calls cost tens of microseconds right
        after the target's forward."""
        width = self.vocab_ids.size
        new = cols[fresh:]
        if cols.size != self._m or (
            new.size > 8 and (int(new.min()) < -1 or int(new.max()) >= width)
        ) or (new.size <= 8 and any(not -1 <= c < width for c in new.tolist())):
            raise ValueError(f"context columns outside -1..{width - 1} or not {self._m}")

    def _residual_rows(self, start: int) -> tuple[int, object | None] | None:
        """``hidden_rows`` for ``ContextEntries.update``, without the final norm (the
        compiled entries apply it): (first, the backend's (t, C) pieces, or None)."""
        got = self.backend.residual_rows(start)
        if got is None:
            return None
        first, pieces = got
        return first, (pieces or None)

    def _row_pointers(self, pieces: list[torch.Tensor], off: int, cnt: int) -> tuple[np.ndarray, int, object]:
        """(cnt + 1,) addresses of rows ``off .. off + cnt`` of the pieces ((t, C) each,
        in order), the rows' dtype flag (0 float32, 1 bfloat16) and what keeps their
        memory alive: the pieces themselves where each is a CPU tensor of one of those
        dtypes with contiguous rows, else one float32 copy of them all. Plain Python on
        a few ints: a numpy call costs ~5 us right after a verify (a step's usual one or
        two pieces of one to three rows)."""
        c, flag, ptrs = self._c, None, []
        for p in pieces:
            f = _ROW_DTYPES.get(p.dtype)
            if (f is None or flag not in (None, f) or not p.is_cpu or p.dim() != 2
                    or p.shape[1] != c or p.stride(1) != 1):
                break
            flag, base, step = f, p.data_ptr(), p.stride(0) * (2 if f else 4)
            ptrs.extend(range(base, base + p.shape[0] * step, step))
        else:
            if off < 0 or off + cnt >= len(ptrs):
                raise ValueError(f"rows {off}..{off + cnt} of {len(ptrs)} residual rows")
            return np.array(ptrs[off : off + cnt + 1], np.int64), int(flag or 0), pieces
        with torch.inference_mode():  # another dtype or layout: one float32 copy
            arrs = [p.float().numpy() for p in pieces]  # (t, C) each
        rows = np.ascontiguousarray(np.concatenate(arrs) if len(arrs) > 1 else arrs[0], np.float32)
        if rows.shape[1] != c or off < 0 or off + cnt >= rows.shape[0]:
            raise ValueError(f"rows {off}..{off + cnt} of {rows.shape} residual rows")
        return rows.ctypes.data + np.arange(off, off + cnt + 1, dtype=np.int64) * 4 * c, 0, rows

    def _add_entries_np(
        self, context: np.ndarray, got: tuple[int, int, int, int, object | None]
    ) -> None:
        """``TorchRecurrentStep._add_entries`` in one compiled call: the new entries'
        keys and values (float32) appended to the held ones (``got``:
        ``ContextBook.update``'s)."""
        self._m, first, a, b, rows = got
        if b <= a or rows is None:
            return
        cnt, off = b - a, a - 1 - first  # rows off..off + cnt of the pieces (positions first..)
        if off < 0:
            raise ValueError(f"entries {a}..{b - 1} need rows {a - 1}..{b - 1}, have {first}..")
        ptrs, flag, keep = self._row_pointers(rows, off, cnt)  # type: ignore[arg-type]
        # (cnt + 1,) ids ContextBook.update checked in 0..V - 1 (C reads their embedding rows)
        tok = np.ascontiguousarray(context[a : b + 1], np.int64)
        need = self._m + cnt
        if self._kv_np is None or self._kv_np[0].shape[0] < need:
            cap = max(64, 2 * need)
            d = self.net.cfg.context_dim
            grown = (np.empty((cap, d), np.float32), np.empty((cap, d), np.float32))
            if self._kv_np is not None:
                for new, old in zip(grown, self._kv_np, strict=True):
                    new[: self._m] = old[: self._m]
            self._kv_np = grown
            self._kv_ptrs = (grown[0].ctypes.data, grown[1].ctypes.data)
            self._kvc = (torch.from_numpy(grown[0]), torch.from_numpy(grown[1]))  # shared
        at = self._m * self._kv_np[0].strides[0]  # bytes to the first new entry's row
        if self._entries_fn(
            *self._entries_head, ptrs.ctypes.data, flag, cnt, *self._entries_mid, tok.ctypes.data,
            self._c, self._kv_ptrs[0] + at, self._kv_ptrs[1] + at, kernel_threads(),
        ):
            raise MemoryError("the compiled ReDrafter entries could not allocate their scratch")
        del keep  # the rows' memory was needed until here
        self._m = need

    def chain(
        self, root: int, t: int, min_path: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """A one-beam draft in one call (what ``beam_search`` at width 1 computes from
        ``step``): (n,) target ids, each the most probable after the ones before, and
        (n,) their log-probabilities; n = t, or fewer with ``min_path`` ((t,) path
        log-probabilities, non-decreasing): the chain ends after a token whose path
        log-probability is below the next one's. Needs ``start`` first."""
        assert self._h is not None
        if not 0 <= root < self.vocab_size or t < 1:
            raise ValueError(f"a chain needs a root in 0..{self.vocab_size - 1} and t >= 1, got {root}, {t}")
        floor = None
        if min_path is not None:  # (NaN never ends a chain early: C compares path < floor)
            floor = np.ascontiguousarray(min_path, np.float32)  # (t,)
            if floor.shape != (t,):
                raise ValueError(f"min_path needs {t} numbers, got shape {floor.shape}")
        if self.vocab_ids is not self._ids_of:  # (K + E,): a new array when it grew
            self._ids_of = self.vocab_ids
            self._ids = np.ascontiguousarray(self.vocab_ids, np.int64)
            self._ids_ptr = self._ids.ctypes.data
        tokens, logp = np.empty(t, np.int64), np.empty(t, np.float32)
        if self._chain_fn(
            self._net_ref, self._prop_ref, root, t, self._ids_ptr,
            None if floor is None else floor.ctypes.data,
            tokens.ctypes.data, logp.ctypes.data, self._made_ref, kernel_threads(),
        ):
            raise MemoryError("the compiled ReDrafter chain could not allocate its scratch")
        self._s_np = None  # the states of a chain are not kept
        n = self._made.value
        return tokens[:n], logp[:n].astype(np.float64)

    def step(self, tokens: np.ndarray, parents: np.ndarray) -> np.ndarray:
        """(B,) target ids and (B,) parent rows (-1: the initial state) -> (B, K + E)
        float32 log-probs."""
        assert self._h is not None
        ids = np.ascontiguousarray(tokens, np.int64)  # (B,)
        par = np.ascontiguousarray(parents, np.int64)  # (B,)
        b = ids.size
        if b < 1 or par.size != b:
            raise ValueError(f"a step needs B >= 1 tokens and as many parents, got {b}, {par.size}")
        if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            raise ValueError(f"token ids outside the vocabulary 0..{self.vocab_size - 1}")
        prev = None if self._s_np is None or par[0] < 0 else self._s_np
        if prev is not None and (int(par.min()) < 0 or int(par.max()) >= prev.shape[0]):
            raise ValueError(f"parent rows outside 0..{prev.shape[0] - 1}")
        c = self.net.cfg.hidden
        s_new = np.empty((b, c), np.float32)  # (B, C)
        out = np.empty((b, self.vocab_ids.size), np.float32)  # (B, K + E)
        failed = self._fn(
            ctypes.byref(self._net), ctypes.byref(self._prop), ids.ctypes.data,
            par.ctypes.data, b, None if prev is None else prev.ctypes.data,
            s_new.ctypes.data, out.ctypes.data, kernel_threads(),
        )
        if failed:
            raise MemoryError("the compiled ReDrafter step could not allocate its scratch")
        self._s_np = s_new
        if self.net.cfg.context_dim:
            np.log(out, out=out)  # C gave the mixture's probabilities
        return out
