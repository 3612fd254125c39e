"""The ReDrafter drafting step on a torch backend (``core.drafters.redrafter.RecurrentNet``).

The network's math is ``ReDrafterNet``'s (``redrafter.py``), rearranged for drafting:

- what depends only on ``h`` (the target's hidden state, held for the whole draft) is
  computed once per proposal: ``h``'s halves of the query, the first ResBlock and the
  gate, so each beam step reads only the weights that act on the RNN state;
- ``int8=True`` (the CPU default wherever torch has the int8 matmul): every large layer's
  weights are stored as int8 with one scale per output row and run by
  ``torch._weight_int8pack_mm`` on bfloat16 activations. A beam step is a handful of
  matrix-vector products whose cost is reading the weights: measured here (2 threads,
  one row) the head's 4096 x 576 took 91 us in bfloat16 and 34 us in int8, the ResBlock's
  1152 x 1152 59 us and 19 us. The relative error of a layer is about 0.8%; drafts may
  differ at near-ties, the output never does (the target verifies every token). The
  head and the cell's two layers (``FOUR_BIT``) keep 4-bit values (-7..7 times the row's
  scale): the compiled step reads them packed two a byte, half the bytes of the largest
  layers (live greedy decoding of 8 Spec-Bench prompts, ``redrafter:bw=1,t=3``: 1.463
  tokens a step against 1.444 with all int8; the projection and ResBlock in 4 bits too:
  1.422, so they stay int8 here; the compiled step holds them, and the other int8
  layers, in 4-bit values with a scale per 32 inputs: ``GROUPED``);
- ``extend=True``: the draft vocabulary of each proposal also holds the context's ids
  outside the fixed one (``core.drafters.context_vocab``), scored with the target's
  embedding rows and one bias, and copied to like the fixed ids.

Example::

    step = TorchRecurrentStep(net, backend, int8=True)
    step.start(cache_len, context)          # reads the target's hidden state, no forward
    logp = step.step(np.array([root]), np.array([-1]))   # (1, K) over the draft vocab
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from draftwise.backends.cuda.redrafter.net import COPY_EPS, ReDrafterNet
from draftwise.core.drafters.context_book import ContextBook
from draftwise.core.drafters.context_vocab import extra_bias

INT8_MIN_ROWS = 64  # layers with fewer output rows stay dense (the gate's one row)
INT8_LEVELS = 127  # an int8 layer's codes: -127..127 times its row's scale
INT4_LEVELS = 7  # a 4-bit one's: -7..7 (``FOUR_BIT``)
FOUR_BIT = ("w", "u", "head")  # the layers kept in 4-bit values (see the module docstring)
GROUP = 32  # inputs that share a scale in a ``GROUPED`` layer
# The compiled step's other layers (``groups=True``): 4-bit values with one bfloat16 scale
# per GROUP inputs of a row (``quantize_groups``), half the bytes of their int8 codes.
# Measured with the torch step (28 held-out corpus prompts x 128 tokens, greedy, tokens
# a step at t = 1 / 3): 1.530 / 1.974 against 1.532 / 1.986 as int8 rows, where 4-bit
# values with one scale a row lost 2-4% (1.505 / 1.915).
GROUPED = ("res_s", "res", "proj", "q_se", "wo", "res_h", "q_h", "wk", "wv")


def levels_of(layer: str) -> int:
    """The code range of the drafting layer named ``layer`` (``FOUR_BIT`` or int8)."""
    return INT4_LEVELS if layer in FOUR_BIT else INT8_LEVELS


def quantize_rows(weight: torch.Tensor, levels: int = INT8_LEVELS) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) weight -> int8 codes (N, K) in ``-levels .. levels`` and float32 scales (N,):
    ``weight ~= codes * scale[:, None]``, the rounding every CPU drafting path shares.

    Example::

        >>> codes, scale = quantize_rows(torch.tensor([[0.6, -1.0, 0.2]]), levels=7)
        >>> codes.tolist(), round(float(scale[0]) * 7, 6)
        ([[4, -7, 1]], 1.0)
    """
    w = weight.detach().float()
    scale = w.abs().amax(1).clamp(min=1e-12) / levels  # (N,)
    codes = (w / scale[:, None]).round().clamp(-levels, levels).to(torch.int8).contiguous()
    return codes, scale.contiguous()


