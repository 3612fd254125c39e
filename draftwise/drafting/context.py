"""What a drafter may know about the model it drafts for: the drafting context.

Drafters are built from a spec and this small context, never from the ``Model`` object:
the tokenizer's identity (tables and checkpoints are refused for another tokenizer),
the backend (for drafters that run a network on the model's device), what that backend
can do, the device description, lazily built assets, and a progress factory.

Example::

    >>> ctx = DraftingContext.standalone()          # model-free drafters only
    >>> ctx.capabilities
    frozenset()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from draftwise.core.backend import Backend
from draftwise.core.batch import BatchVerifier
from draftwise.core.device import DeviceInfo
from draftwise.core.drafters.bigram_table import TableSource
from draftwise.drafting.progress import ProgressFactory
from draftwise.drafting.spec import SpecError

if TYPE_CHECKING:
    from draftwise.drafting.assets import Assets

#: capability names, from the backend protocols it implements
NEXT_TOPK, BATCH_VERIFY = "next_topk", "batch_verify"


@dataclass
class DraftingContext:
    """Everything a drafter builder may use (see the module docstring)."""

    tokenizer_id: str | None = None
    device: DeviceInfo | None = None
    backend: Backend | None = None
    assets: Assets | None = None
    progress: ProgressFactory | None = None

    @classmethod
    def standalone(cls) -> DraftingContext:
        """No model: builds the model-free drafters (and drafters given their tables)."""
        return cls()

    @classmethod
    def for_backend(
        cls, backend: Backend, assets: Assets, tokenizer_id: str,
        progress: ProgressFactory | None = None,
    ) -> DraftingContext:
        return cls(tokenizer_id, backend.device_info(), backend, assets, progress)

    @property
    def capabilities(self) -> frozenset[str]:
        """What the backend can do beyond the verify contract."""
        caps = set()
        if isinstance(self.backend, TableSource):
            caps.add(NEXT_TOPK)
        if isinstance(self.backend, BatchVerifier):
            caps.add(BATCH_VERIFY)
        return frozenset(caps)

    def need_assets(self, drafter: str, what: str) -> Assets:
        """The assets, or a clear error when the drafter is built without a model."""
        if self.assets is None:
            raise SpecError(
                f"the {drafter} drafter needs {what}: build it through a loaded model "
                f"(model.drafter({drafter!r})) or pass it as an argument"
            )
        return self.assets
