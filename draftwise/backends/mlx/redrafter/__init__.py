"""ReDrafter on MLX: the network (``net.py``) and its drafting step (``step.py``)."""
