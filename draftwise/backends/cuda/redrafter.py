"""The ReDrafter network in torch: a recurrent cell on the target's frozen embeddings and a
head over a reduced draft vocabulary (seed 001, with a cheap head for a small target).

- cell: ``s_t = SiLU(W e_t + U s_{t-1} + b)``, ``e_t`` the target's own embedding of the
  token, ``s_{-1} = 0``, state size = the target's hidden size ``C``;
- head: ``x = [h, s_t]`` (``h`` the target's last-layer hidden state of the last cached
  token, held for the whole draft) through ``ResBlock``s ``x + SiLU(Linear(x))``, then a
  trained projection to ``C`` and the dot product with the target's embedding rows of the
  ``K`` draft-vocabulary ids (frozen, not stored) plus a trained bias per id. A token
  outside the draft vocabulary is never drafted. For SmolLM2-135M (C = 576, K = 4096)
  that is 2.3 M trained parameters instead of the reference head's 57 M.

``TorchRecurrentStep`` runs it for the core's beam search (``core.beam``) on the
target's device, reading the target's hidden state from the backend with no forward.

Example::

    net = ReDrafterNet(cfg, embed, vocab_ids)          # embed (V, C), vocab_ids (K,)
    s = net.cell(torch.tensor([root]), net.zero_state(1))   # (1, C)
    logp = net.head(h[None], s).log_softmax(-1)        # (1, K) over the draft vocabulary
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from draftwise.core.drafters.redrafter_ckpt import ReDrafterConfig
from draftwise.errors import DraftwiseError


class ReDrafterNet(nn.Module):
    """Cell + head; see the module docstring. ``embed`` (V, C) is the target's, frozen."""

    def __init__(self, cfg: ReDrafterConfig, embed: torch.Tensor, vocab_ids: torch.Tensor) -> None:
        super().__init__()
        c, k = cfg.hidden, cfg.draft_vocab
        if embed.shape != (cfg.vocab_size, c):
            raise DraftwiseError(
                f"drafter expects target embeddings ({cfg.vocab_size}, {c}), "
                f"got {tuple(embed.shape)}"
            )
        if vocab_ids.shape != (k,):
            raise DraftwiseError(f"drafter expects {k} draft-vocabulary ids, got {vocab_ids.shape}")
        self.cfg = cfg
        self.w = nn.Linear(c, c)  # W e_t + b
        self.u = nn.Linear(c, c, bias=False)  # U s_{t-1}
        self.res = nn.ModuleList([nn.Linear(2 * c, 2 * c) for _ in range(cfg.resblocks)])
        self.proj = nn.Linear(2 * c, c)
        self.bias = nn.Parameter(torch.zeros(k))  # (K,)
        with torch.no_grad():  # start near the identity of a residual net
            for r in self.res:
                r.weight.mul_(0.1)
        self.register_buffer("vocab_ids", vocab_ids.long(), persistent=True)  # (K,)
        self.register_buffer("embed", embed.detach(), persistent=False)  # (V, C)
        self.register_buffer("rows", embed.detach()[vocab_ids.long()], persistent=False)  # (K, C)

    def zero_state(self, n: int) -> torch.Tensor:
        return torch.zeros(n, self.cfg.hidden, dtype=self.embed.dtype, device=self.embed.device)

    def cell(self, tokens: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """(B,) target ids, (B, C) states -> (B, C) next states."""
        e = self.embed[tokens]  # (B, C)
        return F.silu(self.w(e) + self.u(state))  # (B, C)

    def head(self, h: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """(B, C) target hidden states, (B, C) RNN states -> (B, K) draft logits."""
        x = torch.cat([h, state], dim=-1)  # (B, 2C)
        for r in self.res:
            x = x + F.silu(r(x))  # (B, 2C)
        z = self.proj(x)  # (B, C)
        return F.linear(z, self.rows, self.bias)  # (B, K)

    def unroll(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced training forward: ``h`` (B, C), ``tokens`` (B, T) the drafted
        inputs (root first) -> (B, T, K) logits; position t predicts the token after
        ``tokens[:, t]``."""
        s = self.zero_state(h.shape[0])  # (B, C)
        out = []
        for t in range(tokens.shape[1]):
            s = self.cell(tokens[:, t], s)  # (B, C)
            out.append(self.head(h, s))  # (B, K)
        return torch.stack(out, dim=1)  # (B, T, K)


class TorchRecurrentStep:
    """The tensor step of ``core.drafters.redrafter.RecurrentNet`` on a torch backend: the
    RNN states stay on the target's device; each step is one small forward and one copy
    of (B, K) log-probs to the host."""

    def __init__(self, net: ReDrafterNet, backend: Any) -> None:
        self.net = net.eval()
        self.backend = backend
        self.vocab_ids = net.vocab_ids.cpu().numpy().astype(np.int64)  # (K,)
        self._h: torch.Tensor | None = None  # (1, C)
        self._s: torch.Tensor | None = None  # (B, C)

    def start(self, cache_len: int) -> bool:
        """Read the target's hidden state of the last cached token, if it is for
        ``cache_len`` (else the drafter skips this step)."""
        if self.backend.hidden_len != cache_len or cache_len < 1:
            return False
        with torch.inference_mode():
            self._h = self.backend.last_hidden().to(self.net.embed.dtype)[None]  # (1, C)
        self._s = None
        return True

    def step(self, tokens: np.ndarray, parents: np.ndarray) -> np.ndarray:
        """(B,) target ids and (B,) parent rows (-1: the initial state) -> (B, K) log-probs."""
        assert self._h is not None
        net = self.net
        with torch.inference_mode():
            ids = torch.from_numpy(np.ascontiguousarray(tokens, np.int64)).to(net.embed.device)
            if self._s is None or parents[0] < 0:
                prev = net.zero_state(ids.shape[0])  # (B, C)
            else:
                prev = self._s[torch.from_numpy(np.asarray(parents, np.int64)).to(ids.device)]
            self._s = net.cell(ids, prev)  # (B, C)
            logits = net.head(self._h.expand(ids.shape[0], -1), self._s)  # (B, K)
            return logits.float().log_softmax(-1).cpu().numpy()  # (B, K)
