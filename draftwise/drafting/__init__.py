"""The drafting layer: drafter specs, the registry of drafters and their options, the
drafting context, assets, and the one factory that builds any drafter.

Example::

    from draftwise.drafting import check_spec, make_drafter
    check_spec("cacheback:fl=2+ssd")          # validates names and options, builds nothing
    d = make_drafter("cacheback:budget=4")    # a model-free drafter
    d = model.drafter("ngrammys:k=5")         # one that needs the model: through Model
"""

from draftwise.drafting.assets import Assets
from draftwise.drafting.context import DraftingContext
from draftwise.drafting.factory import build_drafter, check_spec, make_drafter
from draftwise.drafting.options import Option
from draftwise.drafting.progress import tqdm_progress
from draftwise.drafting.registry import MAX_BUDGET, REGISTRY, DrafterEntry, drafter_names
from draftwise.drafting.spec import DrafterSpec, PartSpec, SpecError, parse_spec

__all__ = [
    "MAX_BUDGET", "REGISTRY", "Assets", "DrafterEntry", "DrafterSpec", "DraftingContext", "Option",
    "PartSpec", "SpecError", "build_drafter", "check_spec", "drafter_names", "make_drafter",
    "parse_spec", "tqdm_progress",
]
