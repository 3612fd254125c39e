import numpy as np
import pytest

from draftwise.core.autotune import AcceptanceModel, AutoDrafter, CostModel, choose_subtree, matched
from draftwise.core.decode import Decoder
from draftwise.core.drafters.base import NoDrafter
from draftwise.core.drafters.cacheback import Cacheback
from draftwise.core.sampling import SamplingParams
from draftwise.core.tree import DraftTree, merge_trees
from draftwise.errors import DraftwiseError
from tests.fakes import FakeBackend


def wide_tree():
    return DraftTree.from_paths([[1, 2, 3, 4], [1, 5], [6, 7], [8], [9]])


def test_steep_cost_shrinks_tree_flat_cost_grows_it():
    acc = AcceptanceModel(prior=(3.0, 1.0))  # p = 0.75 per node
    flat = CostModel(rows=[1, 2, 16, 64], ms=[50, 50, 51, 55])
    steep = CostModel(rows=[1, 2, 16, 64], ms=[50, 100, 600, 2400])  # 2x for one more row
    mid = CostModel(rows=[1, 2, 16, 64], ms=[50, 55, 400, 1600])  # one more row is cheap
    t = wide_tree()
    n_flat = len(choose_subtree(t, acc, flat, 100))
    n_mid = len(choose_subtree(t, acc, mid, 100))
    n_steep = len(choose_subtree(t, acc, steep, 100))
    assert n_flat == len(t) and n_steep == 0 and 0 < n_mid < len(t)
    low = AcceptanceModel(prior=(1.0, 99.0))  # drafts almost never accepted
    assert len(choose_subtree(t, low, mid, 100)) == 0


def test_chosen_subtree_is_best_first_and_valid():
    acc = AcceptanceModel(prior=(3.0, 1.0))
    mid = CostModel(rows=[1, 2, 16, 64], ms=[50, 52, 90, 300])
    sub = choose_subtree(wide_tree(), acc, mid, 100)
    assert all(p < i for i, p in enumerate(sub.parents.tolist()))
    assert 1 in sub.tokens.tolist()  # the best-first nodes are the shallow first-rank ones


def test_cost_interpolation_and_contexts(tmp_path):
    c = CostModel(rows=[1, 9], ms=[[10, 20], [30, 60]], contexts=[0, 1000])
    assert c.cost(5, 0) == pytest.approx(15)
    assert c.cost(5, 1000) == pytest.approx(45)
    assert c.cost(5, 500) == pytest.approx(30)
    assert c.cost(17, 0) == pytest.approx(30)  # linear extrapolation
    c.save(tmp_path / "p.json")
    assert CostModel.load(tmp_path / "p.json").cost(5, 500) == pytest.approx(30)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DraftwiseError, match="bad.json"):
        CostModel.load(tmp_path / "bad.json")


def test_acceptance_learns_counterfactually():
    acc = AcceptanceModel(prior=(1.0, 1.0), decay=1.0)
    t = DraftTree.from_paths([[1, 2], [3]])  # tokens [1, 3, 2]
    for _ in range(50):
        acc.observe(t, np.array([1, 2, 7]))
    p = acc.node_probs(t)
    assert p[0] > 0.9 and p[1] < 0.1 and p[2] > 0.9  # rank-0 depth-1 and depth-2 good
    # an unreached node (parent rejected) is not counted
    acc2 = AcceptanceModel(prior=(1.0, 1.0), decay=1.0)
    acc2.observe(t, np.array([5, 2]))
    assert acc2.node_probs(t)[2] == pytest.approx(0.5)


def test_auto_identical_to_plain_and_adapts():
    be = FakeBackend(vocab_size=6, sharpness=4.0)
    prompt = [1, 2, 3, 1, 2, 3, 1]
    plain = [t for s in Decoder(be).steps(prompt, NoDrafter(), SamplingParams(), 60) for t in s.tokens]
    flat = CostModel(rows=[1, 64], ms=[10, 10.5])
    steep = CostModel(rows=[1, 2, 64], ms=[10, 30, 2000])
    for cost, expect_spec in ((flat, True), (steep, False)):
        auto = AutoDrafter([Cacheback()], cost)
        steps = list(Decoder(be).steps(prompt, auto, SamplingParams(), 60))
        assert [t for s in steps for t in s.tokens] == plain
        drafted = sum(s.drafted for s in steps)
        if expect_spec:
            assert drafted > 10
        else:  # nothing but the live curve's probes of a two-row price (wants_rows)
            assert all(s.drafted <= 1 for s in steps) and drafted <= 3


def test_auto_and_combined_save_load(tmp_path):
    from draftwise.core.drafters.compose import Combined

    cost = CostModel(rows=[1, 64], ms=[10, 10.5])
    a = AutoDrafter([Cacheback(), Cacheback(fl=2)], cost)
    a.begin(np.array([1, 2, 3, 1, 2, 4]))
    a.save(tmp_path / "auto.drafter", "tok")
    b = AutoDrafter([Cacheback(), Cacheback(fl=2)], cost)
    b.load(tmp_path / "auto.drafter", "tok")
    for x, y in zip(a.members, b.members):
        assert list(x.table.items()) == list(y.table.items())
    with pytest.raises(DraftwiseError, match="tok"):
        Combined([Cacheback()]).load(tmp_path / "auto.drafter", "other-tokenizer")
    with pytest.raises(DraftwiseError, match="no saved drafter state"):
        b.load(tmp_path / "missing.drafter", "tok")


