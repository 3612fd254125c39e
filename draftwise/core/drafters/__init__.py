"""Drafters: each proposes a draft tree from token ids and learns from what was accepted.

They are built by name, with typed and bounded options, through the drafting layer
(``draftwise.drafting``: ``make_drafter``, ``model.drafter``); this package holds only the
algorithms and imports nothing above it.

Example::

    >>> from draftwise.core.drafters import Cacheback
    >>> Cacheback(fl=2).name
    'cacheback'
"""

from __future__ import annotations

from draftwise.core.drafters.base import Drafter, NoDrafter
from draftwise.core.drafters.cacheback import Cacheback
from draftwise.core.drafters.compose import Capped, Combined
from draftwise.core.drafters.context_ngram import ContextNgram
from draftwise.core.drafters.ngrammys import Bigram, NGrammys
from draftwise.core.drafters.ssd import SSD

__all__ = [
    "SSD", "Bigram", "Cacheback", "Capped", "Combined", "ContextNgram", "Drafter", "NGrammys",
    "NoDrafter",
]
