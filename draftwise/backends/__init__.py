"""Model backends implementing ``draftwise.core.backend.Backend``.

- ``draftwise.backends.cuda``: plain torch (CUDA, or CPU as a fallback).
- ``draftwise.backends.mlx``: Apple silicon.

Backends are imported lazily by name so that importing ``draftwise`` never pulls in torch.
"""
