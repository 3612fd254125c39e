"""The compiled CPU kernels of the torch backend and their build.

``native.py`` compiles ``csrc/*.c`` once into the user cache and loads it with ctypes;
``int4.py`` (the 4bit weights and matmul), ``f32.py`` (the float32 matmul), ``fused.py``
(the whole 4bit decoder forward in one C call) and ``fused_eager.py`` (its op-by-op torch
replay, the reference) wrap them. Every kernel is row-invariant: a row's bits never
depend on the other rows of the call.
"""
