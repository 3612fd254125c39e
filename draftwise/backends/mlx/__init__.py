"""The MLX backend: a llama-family forward on mlx-lm weights (Apple silicon, or the CPU).

Example::

    from draftwise.backends.mlx import MLXBackend
    backend = MLXBackend.from_pretrained(model_dir, dtype="4bit")
"""

from draftwise.backends.mlx.backend import MLXBackend

__all__ = ["MLXBackend"]
