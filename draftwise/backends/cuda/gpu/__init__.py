"""CUDA-only pieces of the torch backend (tested on CPU tensors where CI has no GPU).

``sampling.py``: sampling on the device and the pinned host staging buffer (one host
round trip per step); ``streams.py``: the CUDA stream a concurrent drafter (CARD's
worker) runs on beside the model.
"""
