"""The torch backend: a lean llama-family forward on CUDA (or CPU when there is no GPU).

Rooms:

- here: ``backend.py`` (``TorchBackend``, the ``core.backend.Backend`` protocol),
  ``llama.py`` (the decoder forward and its KV cache), ``batch.py`` (batched generation),
  ``draft.py`` (early-exit and loaded draft models), ``invariant.py`` (row-invariant
  attention plans), ``modes.py`` (the lossless modes and the default dtype),
  ``profile_forward.py`` (the verify-cost profiler);
- ``cpu/``: the compiled CPU kernels and their build (``csrc/``);
- ``gpu/``: CUDA-only pieces (device sampling, streams);
- ``redrafter/``: the ReDrafter network, its checkpoint and its drafting step.

Example::

    from draftwise.backends.cuda import TorchBackend
    backend = TorchBackend.from_pretrained(model_dir, dtype="bfloat16", device="auto")
"""

from draftwise.backends.cuda.backend import TorchBackend

__all__ = ["TorchBackend"]