def test_auto_members_precise_first_and_learnt_apart():
    """``auto`` = a 3-token-leader Cacheback, SSD and a 1-token-leader Cacheback; the
    acceptance model keeps one row of statistics per member."""
    from draftwise.drafting import make_drafter

    auto = make_drafter("auto", cost=CostModel(rows=[1, 64], ms=[10, 10.5]))
    assert [m.name for m in auto.members] == ["cacheback-ll3", "ssd", "cacheback"]
    assert auto.members[0].table.ll == 3 and auto.members[2].table.ll == 1
    assert auto.acc.hits.shape[0] == 3
    # A context whose last 3 tokens occurred before: the precise member proposes, and its
    # node is attributed to source 0 in the merged tree.
    ctx = np.array([5, 6, 7, 8, 9, 5, 6, 7])
    auto.begin(ctx)
    tree = auto.propose(ctx, 16)
    full, _, _ = auto._pending[-1]
    assert 8 in full.tokens[full.depth == 1].tolist()
    assert full.source[full.tokens.tolist().index(8)] == 0
    assert len(tree) <= len(full)


def test_choice_respects_max_nodes():
    acc = AcceptanceModel(prior=(3.0, 1.0))
    flat = CostModel(rows=[1, 64], ms=[50, 51])
    t = wide_tree()
    assert len(choose_subtree(t, acc, flat, 100)) == len(t)
    assert len(choose_subtree(t, acc, flat, 100, max_nodes=3)) == 3
    assert len(choose_subtree(t, acc, flat, 100, max_nodes=0)) == 0


class _Fixed(NoDrafter):
    """A drafter that always proposes the same tree (NoDrafter's no-op learning)."""

    def __init__(self, name, paths):
        self.name, self.tree = name, DraftTree.from_paths(paths)

    def propose(self, context, budget):
        return self.tree


def test_broad_member_does_not_crowd_out_a_deep_one():
    """Members' trees are merged uncut and the budget is spent by expected gain: a
    well-accepted deep chain survives a member with many shallow, never-accepted guesses
    (a breadth-first cut at the budget kept the shallow ones and dropped the chain)."""
    deep = _Fixed("deep", [[1, 2, 3, 4, 5, 6]])
    broad = _Fixed("broad", [[t] for t in range(10, 20)])
    auto = AutoDrafter([deep, broad], CostModel(rows=[1, 64], ms=[50, 51]))
    auto.acc = AcceptanceModel(n_sources=2, prior=(1.0, 1.0), decay=1.0)
    for _ in range(30):  # the deep chain is always right, the broad guesses never
        auto.acc.observe(merge_trees([deep.tree, broad.tree]), np.array([1, 2, 3, 4, 5, 6, 7]))
    ctx = np.array([0, 1, 2])
    tree = auto.propose(ctx, 6)
    assert tree.tokens.tolist() == [1, 2, 3, 4, 5, 6]


def _random_tree(rng: np.random.Generator, n: int) -> DraftTree:
    parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]
    return DraftTree(rng.integers(0, 4, n), parents, rng.integers(0, 3, n))


def test_vectorised_host_work_matches_node_loops() -> None:
    """matched, sibling ranks, path products and cost_upto equal their plain loops."""
    from draftwise.core.tree import path_reduce

    rng = np.random.default_rng(7)
    cost = CostModel([1, 4, 16], [[10.0, 12.0, 20.0], [14.0, 15.0, 30.0]], [128, 1024])
    for n in (1, 2, 9, 40):
        t = _random_tree(rng, n)
        emitted = rng.integers(0, 4, int(rng.integers(1, 6)))
        ok, rank, prod, seen = np.zeros(n, bool), np.zeros(n, int), np.zeros(n), {}
        p = rng.random(n)
        for i, (par, d, tok) in enumerate(zip(t.parents, t.depth, t.tokens)):
            ok[i] = d <= emitted.size and (par < 0 or ok[par]) and tok == emitted[d - 1]
            rank[i], seen[par] = seen.get(par, 0), seen.get(par, 0) + 1
            prod[i] = p[i] * (prod[par] if par >= 0 else 1.0)
        assert matched(t, emitted).tolist() == ok.tolist()
        assert t.sibling_rank().tolist() == rank.tolist()
        assert np.allclose(path_reduce(t.parents, p, np.multiply), prod, rtol=1e-12)
        for ctx in (50, 300, 5000):
            assert np.array_equal(cost.cost_upto(n + 1, ctx), cost.cost(np.arange(1, n + 2), ctx))
            # the Python-float version the per-step paths use: the same numbers, bit for bit
            assert cost.costs_to(n + 1, ctx) == cost.cost_upto(n + 1, ctx).tolist()
    before = cost.costs_to(9, 300)
    for _ in range(40):  # corrected live: the cached lists follow the new curve
        cost.observe(4, 300, 30.0)
    assert cost.costs_to(9, 300) == cost.cost_upto(9, 300).tolist() != before


