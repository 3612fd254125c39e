"""The torch backend: a lean llama-family forward on CUDA (or CPU when there is no GPU).

Example::

    from draftwise.backends.cuda import TorchBackend
    backend = TorchBackend.from_pretrained(model_dir, dtype="bfloat16", device="auto")
"""

from draftwise.backends.cuda.backend import TorchBackend

__all__ = ["TorchBackend"]