def quantize_groups(
    weight: torch.Tensor, levels: int = INT4_LEVELS, group: int = GROUP
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) weight -> int8 codes (N, K) in ``-levels .. levels`` and bfloat16 scales
    (N, K / group), one per ``group`` inputs of a row: ``weight ~= codes * scale`` with
    each scale repeated over its group (the codes are rounded against the bfloat16
    scale, so that product is what every path computes).

    Example::

        >>> w = torch.cat([torch.full((1, 32), 0.7), torch.full((1, 32), -0.07)], 1)
        >>> codes, scale = quantize_groups(w)
        >>> codes[0, [0, 32]].tolist(), scale.shape, scale.dtype
        ([7, -7], torch.Size([1, 2]), torch.bfloat16)
    """
    w = weight.detach().float()
    n, k = w.shape
    if k % group:
        raise ValueError(
            f"a layer with a scale per {group} inputs needs K % {group} == 0, got K = {k}"
        )
    g = w.reshape(n, k // group, group)
    scale = (g.abs().amax(-1).clamp(min=1e-12) / levels).to(torch.bfloat16)  # (N, K / group)
    codes = (g / scale.float()[..., None]).round().clamp(-levels, levels).to(torch.int8)
    return codes.reshape(n, k).contiguous(), scale.contiguous()


def int8_supported() -> bool:
    """Whether this torch has the weight-only int8 matmul on CPU tensors."""
    try:
        x = torch.zeros(1, 32, dtype=torch.bfloat16)
        w = torch.zeros(64, 32, dtype=torch.int8)
        torch._weight_int8pack_mm(x, w, torch.ones(64, dtype=torch.bfloat16))
    except (AttributeError, RuntimeError):
        return False
    return True


class StepLinear:
    """``x @ W.T + b`` of one drafting layer: dense in ``dtype``, or weight-only int8
    (``int8``: one scale per output row, bfloat16 ``x``; codes in ``-levels .. levels``),
    or with ``grouped`` too the compiled step's rounding of a ``GROUPED`` layer (4-bit
    codes, a scale per ``GROUP`` inputs), as float32 weights: the reference its tests
    compare with.

    Example::

        lin = StepLinear(torch.eye(64), None, torch.bfloat16, int8=True)
        lin(torch.ones(2, 64, dtype=torch.bfloat16))     # (2, 64), ones
    """

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, int8: bool,
        levels: int = INT8_LEVELS, grouped: bool = False,
    ) -> None:
        w = weight.detach().float()  # (N, K)
        self.bias = None if bias is None else bias.detach().to(dtype).contiguous()  # (N,)
        self.scale: torch.Tensor | None = None
        self.f32 = False  # the grouped rounding, computed in float32
        if int8 and grouped and w.shape[0] >= INT8_MIN_ROWS and w.shape[1] % (2 * GROUP) == 0:
            codes, gs = quantize_groups(w)  # (N, K), (N, K / GROUP)
            n, k = w.shape
            w_g = codes.float().reshape(n, k // GROUP, GROUP) * gs.float()[..., None]
            self.w = w_g.reshape(n, k)  # (N, K) float32: codes x their group's scale
            self.f32 = True
        elif int8 and w.shape[0] >= INT8_MIN_ROWS:
            self.w, scale = quantize_rows(w, levels)  # (N, K), (N,)
            self.scale = scale.to(dtype)
        else:
            self.w = w.to(dtype).contiguous()  # (N, K)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(M, K) -> (M, N)."""
        if self.f32:
            b = None if self.bias is None else self.bias.float()
            return F.linear(x.float(), self.w, b).to(x.dtype)
        if self.scale is None:
            return F.linear(x, self.w, self.bias)
        y = torch._weight_int8pack_mm(x, self.w, self.scale)  # (M, N)
        return y if self.bias is None else y + self.bias