def test_sampling_generation_plans_with_the_logits_cost_curve():
    """At temperature > 0 auto asks for the sampling path's curve; greedy keeps its own."""
    greedy = CostModel(rows=[1, 64], ms=[10.0, 10.0])  # flat: every node pays
    steep = CostModel(rows=[1, 64], ms=[10.0, 640.0])  # with logits: no tree pays
    asked = []
    auto = AutoDrafter([Cacheback()], greedy, sampling_cost=lambda: asked.append(1) or steep)
    dec = Decoder(FakeBackend())
    prompt = [1, 2, 3, 4] * 6
    sampled = list(dec.steps(prompt, auto, SamplingParams(temperature=0.8), 12, seed=3))
    assert auto.cost is steep and asked == [1]
    assert all(s.drafted == 0 for s in sampled)  # the steep curve keeps nothing
    list(dec.steps(prompt, auto, SamplingParams(), 12))
    assert auto.cost is greedy and asked == [1]


def test_stated_probabilities_are_binned_and_calibrated():
    """A drafter's own node probabilities pick the cell (not the sibling rank); the cells
    start at the bin's value and learn what is really accepted (calibration)."""
    # two siblings: rank 0 with q = 0.1 (bin 5), rank 1 with q = 0.9 (bin 0)
    t = DraftTree(np.array([4, 5]), np.array([-1, -1]), np.zeros(2, np.int16), [0.1, 0.9])
    acc = AcceptanceModel(prior=(1.0, 1.0), decay=1.0, prob_sources=[0])
    np.testing.assert_allclose(acc.node_probs(t), [0.11, 0.9])  # the drafter's word first
    for _ in range(60):  # the confident guess is in fact never right, the other always
        acc.observe(t, np.array([4]))
    p = acc.node_probs(t)
    assert p[0] > 0.9 and p[1] < 0.1
    # a tree without probabilities still uses ranks; merged trees keep each node's own
    merged = merge_trees([DraftTree.chain([4, 6]), t])
    assert merged.tokens.tolist() == [4, 5, 6]
    np.testing.assert_array_equal(merged.prob, [np.nan, 0.9, np.nan])
    sub = merged.subset(np.array([0, 1]))
    np.testing.assert_array_equal(sub.prob, [np.nan, 0.9])
    assert merge_trees([DraftTree.chain([4])]).prob is None


def test_auto_calibrates_a_member_that_states_probabilities():
    class Stating:
        name, states_probabilities = "stating", True

        def reset(self) -> None: ...
        def begin(self, prompt: np.ndarray) -> None: ...
        def update(self, context: np.ndarray, n_new: int) -> None: ...

        def propose(self, context: np.ndarray, budget: int) -> DraftTree:
            return DraftTree.chain([1]).with_prob(np.array([0.95]))

    auto = AutoDrafter([NoDrafter(), Stating()], CostModel(rows=[1, 64], ms=[10.0, 10.0]))
    assert auto.acc.node_probs(auto.propose(np.array([3, 4]), 8))[0] == pytest.approx(0.9)
    with pytest.raises(DraftwiseError, match="one probability per node, got 1 for 2"):
        DraftTree.chain([1, 2]).with_prob(np.array([0.5]))


def test_beam_member_is_sized_by_what_the_planner_keeps():
    """A beam member's width and length follow the nodes the cost-curve planner kept of
    its last tree (one more than the kept width and depth, within its own settings); a
    new text starts at the full settings again."""

    class Beam:
        name, sized_by_planner = "beam", True

        def __init__(self) -> None:
            self.bw, self.t, self.seen = 4, 5, []

        def reset(self) -> None: ...
        def begin(self, prompt: np.ndarray) -> None: ...
        def update(self, context: np.ndarray, n_new: int) -> None: ...

        def propose(self, context: np.ndarray, budget: int) -> DraftTree:
            self.seen.append((self.bw, self.t))
            self.last_beam = (self.bw, self.t)
            paths = [[10 + b] + [20 + b * 10 + d for d in range(self.t - 1)]
                     for b in range(self.bw)]
            return DraftTree.from_paths(paths)

    beam = Beam()
    flat = CostModel(rows=[1, 64], ms=[10.0, 10.0])  # every node is worth verifying
    auto = AutoDrafter([beam], flat, max_budget=64)
    auto.propose(np.array([3, 4]), 64)
    assert beam.seen == [(4, 5)] and auto.beam_sizes[0] == (4, 5)  # all kept: stays full
    steep = CostModel(rows=[1, 2, 3, 4, 64], ms=[10.0, 10.5, 11.0, 40.0, 2000.0])
    auto.cost = auto.greedy_cost = steep  # three nodes at most pay
    kept = auto.propose(np.array([3, 4]), 64)
    assert 0 < len(kept) <= 3
    width = int(np.bincount(kept.depth).max())
    assert auto.beam_sizes[0] == (width + 1, int(kept.max_depth) + 1) == (beam.bw, beam.t)
    assert auto.last_beam == (4, 5)  # the step's beams were drafted at the old sizes
    auto.propose(np.array([3, 4]), 64)
    assert beam.seen[-1] == (width + 1, int(kept.max_depth) + 1) == auto.last_beam
    auto.reset()
    assert (beam.bw, beam.t) == (4, 5) == auto.beam_sizes[0]


class CountingDrafter:
    """Proposes one fixed wrong guess and counts how often it is asked."""

    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    def reset(self) -> None: ...

    def begin(self, prompt) -> None: ...

    def update(self, context, n_new) -> None: ...

    def propose(self, context, budget):
        from draftwise.core.tree import DraftTree

        self.calls += 1
        return DraftTree.chain([7])


