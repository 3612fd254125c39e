"""Every registered drafter: its options' types and bounds, remote safety, and that it
builds at its defaults through the one factory."""

from __future__ import annotations

import pytest

from draftwise.core.costmodel import CostModel
from draftwise.drafting import REGISTRY, SpecError, check_spec, make_drafter
from draftwise.drafting.options import OBJECT, PATH

NUMERIC = [
    (name, opt) for name, e in REGISTRY.items() for opt in e.options if opt.kind in (int, float)
]
CHOICES = [(name, opt) for name, e in REGISTRY.items() for opt in e.options if opt.choices]


def fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


@pytest.mark.parametrize("name, opt", NUMERIC, ids=[f"{n}.{o.name}" for n, o in NUMERIC])
def test_numeric_bounds(name, opt):
    assert opt.low is not None and opt.high is not None, "every number needs bounds"
    assert opt.low <= opt.default <= opt.high
    for ok in (opt.low, opt.high, opt.default):
        check_spec(f"{name}:{opt.name}={fmt(ok)}")
    step = 1 if opt.kind is int else max(abs(opt.low), 1.0) * 1e-3
    for bad, words in ((opt.low - step, ">="), (opt.high + step, "<=")):
        with pytest.raises(SpecError, match=f"{name} option {opt.name} must be {words}"):
            check_spec(f"{name}:{opt.name}={fmt(bad)}")
    with pytest.raises(SpecError, match=f"option {opt.name} must be"):
        check_spec(f"{name}:{opt.name}=abc")


@pytest.mark.parametrize("name, opt", CHOICES, ids=[f"{n}.{o.name}" for n, o in CHOICES])
def test_choices(name, opt):
    for c in opt.choices:
        check_spec(f"{name}:{opt.name}={c}")
    with pytest.raises(SpecError, match=f"{opt.name} must be one of"):
        check_spec(f"{name}:{opt.name}=nonsense")


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_unknown_option_lists_the_accepted_ones(name):
    with pytest.raises(SpecError) as info:
        check_spec(f"{name}:zz=3")
    msg = str(info.value)
    assert f"unknown option 'zz' for drafter '{name}'" in msg
    for opt in REGISTRY[name].options:
        assert opt.name in msg


def test_paths_objects_and_allocating_options_are_local_only():
    for name, entry in REGISTRY.items():
        for opt in entry.options:
            if opt.kind in (PATH, OBJECT):
                assert not opt.remote, f"{name}.{opt.name}"
    local = {(n, o.name) for n, e in REGISTRY.items() for o in e.options if not o.remote}
    for must in [("ssd", "capacity"), ("ssd", "background"), ("cacheback", "lc"), ("cacheback", "fc"),
                 ("cacheback", "frozen_path"), ("ngrammys", "table_path"), ("auto", "cost")]:
        assert must in local
    for spec in ["ssd:capacity=536870912", "cacheback:frozen_path=/etc/shadow", "cacheback:lc=8",
                 "ngrammys:table_path=/tmp/x.npz"]:
        check_spec(spec.replace("536870912", "1024"))  # fine for a local caller
        with pytest.raises(SpecError, match="cannot be set by a request"):
            check_spec(spec, remote=True)


def test_remote_budget_cap_and_assets():
    check_spec("cacheback:budget=64", remote=True, max_budget=64)
    with pytest.raises(SpecError, match="budget must be <= 64, got 65"):
        check_spec("cacheback:budget=65", remote=True, max_budget=64)
    with pytest.raises(SpecError, match="bigram table is not built"):
        check_spec("ngrammys:k=3", remote=True, ready=lambda asset: False)
    check_spec("ngrammys:k=3", remote=True, ready=lambda asset: True)
    with pytest.raises(SpecError, match="cost profile is not built"):
        check_spec("auto", remote=True, ready=lambda asset: False)


def test_a_path_option_reports_the_same_for_any_path():
    """A client can not probe which files exist: the refusal does not depend on the file."""
    msgs = set()
    for path in ["/etc/shadow", "/nonexistent", "/etc/hostname"]:
        with pytest.raises(SpecError) as info:
            check_spec(f"cacheback:frozen_path={path}", remote=True)
        msgs.add(str(info.value))
    assert len(msgs) == 1


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_drafter_builds_at_its_defaults(name):
    from tests.core.test_ngrammys import fake_table
    from tests.fakes import FakeBatchBackend

    objects = {}
    if name == "auto":
        objects = {"cost": CostModel(rows=[1, 64], ms=[10, 11])}
    if name in ("bigram", "ngrammys"):
        objects = {"table": fake_table(FakeBatchBackend(vocab_size=16))}
    if name in ("draft", "card"):
        from tests.core.fake_draft import FakeDraftLM

        objects = {"lm": FakeDraftLM(vocab_size=16)}
    if name == "redrafter":
        from tests.core.test_redrafter import FakeNet

        objects = {"net": FakeNet()}
    d = make_drafter(name, **objects)
    assert d.name == name
    d.reset()


def test_objects_cannot_come_from_text():
    with pytest.raises(SpecError, match="cannot be given in a spec"):
        check_spec("auto:cost=3")
    with pytest.raises(SpecError, match="not supported for a combined drafter"):
        make_drafter("cacheback+ssd", fl=2)