class _Layers:
    """The network's layers for drafting, split where one half reads ``h``."""

    def __init__(
        self, net: ReDrafterNet, dtype: torch.dtype, int8: bool, groups: bool = False
    ) -> None:
        c = net.cfg.hidden

        def lin(layer: nn.Linear, cols: slice = slice(None), bias: bool = True,
                name: str = "") -> StepLinear:
            b = layer.bias if bias and layer.bias is not None else None
            return StepLinear(layer.weight[:, cols], b, dtype, int8, levels_of(name),
                              grouped=groups and name in GROUPED)

        h_part, rest = slice(0, c), slice(c, None)
        self.w, self.u = lin(net.w, name="w"), lin(net.u, name="u")
        # the first block's h half, with its bias
        self.res_h = lin(net.res[0], h_part, name="res_h")
        self.res_s = lin(net.res[0], rest, bias=False, name="res_s")
        self.res = [lin(r, name="res") for r in net.res[1:]]
        self.proj = lin(net.proj, name="proj")
        self.head = StepLinear(net.rows, net.bias, dtype, int8, levels_of("head"))  # (K, C): the draft rows
        if net.cfg.context_dim:
            self.wk, self.wv = lin(net.wk, name="wk"), lin(net.wv, name="wv")
            self.wo = lin(net.wo, name="wo")
            self.q_h = lin(net.wq, h_part, name="q_h")
            self.q_se = lin(net.wq, rest, bias=False, name="q_se")
            self.g_h, self.g_so = lin(net.gate, h_part), lin(net.gate, rest, bias=False)