def test_drafting_is_skipped_when_no_first_token_can_pay():
    """A steep curve and a member that is never right: after the first proposals the
    members draft only every EXPLORE_EVERY-th step; on a flat curve, every step."""
    import numpy as np

    from draftwise.core.autotune import EXPLORE_EVERY

    ctx = np.arange(1, 40)
    for ms, want_skips in (([10.0, 640.0], True), ([10.0, 10.0], False)):
        member = CountingDrafter()
        auto = AutoDrafter([member], CostModel(rows=[1, 64], ms=ms))
        for step in range(64):
            auto.propose(ctx[: 10 + step], 8)
            auto.update(ctx[: 11 + step], 1)  # token 7 never comes: acceptance drops
            auto.background()  # the decoder runs it during the next verify
        if want_skips:
            assert member.calls <= 64 // EXPLORE_EVERY + 4 and auto.skipped_total > 40
        else:
            assert member.calls == 64 and auto.skipped_total == 0


class ChainDrafter:
    """Proposes the two tokens after the context's last (``right``) or two wrong ones,
    taking ``cost_s`` to do it on the fake ``clock`` (seconds; wall time would make the
    gate's verdict depend on how busy the machine is); counts its proposals."""

    def __init__(self, name: str, right: bool, clock: list[float], cost_s: float = 0.0) -> None:
        self.name, self.right, self.clock, self.cost_s, self.calls = name, right, clock, cost_s, 0

    def reset(self) -> None: ...

    def begin(self, prompt) -> None: ...

    def update(self, context, n_new) -> None: ...

    def propose(self, context, budget):
        from draftwise.core.tree import DraftTree

        self.calls += 1
        self.clock[0] += self.cost_s
        last = int(context[-1])
        return DraftTree.chain([last + 1, last + 2] if self.right else [1000, 1001])


def test_a_costly_member_drafts_only_while_it_pays(monkeypatch):
    """A member whose drafting costs 20% of a plain step is gated by the planner's own
    account of tokens per ms: beside a free member that guesses right, a wrong one sits
    out all but every EXPLORE_EVERY-th step; a right one beside a wrong free member keeps
    drafting (after its acceptance is learnt). The free member is never gated."""
    import numpy as np

    import draftwise.core.autotune as at
    from draftwise.core.autotune import EXPLORE_EVERY

    clock = [0.0]
    monkeypatch.setattr(at.time, "perf_counter", lambda: clock[0])

    ctx = np.arange(1, 200)
    flat = CostModel(rows=[1, 64], ms=[10.0, 12.0])
    for costly_right in (False, True):
        cheap = ChainDrafter("cheap", right=not costly_right, clock=clock)
        costly = ChainDrafter("costly", right=costly_right, clock=clock, cost_s=0.002)
        auto = AutoDrafter([cheap, costly], flat)
        for step in range(64):
            n = 10 + step
            auto.propose(ctx[:n], 8)
            auto.update(ctx[: n + 1], 1)
            auto.background()
            if step == 47:
                calls_48 = costly.calls
        assert cheap.calls == 64 and auto.member_skipped[0] == 0
        if costly_right:  # skipped at first at most (both priors alike), then every step
            assert costly.calls >= 48 and costly.calls - calls_48 == 16
            assert auto.member_edge[1] > 0
        else:
            assert costly.calls <= 64 // EXPLORE_EVERY + 4 and auto.member_edge[1] < 0
            assert auto.member_skipped[1] == 64 - costly.calls


class _Chain:
    """A beam member that states its probabilities (as the ReDrafter): a chain of t
    tokens 5, each right half the time on the texts below."""

    name, states_probabilities, sized_by_planner = "chain", True, True

    def __init__(self) -> None:
        self.bw, self.t, self.seen = 2, 3, []

    def reset(self) -> None: ...
    def begin(self, prompt: np.ndarray) -> None: ...
    def update(self, context: np.ndarray, n_new: int) -> None: ...

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        self.seen.append((self.bw, self.t))
        return DraftTree.chain([5] * self.t).with_prob(np.full(self.t, 0.5))


@pytest.mark.parametrize("steep,solo_faster", [(True, True), (True, False), (False, True)])
def test_auto_drafts_with_its_precise_member_alone_where_whole_steps_say_so(
    steep, solo_faster, monkeypatch
):
    """On a steep curve auto times whole steps of both ways (all members and the planner;
    the member that states probabilities alone, one token) and keeps the faster, trying
    the other every EXPLORE_EVERY-th step; the solo way drafts bw=1, t=1 and leaves the
    member's sizes for the full way as they were. On a flat curve it never goes solo."""
    import draftwise.core.autotune as at

    clock = [0.0]
    monkeypatch.setattr(at.time, "perf_counter", lambda: clock[0])
    chain = _Chain()
    cost = (CostModel(rows=[1, 2, 4, 64], ms=[10.0, 11.0, 16.0, 400.0]) if steep
            else CostModel(rows=[1, 64], ms=[10.0, 10.5]))
    auto = AutoDrafter([Cacheback(), chain], cost)
    ctx = [1, 2, 3] * 10
    ways = []
    for _ in range(80):
        sizes = (chain.bw, chain.t)
        tree = auto.propose(np.array(ctx), 8)
        ways.append(auto.way)
        if auto.way == "solo":
            assert len(tree) <= 1 and chain.seen[-1] == (1, 1) and (chain.bw, chain.t) == sizes
        fast = (auto.way == "solo") == solo_faster
        clock[0] += 0.003 if fast else 0.005  # whole-step seconds
        ctx.append(5)
        auto.update(np.array(ctx), 1)
    late = ways[20:]
    if not steep:
        assert set(ways) == {"full"} and auto.solo_steps == 0
    else:
        best, other = ("solo", "full") if solo_faster else ("full", "solo")
        assert late.count(best) >= 0.8 * len(late) and 1 <= late.count(other) <= 0.2 * len(late)


