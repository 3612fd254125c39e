"""ReDrafter on the torch backend: the network (``net.py``), its checkpoint I/O
(``checkpoint.py``) and the drafting step beam search calls (``step.py``). Training it is
``draftwise/training``; the beam search itself is ``core/drafters/redrafter.py``.
"""
