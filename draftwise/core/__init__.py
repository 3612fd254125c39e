"""Hardware-agnostic speculative decoding: numpy and the standard library only."""

from draftwise.core.backend import Backend, Verified
from draftwise.core.decode import Decoder, Step
from draftwise.core.sampling import SamplingParams
from draftwise.core.tree import DraftTree, TreeBuilder

__all__ = ["Backend", "Decoder", "DraftTree", "SamplingParams", "Step", "TreeBuilder", "Verified"]