@pytest.mark.parametrize("steep,full_faster", [(True, True), (True, False), (False, True)])
def test_a_copy_member_picks_the_full_way_where_the_text_repeats(steep, full_faster, monkeypatch):
    """With a ``copy_member``, on a steep curve the precise member drafts alone where that
    member has not seen the text's last tokens before, whatever the measured rates say;
    where it has (a span may be copied), the way whose whole steps were faster in such
    steps (``StepRates`` of those steps alone), the other tried every EXPLORE_EVERY-th
    step. The copy member answers for every token (shown, or noted while behind), the
    others are shown them only when they draft. On a flat curve every step is full."""
    import draftwise.core.autotune as at

    clock = [0.0]
    monkeypatch.setattr(at.time, "perf_counter", lambda: clock[0])
    cost = (CostModel(rows=[1, 2, 4, 64], ms=[10.0, 11.0, 16.0, 400.0]) if steep
            else CostModel(rows=[1, 64], ms=[10.0, 10.5]))
    copier, other = Cacheback(ll=3, table="dynamic"), Cacheback()
    auto = AutoDrafter([copier, other, _Chain()], cost, copy_member=0)
    text = list(range(100, 130))  # no repeats: nothing seen before
    auto.begin(np.array(text))
    ways = []
    for step in range(60):
        tok = 100 + step % 12 if step >= 20 else 200 + step  # from step 20: the text again
        auto.propose(np.array(text), 8)
        ways.append(auto.way)
        fast = (auto.way == "full") == full_faster
        clock[0] += 0.001 if fast else 0.005  # the faster way measured 5x faster
        text.append(tok)
        auto.update(np.array(text), 1)
        assert auto._behind[2] == 0  # the solo member is never behind
        if step == 19 and steep:
            assert auto._behind[1] == 20  # the other member: not shown the solo steps' tokens
    if not steep:
        assert set(ways) == {"full"}
        return
    # new tokens only: the solo way, and the rates measured there do not count for copying
    assert ways[:20] == ["solo"] * 20
    late = ways[32:]  # the first 12 tokens again: their 3-token leaders were seen
    best, worse = ("full", "solo") if full_faster else ("solo", "full")
    assert late.count(best) >= 0.8 * len(late) and late.count(worse) >= 1
    assert copier.seen_before(np.array(text))  # every token counted (noted or shown)


def test_a_copy_steps_solo_way_verifies_the_copy_span_beside_the_chain(monkeypatch):
    """Where the solo way is faster in copy steps, such a step verifies the precise
    member's chain and the copy member's most recent follower of the text's last tokens
    (its span: COPY_SPAN nodes), each node's source its member; other solo steps the
    chain alone."""
    import draftwise.core.autotune as at

    clock = [0.0]
    monkeypatch.setattr(at.time, "perf_counter", lambda: clock[0])
    cost = CostModel(rows=[1, 2, 4, 64], ms=[10.0, 11.0, 16.0, 400.0])
    auto = AutoDrafter([Cacheback(ll=3, table="dynamic"), Cacheback(), _Chain()], cost,
                       copy_member=0)
    text = list(range(100, 130))
    auto.begin(np.array(text))
    spans = 0
    for step in range(40):
        tree = auto.propose(np.array(text), 8)
        clock[0] += 0.001 if auto.way == "solo" else 0.005  # solo 5x faster
        if auto.way == "solo":
            got = list(zip(tree.tokens.tolist(), tree.source.tolist(), strict=True))
            assert (5, 2) in got  # the chain's token
            if auto._copy_step:  # what followed the last 3 tokens where they last occurred
                at_ = [j for j in range(3, len(text) - 2) if text[j - 3 : j] == text[-3:]][-1]
                assert [t for t, s in got if s == 0] == text[at_ : at_ + at.COPY_SPAN]
                assert auto._behind[0] == 0  # shown what it missed first
                spans += 1
            else:
                assert got == [(5, 2)]
        text.append(100 + step % 12 if step >= 10 else 200 + step)  # from step 10: repeats
        auto.update(np.array(text), 1)
    assert spans >= 10


def test_copy_steps_keep_their_measured_rates_from_text_to_text(monkeypatch):
    """The copy steps' rates describe the machine: a new text (``begin``) keeps them, so
    where the full way was measured faster its copy steps take it at once, without
    trying each way again first (each way's first steps of a text cost what the slower
    way costs)."""
    import draftwise.core.autotune as at

    clock = [0.0]
    monkeypatch.setattr(at.time, "perf_counter", lambda: clock[0])
    cost = CostModel(rows=[1, 2, 4, 64], ms=[10.0, 11.0, 16.0, 400.0])
    auto = AutoDrafter([Cacheback(ll=3, table="dynamic"), Cacheback(), _Chain()], cost,
                       copy_member=0)

    def text(first: int, steps: int) -> list[str]:
        ids = list(range(first, first + 30))
        auto.begin(np.array(ids))
        ways = []
        for step in range(steps):  # the prompt again: copy steps from the fourth on
            auto.propose(np.array(ids), 8)
            ways.append(auto.way)
            clock[0] += 0.001 if auto.way == "full" else 0.005  # full 5x faster
            ids.append(first + step % 30)
            auto.update(np.array(ids), 1)
        return ways[3:]  # (the first steps: nothing seen before)

    first = text(100, 40)
    assert first[0] == "solo" and first.count("full") >= 0.7 * len(first)  # solo tried first
    second = text(300, 12)
    assert second[:6] == ["full"] * 6  # measured before: full at once


