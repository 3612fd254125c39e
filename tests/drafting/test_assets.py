"""Assets in one place: the cost profile measured once per device and reused, a corrupt
file re-measured (never trusted), keyed by the backend's own device description."""

from __future__ import annotations

import dataclasses

import pytest

from draftwise.core.device import DeviceInfo
from draftwise.drafting import Assets, DraftingContext, SpecError, build_drafter
from draftwise.drafting.assets import BIGRAM_TABLE, COST_PROFILE
from draftwise.errors import DraftwiseError
from tests.fakes import FakeBackend


class ThreadedFake(FakeBackend):
    def __init__(self, threads: int) -> None:
        super().__init__(vocab_size=128, context_limit=512)
        self.threads = threads

    def device_info(self) -> DeviceInfo:
        return dataclasses.replace(super().device_info(), threads=self.threads)


def make_assets(tmp_path, be=None, resets=None):
    be = be or FakeBackend(vocab_size=128, context_limit=512)
    hook = (lambda: resets.append(1)) if resets is not None else None
    return Assets(be, tmp_path / "model", "tok", on_backend_reset=hook, root=tmp_path / "cache")


def test_cost_profile_measured_once_stored_and_reused(tmp_path, monkeypatch):
    # a fake's microsecond verifies may cost less for more rows on a busy machine: such a
    # curve is measured again on load (test_costmodel.py's test); here reuse is asserted
    monkeypatch.setattr("draftwise.core.costmodel.CostModel.plausible", lambda self: True)
    resets: list[int] = []
    assets = make_assets(tmp_path, resets=resets)
    assert not assets.ready(COST_PROFILE)
    cost = assets.cost_profile(quiet=True, reps=1)
    path = assets.profile_path()
    assert path.is_file() and assets.ready(COST_PROFILE) and resets == [1]
    assert cost.meta["threads"] == "1" and cost.meta["mode"] == "normal"
    again = make_assets(tmp_path).cost_profile(quiet=True, reps=1)  # read from disk
    assert (again.ms == cost.ms).all()
    path.write_text("{truncated")
    fresh = make_assets(tmp_path)
    fixed = fresh.cost_profile(quiet=True, reps=1)
    assert fixed.ms.shape == cost.ms.shape and path.read_text().startswith("{")


def test_profile_path_follows_the_device_description(tmp_path):
    one = make_assets(tmp_path, ThreadedFake(1)).profile_path()
    two = make_assets(tmp_path, ThreadedFake(2)).profile_path()
    assert one != two and one.parent == two.parent


def test_bigram_table_needs_a_backend_that_can_build_it(tmp_path):
    assets = make_assets(tmp_path)
    assert not assets.ready(BIGRAM_TABLE)
    with pytest.raises(DraftwiseError, match="cannot build a bigram table"):
        assets.bigram_table(quiet=True)
    with pytest.raises(DraftwiseError, match="unknown asset"):
        assets.ready("nope")


def test_auto_through_a_context_uses_the_profile(tmp_path):
    be = FakeBackend(vocab_size=128, context_limit=512)
    assets = make_assets(tmp_path, be)
    ctx = DraftingContext.for_backend(be, assets, "tok")
    assert ctx.device == be.device_info()
    auto = build_drafter("auto:max_budget=8", ctx)
    assert auto.max_budget == 8 and auto.cost is assets.cost_profile()
    with pytest.raises(SpecError, match="needs this device's cost profile"):
        build_drafter("auto", DraftingContext.standalone())


def test_draft_cost_profile_measured_once_per_draft_and_reused(tmp_path):
    """The draft model's forward curve (``auto`` for draft/card) is stored per draft."""
    assets = make_assets(tmp_path)
    lm = FakeBackend(vocab_size=128, context_limit=512)  # measured like a target: verify
    cost = assets.draft_cost_profile(lm, "early-exit|layers=4", quiet=True)
    path = assets.draft_profile_path("early-exit|layers=4")
    assert path.is_file() and cost.meta["draft"] == "early-exit|layers=4"
    assert path != assets.draft_profile_path("early-exit|layers=8") != assets.profile_path()
    again = make_assets(tmp_path).draft_cost_profile(lm, "early-exit|layers=4", quiet=True)
    assert (again.ms == cost.ms).all() and list(again.rows) == [1, 2, 4, 8, 16]


@pytest.mark.parametrize("name", ["draft", "card"])
def test_auto_true_plans_with_both_stored_curves(tmp_path, name):
    """``draft:auto=true`` / ``card:auto=true`` get a planner built from the model's
    verify profile and the draft's stored forward curve (sequential vs parallel)."""
    from draftwise.core.costmodel import CostModel
    from tests.core.fake_draft import FakeDraftLM

    be = FakeBackend(vocab_size=128, context_limit=512)
    assets = make_assets(tmp_path, be)
    verify = CostModel(rows=[1, 64], ms=[50.0, 80.0])
    assets.use_cost_profile(verify)
    lm = FakeDraftLM(vocab_size=16)
    draft = CostModel(rows=[1, 16], ms=[3.0, 9.0])
    draft.save(assets.draft_profile_path(f"early-exit|layers=8|head=0|{lm.name}"))
    ctx = DraftingContext.for_backend(be, assets, "tok")
    d = build_drafter(f"{name}:auto=true,beam=2,topk=3,depth=5", ctx, lm=lm)
    try:
        p = d.planner
        assert p.verify is verify and (p.draft.ms == draft.ms).all()
        assert (p.beam, p.topk, p.max_depth, p.parallel) == (2, 3, 5, name == "card")
        assert build_drafter(f"{name}:beam=2", ctx, lm=FakeDraftLM(vocab_size=16)).planner is None
    finally:
        if name == "card":
            d.close()