class TorchRecurrentStep:
    """The tensor step of ``core.drafters.redrafter.RecurrentNet`` on a torch backend: the
    RNN states stay on the target's device; each step is one small forward and one copy
    of (B, K) log-probs to the host. ``int8``, ``extend``: see the module docstring
    (int8: CPU only)."""

    def __init__(
        self, net: ReDrafterNet, backend: Any, int8: bool = False, extend: bool = False,
        torch_layers: bool = True, groups: bool = False,
    ) -> None:
        """``torch_layers``: build the torch layers the step runs (False: a subclass
        that computes the step itself, ``native.NativeRecurrentStep``). ``groups`` (with
        ``int8``): round the ``GROUPED`` layers as the compiled step does (float32
        products: its tests' reference, not a fast path)."""
        self.net = net.eval()
        self.backend = backend
        self.dtype = torch.bfloat16 if int8 else net.embed.dtype  # activations
        self.embed = net.embed.to(self.dtype)  # (V, C): no copy when the dtypes agree
        self._layers: _Layers | None = None
        if torch_layers:
            with torch.no_grad():
                self._layers = _Layers(net, self.dtype, int8, groups)
        base = net.vocab_ids.cpu().numpy().astype(np.int64)  # (K,)
        # the vocabulary, the entries and their columns, kept across proposals
        self._ctx = ContextBook(base, net.cfg.vocab_size, extend, bool(net.cfg.context_dim))
        self._vocab = self._ctx.vocab
        self.extend = extend
        self.vocab_ids = base  # (K + E,) after ``start`` with ``extend``
        self._xbias = extra_bias(net.bias.detach().float().cpu().numpy())
        self._xrows: torch.Tensor | None = None  # (E, C) the extra ids' embedding rows
        self._h: torch.Tensor | None = None  # (1, C)
        self._hq: torch.Tensor | None = None  # (1, D) h's part of the query
        self._hr: torch.Tensor | None = None  # (1, 2C) h's part of the first ResBlock
        self._hg: torch.Tensor | None = None  # (1, 1) h's part of the gate
        self._s: torch.Tensor | None = None  # (B, C)
        # a context network's entries (keys, values (cap, D)): the first ``_m`` rows are
        # the ones ``_book`` holds; ``_cols`` (m,) their next tokens' draft columns
        self._book = self._ctx.entries
        self._kvc: tuple[torch.Tensor, torch.Tensor] | None = None
        self._m = 0
        self._cols: torch.Tensor | None = None
        if net.cfg.context_dim:
            backend.keep_hidden_rows()

    @property
    def layers(self) -> _Layers:
        """The torch layers of the step (built unless ``torch_layers=False``)."""
        if self._layers is None:
            raise RuntimeError("this ReDrafter step was built without torch layers")
        return self._layers

    def start(self, cache_len: int, context: np.ndarray) -> bool:
        """Read the target's hidden state of the last cached token, if it is for
        ``cache_len`` (else the drafter skips this step); a context network also adds
        the entries of the positions cached since the last step."""
        if self.backend.hidden_len != cache_len or cache_len < 1:
            return False
        ly = self.layers
        ctx = np.asarray(context, np.int64)
        dev = self.embed.device
        with torch.inference_mode():
            h = self.backend.last_hidden().to(self.dtype)[None]  # (1, C)
            self._h, self._hr = h, ly.res_h(h)  # (1, C), (1, 2C)
            got = self._ctx.update(ctx, self.backend.hidden_rows)
            if self.extend:
                self.vocab_ids = self._ctx.vocab_ids  # (K + E,)
                extra = torch.from_numpy(self._vocab.extra.copy()).to(dev)  # (E,)
                self._xrows = self.embed[extra] if extra.numel() else None  # (E, C)
            if self.net.cfg.context_dim:
                self._hq, self._hg = ly.q_h(h), ly.g_h(h)  # (1, D), (1, 1)
                self._add_entries(ctx, got)
                self._cols = torch.from_numpy(self._ctx.cols.copy()).to(dev)  # (m,)
        self._s = None
        return True

    def index(self, context: np.ndarray) -> None:
        """What ``start`` adds for ``context`` (the cached tokens and the root) ahead of
        it: the extra ids and the new context entries (``ReDrafter.begin`` calls it)."""
        ctx = np.asarray(context, np.int64)
        with torch.inference_mode():
            got = self._ctx.update(ctx, self.backend.hidden_rows)
            self.vocab_ids = self._ctx.vocab_ids  # (K + E,)
            if self.net.cfg.context_dim:
                self._add_entries(ctx, got)

    def _add_entries(
        self, context: np.ndarray, got: tuple[int, int, int, int, object | None]
    ) -> None:
        """Entries of the new positions (``got``: ``ContextBook.update``'s), as
        ``ReDrafterNet.context_entries`` makes them."""
        ly = self.layers
        self._m, first, a, b, g = got
        if b <= a or g is None:
            return
        g = g.to(self.dtype)  # type: ignore[attr-defined]  # (n, C): positions first..
        dev = self.embed.device
        x = torch.from_numpy(context[a : b + 1]).to(dev)  # (b - a + 1,)
        e = self.embed[x]  # (b - a + 1, C)
        # (n', D) each, kept in float32: the attention's small matmuls are several times
        # faster in float32 than in bfloat16 on CPU
        k = ly.wk(torch.cat([g[a - 1 - first : b - 1 - first], e[:-1]], dim=-1)).float()
        v = ly.wv(torch.cat([e[1:], g[a - first : b - first]], dim=-1)).float()
        need = self._m + (b - a)
        if self._kvc is None or self._kvc[0].shape[0] < need:
            cap = max(64, 2 * need)
            d = self.net.cfg.context_dim
            grown = (
                torch.empty(cap, d, dtype=k.dtype, device=dev),
                torch.empty(cap, d, dtype=k.dtype, device=dev),
            )
            if self._kvc is not None:
                for new, old in zip(grown, self._kvc, strict=True):
                    new[: self._m] = old[: self._m]
            self._kvc = grown
        for buf, rows in zip(self._kvc, (k, v), strict=True):
            buf[self._m : need] = rows
        self._m = need

    def step(self, tokens: np.ndarray, parents: np.ndarray) -> np.ndarray:
        """(B,) target ids and (B,) parent rows (-1: the initial state) -> (B, K + E)
        log-probs (E = 0 without ``extend``)."""
        assert self._h is not None and self._hr is not None
        ly = self.layers
        with torch.inference_mode():
            ids = torch.from_numpy(np.ascontiguousarray(tokens, np.int64)).to(self.embed.device)
            e = self.embed[ids]  # (B, C)
            if self._s is None or parents[0] < 0:
                s = F.silu(ly.w(e))  # (B, C): U s_{-1} = 0
            else:
                rows = torch.from_numpy(np.asarray(parents, np.int64)).to(ids.device)
                s = F.silu(ly.w(e) + ly.u(self._s[rows]))  # (B, C)
            self._s = s
            if not self.net.cfg.context_dim:
                return self._head(s).float().log_softmax(-1).cpu().numpy()  # (B, K)
            w, o = self._attend(s, e)  # (H, B, L), (B, D)
            logp = self._head(s + ly.wo(o)).float().log_softmax(-1)  # (B, K)
            assert self._hg is not None
            g = torch.sigmoid(self._hg + ly.g_so(torch.cat([s, o], dim=-1))).float()  # (B, 1)
            return self._mix(logp, w[0], g).cpu().numpy()  # (B, K)

    def _head(self, s: torch.Tensor) -> torch.Tensor:
        """(B, C) state (with the context's read-out) -> (B, K + E) logits:
        ``ReDrafterNet.head`` with ``h``'s half of the first ResBlock precomputed, and the
        extra ids' columns."""
        ly = self.layers
        assert self._h is not None and self._hr is not None
        x = torch.cat([self._h.expand(s.shape[0], -1), s], dim=-1)  # (B, 2C)
        x = x + F.silu(self._hr + ly.res_s(s))  # (B, 2C)
        for r in ly.res:
            x = x + F.silu(r(x))  # (B, 2C)
        z = ly.proj(x)  # (B, C)
        if self._xrows is None:  # no extra ids (or no ``extend``)
            return ly.head(z)  # (B, K)
        extra = F.linear(z, self._xrows) + self._xbias  # (B, E)
        return torch.cat([ly.head(z), extra], dim=-1)  # (B, K + E)

    def _attend(self, s: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention of (B, C) states ``s`` and fed embeddings ``e`` over every entry (and
        the "nowhere" slot) -> weights (H, B, L), read-out (B, D)."""
        assert self._hq is not None
        b, m = s.shape[0], self._m
        nh, d = self.net.cfg.context_heads, self.net.cfg.context_dim
        dh = d // nh
        q = self._hq + self.layers.q_se(torch.cat([s, e], dim=-1))  # (B, D)
        if self._kvc is None or m == 0:
            return s.new_zeros(nh, b, 0), s.new_zeros(b, d)
        q = q.float().view(b, nh, dh)  # (B, H, dh)
        keys = self._kvc[0][:m].view(m, nh, dh).transpose(0, 1)  # (H, L, dh)
        vals = self._kvc[1][:m].view(m, nh, dh).transpose(0, 1)  # (H, L, dh)
        sc = (q.transpose(0, 1) @ keys.transpose(-1, -2)) * dh**-0.5  # (H, B, L)
        sc = torch.cat([sc, sc.new_zeros(nh, b, 1)], dim=-1)  # (H, B, L + 1)
        w = sc.softmax(-1)[..., :m]  # (H, B, L)
        o = (w @ vals).transpose(0, 1).reshape(b, d)  # (B, D)
        return w, o.to(s.dtype)  # (H, B, L), (B, D)

    def _mix(self, logp: torch.Tensor, w0: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """``ReDrafterNet.context_logp``'s mixture: (B, K) head log-probs, (B, L) head 0's
        weights, (B, 1) gate -> (B, K) normalized log-probs (K + E columns with
        ``extend``)."""
        b, m = w0.shape
        if m == 0:
            p = (1 - g) * logp.exp() + COPY_EPS  # (B, K)
        else:
            assert self._cols is not None
            cols = self._cols  # (L,)
            src = w0.float() * (cols >= 0)  # (B, L)
            copy = torch.zeros_like(logp).scatter_add_(1, cols.clamp(min=0).expand(b, m), src)
            p = (1 - g) * logp.exp() + g * copy + COPY_EPS  # (B, K)
        return torch.log(p / p.sum(-1, keepdim=True))  # (B, K)