def test_a_copy_member_must_be_able_to_say_so():
    """``copy_member`` indexes a member with ``seen_before``: else a one-line error."""
    cost = CostModel(rows=[1, 64], ms=[10.0, 10.5])
    with pytest.raises(DraftwiseError, match="copy_member must index a member with seen_before"):
        AutoDrafter([Cacheback(), _Chain()], cost, copy_member=1)
    with pytest.raises(DraftwiseError, match="got 5"):
        AutoDrafter([Cacheback(), _Chain()], cost, copy_member=5)


@pytest.mark.parametrize("accepted", [True, False])
def test_when_sampling_auto_drafts_one_token_unless_its_acceptance_cannot_pay(
    accepted, monkeypatch
):
    """At temperature > 0 on a steep curve auto drafts one token with its precise member
    (``solo``) or nothing (``plain``), never the full way (``SoloPays``). A draft costs
    1 ms against a 10 ms plain step, so it cannot pay below an acceptance of 0.1: where
    drafts are accepted every step drafts; where they never are, once the acceptance
    (credited with its uncertainty) is below 0.1 the steps are plain, one in
    EXPLORE_EVERY still drafting. Greedy has no plain way."""
    import draftwise.core.autotune as at

    clock = [0.0]
    monkeypatch.setattr(at.time, "perf_counter", lambda: clock[0])
    chain = _Chain()
    real_propose = chain.propose

    def timed_propose(context: np.ndarray, budget: int) -> DraftTree:
        clock[0] += 0.001  # a draft: 1 ms
        return real_propose(context, budget)

    monkeypatch.setattr(chain, "propose", timed_propose)
    cost = CostModel(rows=[1, 2, 4, 64], ms=[10.0, 11.0, 16.0, 400.0])
    auto = AutoDrafter([Cacheback(), chain], cost)
    auto.plan_for(True)
    ctx, ways = [1, 2, 3] * 10, []
    for _ in range(100):
        tree = auto.propose(np.array(ctx), 8)
        ways.append(auto.way)
        assert len(tree) == (auto.way == "solo")
        assert auto._draft_share(len(ctx)) == pytest.approx(0.1)
        new = 2 if auto.way == "solo" and accepted else 1
        ctx.extend([5] * new)
        auto.update(np.array(ctx), new)
    assert auto.sampled is not None
    a = auto.sampled.acceptance
    assert a is not None and (a > 0.9 if accepted else a < 0.05)
    late = ways[-48:]
    if accepted:
        assert ways == ["solo"] * len(ways)
    else:  # the first drafts are judged before plain takes over
        assert ways[:20] == ["solo"] * 20
        assert late.count("solo") == len(late) // at.EXPLORE_EVERY
        assert late.count("plain") + late.count("solo") == len(late)
    auto.plan_for(False)
    auto.begin(np.array(ctx))
    greedy = []
    for _ in range(20):
        auto.propose(np.array(ctx), 8)
        greedy.append(auto.way)
        clock[0] += 0.003
        ctx.append(5)
        auto.update(np.array(ctx), 1)
    assert "plain" not in greedy


def test_members_that_sit_out_a_step_catch_up_before_they_draft():
    """Steps drafted by the solo member alone (or not at all) do not update the other
    members; they are shown those tokens in one ``update`` before they next draft, at
    the next text's ``begin`` and before ``save``: their tables end as if updated every
    step."""
    rng = np.random.default_rng(0)
    text = rng.integers(0, 12, 400).tolist()
    ref = Cacheback()
    ref.begin(np.array(text[:20]))
    for n in range(21, len(text) + 1):
        ref.update(np.array(text[:n]), 1)
    member = Cacheback()
    cost = CostModel(rows=[1, 2, 4, 64], ms=[10.0, 11.0, 16.0, 400.0])
    auto = AutoDrafter([member, _Chain()], cost)
    auto.begin(np.array(text[:20]))
    ways = ["solo", "plain", "full"]
    for n in range(21, len(text) + 1):
        auto.way = ways[n % 3] if n < 300 else "solo"
        if auto.way == "full":
            auto._catch_up(np.array(text[: n - 1]))  # what propose does before drafting
            assert auto._behind == [0, 0]
        auto.update(np.array(text[:n]), 1)
    assert auto._behind == [101, 0]  # the last 101 tokens; the solo member is never behind
    probe = [tuple([a]) for a in range(12)]
    assert [member.table.query(g) for g in probe] != [ref.table.query(g) for g in probe]
    auto.begin(np.array(text[-5:]))  # the next text: caught up first
    ref.begin(np.array(text[-5:]))
    assert auto._behind == [0, 0]
    assert [member.table.query(g) for g in probe] == [ref.table.query(g) for g in probe]


