"""Sampling on the device, and the one host->device copy per step that feeds it.

At temperature > 0 (or with a repetition penalty) ``core.sampling.next_token`` turns a
row's logits into the emitted token at one uniform ``u``. Copying every row's logits to
the host for that costs ``(N+1) x V`` floats per step; here every row is sampled where its
logits are, and only the ``N+1`` tokens come back. Acceptance then descends the tree as
in greedy decoding, with the sampled tokens in place of the argmax (``core.acceptance``).

Row ``r`` of a verify is the token at depth ``d_r`` below the root, so it is the
``emitted + d_r``-th token of the generation and takes that uniform (keyed by absolute
position, as the host path does): the same seed gives the same text as plain decoding.
``sample_rows`` is ``core.sampling.probabilities`` + ``sample`` written for (R, V)
float64 tensors, op for op; on CPU tensors it gives the host path's tokens (the test
checks), on a GPU the sums run in another order, so a ``u`` within about 1e-15 of a CDF
step could pick the neighbouring token.

Example::

    >>> import torch
    >>> from draftwise.core.sampling import SamplingParams
    >>> logits = torch.tensor([[0.1, 2.0, 0.5], [3.0, 0.0, 0.0]])
    >>> recent = torch.zeros((2, 0), dtype=torch.int64)
    >>> u = torch.tensor([0.3, 0.99], dtype=torch.float64)
    >>> sample_rows(logits, recent, u, SamplingParams(temperature=1.0, top_k=1)).tolist()
    [1, 0]
"""

from __future__ import annotations

import numpy as np
import torch

from draftwise.core.sampling import SamplingParams


class HostStaging:
    """A reusable host buffer (page-locked on CUDA) for the step's one upload.

    ``upload(host)`` copies an int64 (R, C) array into the buffer and sends it to the
    device in one transfer; on CPU the array is wrapped without a copy.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buf: torch.Tensor | None = None  # flat pinned int64 buffer (CUDA only)

    def upload(self, host: np.ndarray) -> torch.Tensor:
        if self.device.type != "cuda":
            return torch.from_numpy(host)  # (R, C) shares the host array: no copy
        n = host.size
        if self._buf is None or self._buf.numel() < n:
            self._buf = torch.empty(max(n, 4096), dtype=torch.int64, pin_memory=True)
        staged = self._buf[:n].view(host.shape)  # (R, C)
        staged.numpy()[...] = host  # a host memcpy into page-locked memory
        # non_blocking from pinned memory: the copy is queued; the buffer is reused only
        # after the step's single device->host copy has synchronised the stream
        return staged.to(self.device, non_blocking=True)


def sample_rows(
    logits: torch.Tensor, recent: torch.Tensor, u: torch.Tensor, params: SamplingParams
) -> torch.Tensor:
    """(R,) int64 token of every row: ``next_token(logits[r], recent[r], params, u[r])``
    for (R, V) ``logits``, (R, W) ``recent`` and (R,) float64 ``u``, on their device."""
    x = logits.float()  # (R, V) as the host path: float32 before the penalty
    if params.repetition_penalty != 1.0 and recent.shape[1]:
        vals = x.gather(1, recent)  # (R, W); a token repeated in the window: same value
        pen = params.repetition_penalty
        x = x.scatter(1, recent, torch.where(vals > 0, vals / pen, vals * pen))
    if params.greedy:
        return x.argmax(dim=1)
    x = x.double() / params.temperature  # (R, V)
    if params.top_k and params.top_k < x.shape[1]:
        kth = x.topk(params.top_k, dim=1).values[:, -1:]  # (R, 1)
        x = x.masked_fill(x < kth, float("-inf"))
    x = x - x.max(dim=1, keepdim=True).values
    p = x.exp()
    p = p / p.sum(dim=1, keepdim=True)
    if params.min_p > 0.0:
        p = torch.where(p < params.min_p * p.max(dim=1, keepdim=True).values, 0.0, p)
    if params.top_p < 1.0:
        order = torch.argsort(-p, dim=1, stable=True)  # (R, V) most likely first
        cum = p.gather(1, order).cumsum(dim=1)
        target = (params.top_p * cum[:, -1:] - 1e-12).contiguous()  # (R, 1)
        cut = torch.searchsorted(cum, target) + 1  # (R, 1) kept per row, >= 1
        ranks = torch.arange(p.shape[1], device=p.device)
        kept = torch.zeros_like(p, dtype=torch.bool).scatter(1, order, ranks < cut)
        p = torch.where(kept, p, 0.0)
    p = p / p.sum(dim=1, keepdim=True)
    cdf = p.cumsum(dim=1)  # (R, V)
    idx = torch.searchsorted(cdf, (u[:, None] * cdf[:, -1:]).contiguous(), right=True)
    return idx[:, 0].clamp(max=p.shape[1] - 1)