def test_a_full_step_that_copied_a_span_is_followed_by_another(monkeypatch):
    """A full step that emitted BURST tokens or more (a copied span being accepted) is
    followed by a full step, whatever the measured rates prefer."""
    import draftwise.core.autotune as at

    clock = [0.0]
    monkeypatch.setattr(at.time, "perf_counter", lambda: clock[0])
    cost = CostModel(rows=[1, 2, 4, 64], ms=[10.0, 11.0, 16.0, 400.0])
    auto = AutoDrafter([Cacheback(), _Chain()], cost)
    ctx, ways = [1, 2, 3] * 10, []
    for step in range(60):
        auto.propose(np.array(ctx), 8)
        ways.append(auto.way)
        full = auto.way == "full"
        clock[0] += 0.005 if full else 0.001  # solo: 2 tokens a ms; full: 0.2, then 0.6
        new = (at.BURST if step >= 20 else 1) if full else 2
        ctx.extend([5] * new)
        auto.update(np.array(ctx), new)
    assert ways[10:20].count("solo") >= 8  # measured faster
    first = ways.index("full", 20)  # an exploring full step that copied a span
    assert all(w == "full" for w in ways[first:])


class _FloorChain(_Chain):
    """A ``_Chain`` that, as the ReDrafter, can end its chain early (``min_path``)."""

    def __init__(self) -> None:
        super().__init__()
        self.min_path: np.ndarray | None = None
        self.floors: list[np.ndarray | None] = []

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        self.floors.append(self.min_path)
        return super().propose(context, budget)


def test_solo_chains_get_floors_from_the_curve_and_the_solo_rate(monkeypatch):
    """The solo way drafts up to SOLO_T tokens with a floor per depth: the verify row a
    token adds (and, past the first, its chain step) times the solo way's measured tokens
    per ms; the member's floor is cleared after the proposal."""
    import draftwise.core.autotune as at

    clock = [0.0]
    monkeypatch.setattr(at.time, "perf_counter", lambda: clock[0])
    chain = _FloorChain()
    cost = CostModel(rows=[1, 2, 3, 4, 64], ms=[10.0, 11.0, 13.0, 16.0, 400.0])
    auto = AutoDrafter([Cacheback(), chain], cost)
    before = auto._solo_floor(3, 30)  # solo not measured yet: one token per plain step
    step = at.CHAIN_STEP * 10.0
    np.testing.assert_allclose(before, [1.0 / 10, (2.0 + step) / 10, (3.0 + step) / 10])
    ctx, solo = [1, 2, 3] * 10, 0
    for _ in range(40):
        auto.propose(np.array(ctx), 8)
        if auto.way == "solo":
            solo += 1
            assert chain.seen[-1] == (1, at.SOLO_T) and chain.floors[-1] is not None
            assert chain.min_path is None  # cleared for the full way
        clock[0] += 0.002 if auto.way == "solo" else 0.005  # solo: 2 tokens in 2 ms
        ctx.extend([5, 5])
        auto.update(np.array(ctx), 2)
    assert solo >= 20
    rate = auto.rates.speed("solo")
    assert rate is not None and rate == pytest.approx(1.0)  # 2 tokens in 2 ms
    np.testing.assert_allclose(auto._solo_floor(3, 30), before * 10.0 * rate)


def test_solo_chains_when_sampling_keep_their_first_token_and_a_second_that_pays(monkeypatch):
    """At temperature > 0 (``plan_for(True)``) the solo way drafts up to SAMPLED_T tokens:
    the first with no floor (``SoloPays`` chose to draft), the next with the greedy
    chains' floor read through this text's calibration; a chain whose second token is
    never accepted is asked more for it, never for its first."""
    import draftwise.core.autotune as at

    clock = [0.0]
    monkeypatch.setattr(at.time, "perf_counter", lambda: clock[0])
    chain = _FloorChain()
    cost = CostModel(rows=[1, 2, 3, 4, 64], ms=[10.0, 11.0, 13.0, 16.0, 400.0])
    auto = AutoDrafter([Cacheback(), chain], cost)
    auto.plan_for(True)
    ctx, solo = [1, 2, 3] * 10, 0
    for _ in range(30):
        auto.propose(np.array(ctx), 8)
        if auto.way == "solo":
            solo += 1
            assert chain.seen[-1] == (1, at.SAMPLED_T) and chain.min_path is None
            floor = chain.floors[-1]
            assert floor is not None and floor[0] == 0.0 and floor[1] > 0.0
        clock[0] += 0.002 if auto.way == "solo" else 0.005
        ctx.extend([5, 7])  # the first token kept, the second not
        auto.update(np.array(ctx), 2)
    assert solo >= 10
    need = auto._solo_floor(at.SAMPLED_T, len(ctx))
    # depth 2: said 1 + 0.25 a chain, got the prior's 1 alone
    assert chain.floors[-1][1] == pytest.approx(min(1.0, need[1] * (1 + 0.25 * solo)), rel=0.05)


def test_sampled_copy_steps_verify_the_copy_span_beside_the_chain(monkeypatch):
    """At temperature > 0 a copy step (the copy member has seen the text's last tokens)
    drafts the solo way with the copy member's span beside the chain, even where
    ``SoloPays`` would draft nothing; the drafts' acceptance (``SoloPays``) is judged on
    the chain's first token alone, not on the span's."""
    import draftwise.core.autotune as at

    clock = [0.0]
    monkeypatch.setattr(at.time, "perf_counter", lambda: clock[0])
    cost = CostModel(rows=[1, 2, 4, 64], ms=[10.0, 11.0, 16.0, 400.0])
    auto = AutoDrafter([Cacheback(ll=3, table="dynamic"), Cacheback(), _Chain()], cost,
                       copy_member=0)
    auto.plan_for(True)
    assert auto.sampled is not None
    text = list(range(100, 130))
    auto.begin(np.array(text))
    spans = 0
    for step in range(40):
        tree = auto.propose(np.array(text), 8)
        got = []
        if len(tree):
            got = list(zip(tree.tokens.tolist(), tree.source.tolist(), strict=True))
        if auto._copy_step:
            assert auto.way == "solo" and (5, 2) in got
            at_ = [j for j in range(3, len(text) - 2) if text[j - 3 : j] == text[-3:]][-1]
            assert [t for t, s in got if s == 0] == text[at_ : at_ + at.COPY_SPAN]
            spans += 1
        else:
            assert all(s == 2 for _, s in got)  # the chain alone, or nothing
        before = auto.sampled.steps
        new = [100 + step % 12] if step >= 10 else [200 + step]  # from step 10: repeats
        if auto._copy_step:  # the span's first token accepted, then a bonus token
            new = [[t for t, s in got if s == 0][0], 100 + step % 12]
        text.extend(new)
        auto.update(np.array(text), len(new))
        if auto.way == "solo" and len(tree):
            assert auto.sampled.steps == before + 1
    assert spans >= 10
    # every judged draft was rejected (the chain's 5 never came): the span's accepted
    # tokens did not count for it (the prior 0.3 was worth 4 drafts)
    a = auto.sampled.acceptance
    assert a is not None and a < 0.1


def test_solo_floors_rise_where_the_chains_are_rejected_and_start_afresh_per_text(monkeypatch):
    """The solo chains' floors are ``_solo_floor``'s read through ``SoloCalibration``: the
    member says 0.5 a token (path 0.5, 0.25, 0.125) and none is accepted, so the floors it
    is given rise above what the curve asks; a new text (``begin``) starts afresh."""
    import draftwise.core.autotune as at

    clock = [0.0]
    monkeypatch.setattr(at.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(at.AutoDrafter, "_copying", lambda self, context: False)  # solo
    chain = _FloorChain()
    cost = CostModel(rows=[1, 2, 3, 4, 64], ms=[10.0, 11.0, 13.0, 16.0, 400.0])
    auto = AutoDrafter([Cacheback(), chain], cost, copy_member=0)
    ctx = [1, 2, 3] * 10
    auto.propose(np.array(ctx), 8)
    assert auto.way == "solo"
    need = auto._solo_floor(3, len(ctx)).tolist()
    np.testing.assert_allclose(chain.floors[-1], np.maximum.accumulate(need))  # ratio one
    for _ in range(10):  # each chain rejected at its first token
        ctx.append(7)
        auto.update(np.array(ctx), 1)
        clock[0] += 0.01  # a token a plain step's 10 ms: floors well below 1
        auto.propose(np.array(ctx), 8)
    # depth 1: said 1 + 10 x 0.5, got 1 (the prior)
    assert chain.floors[-1][0] == pytest.approx(auto._solo_floor(3, len(ctx))[0] * 6.0)
    auto.begin(np.array(ctx))
    auto.propose(np.array(ctx), 8)
    np.testing.assert_allclose(chain.floors[-1], np.maximum.accumulate(auto._solo_floor(3, len(ctx)).tolist()))


def test_when_sampling_the_slow_readings_are_taken_every_few_steps(monkeypatch):
    """When sampling, the curve's steepness, the drafting's share and the second token's
    need are read once every SAMPLED_REREAD proposals (and afresh at a new text), and one
    verify in SAMPLED_OBSERVE corrects the curve; greedy reads and observes every step."""
    import draftwise.core.autotune as at

    clock = [0.0]
    monkeypatch.setattr(at.time, "perf_counter", lambda: clock[0])
    cost = CostModel(rows=[1, 2, 4, 64], ms=[10.0, 11.0, 16.0, 400.0])
    auto = AutoDrafter([Cacheback(), _FloorChain()], cost)
    reads = []
    real = auto._steep
    monkeypatch.setattr(auto, "_steep", lambda n: reads.append(n) or real(n))
    auto.plan_for(True)
    ctx = [1, 2, 3] * 10
    for _ in range(3 * at.SAMPLED_REREAD):
        auto.propose(np.array(ctx), 8)
        auto.observe_verify(2, len(ctx), 11.0)
        clock[0] += 0.002
        ctx.extend([5, 5])
        auto.update(np.array(ctx), 2)
    assert len(reads) == 3 and cost._count == 3 * at.SAMPLED_REREAD // at.SAMPLED_OBSERVE
    auto.begin(np.array(ctx))  # a new text: read afresh
    auto.propose(np.array(ctx), 8)
    assert len(reads) == 4
    auto.plan_for(False)
    before, n = cost._count, len(reads)
    for _ in range(5):
        auto.propose(np.array(ctx), 8)
        auto.observe_verify(2, len(ctx), 11.0)
        clock[0] += 0.002
        ctx.extend([5, 5])
        auto.update(np.array(ctx), 2)
    assert cost._count == before + 5 and len(reads) == n + 5
