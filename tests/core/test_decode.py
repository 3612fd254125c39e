"""The decoding loop on a fake model: lossless greedy, exact sampling, cache bookkeeping."""

import numpy as np
import pytest
from scipy import stats

from draftwise.core.decode import Decoder
from draftwise.core.drafters.base import NoDrafter
from draftwise.core.drafters.cacheback import Cacheback
from draftwise.core.sampling import SamplingParams, probabilities
from draftwise.core.tree import DraftTree
from draftwise.errors import DraftwiseError
from tests.fakes import FakeBackend


class RandomTreeDrafter:
    """Proposes random trees: exercises every acceptance branch."""

    name = "random"

    def __init__(self, vocab: int, seed: int = 0) -> None:
        self.vocab, self.rng = vocab, np.random.default_rng(seed)

    def reset(self) -> None: ...
    def begin(self, prompt) -> None: ...
    def update(self, context, n_new) -> None: ...

    def propose(self, context, budget):
        paths = [self.rng.integers(0, self.vocab, self.rng.integers(1, 4)).tolist() for _ in range(4)]
        return DraftTree.from_paths(paths, budget=budget)


def run(backend, drafter, params, prompt, n, seed=None, budget=8):
    dec = Decoder(backend)
    steps = list(dec.steps(prompt, drafter, params, n, seed=seed, budget=budget))
    return [t for s in steps for t in s.tokens], steps, dec


def test_greedy_identical_and_fewer_steps():
    be = FakeBackend(vocab_size=6, sharpness=4.0)
    prompt = [1, 2, 3, 1, 2, 3, 1]
    plain, plain_steps, _ = run(be, NoDrafter(), SamplingParams(), prompt, 80)
    for drafter in (Cacheback(ll=1, fl=3), RandomTreeDrafter(6), Cacheback(ll=2, fl=2, crt=0)):
        spec, steps, _ = run(be, drafter, SamplingParams(), prompt, 80)
        assert spec == plain
    spec, steps, _ = run(be, Cacheback(), SamplingParams(), prompt, 80)
    assert len(plain_steps) == 80 and len(steps) < 60  # the fake model is repetitive


def test_same_seed_same_output_as_plain_sampling():
    be = FakeBackend(vocab_size=8, sharpness=2.0)
    params = SamplingParams(temperature=0.8, top_p=0.95, repetition_penalty=1.1)
    for seed in range(5):
        plain, _, _ = run(be, NoDrafter(), params, [3, 4], 40, seed=seed)
        for d in (Cacheback(), RandomTreeDrafter(8, seed)):
            assert run(be, d, params, [3, 4], 40, seed=seed)[0] == plain


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=4)])
def test_speculative_sampling_distribution_matches_target(params):
    """Chi-square of 3-token continuations against the exact target distribution."""
    be = FakeBackend(vocab_size=5, sharpness=1.5, seed=3)
    prompt = [1, 2]
    exact = {}
    for a in range(5):
        pa = probabilities(be.logits_after(prompt), np.array(prompt), params)[a]
        for b in range(5):
            pb = probabilities(be.logits_after(prompt + [a]), np.array(prompt + [a]), params)[b]
            for c in range(5):
                pc = probabilities(be.logits_after(prompt + [a, b]), np.array(prompt + [a, b]), params)[c]
                exact[(a, b, c)] = pa * pb * pc
    draws = 6000
    counts = dict.fromkeys(exact, 0)
    drafter = RandomTreeDrafter(5, seed=11)
    rng = np.random.default_rng(123)
    accepted = 0
    for _ in range(draws):
        toks, steps, _ = run(be, drafter, params, prompt, 3, seed=int(rng.integers(1 << 31)))
        counts[tuple(toks)] += 1
        accepted += sum(s.accepted for s in steps)
    assert accepted > draws * 0.3  # the drafts were really used
    keys = [k for k in exact if exact[k] * draws >= 5]
    rest = [k for k in exact if exact[k] * draws < 5]
    obs = [counts[k] for k in keys] + [sum(counts[k] for k in rest)]
    exp = [exact[k] * draws for k in keys] + [sum(exact[k] for k in rest) * draws]
    assert sum(obs) == draws
    p = stats.chisquare(obs, np.array(exp) * draws / sum(exp)).pvalue
    assert p > 0.01, p


def test_chi_square_has_power():
    """The same check rejects a sampler that is slightly off (top_k=4 vs full)."""
    be = FakeBackend(vocab_size=5, sharpness=1.5, seed=3)
    full = SamplingParams(temperature=1.0)
    off = SamplingParams(temperature=1.0, top_k=4)
    p_full = probabilities(be.logits_after([1, 2]), np.array([1, 2]), full)
    rng = np.random.default_rng(0)
    draws = [run(be, NoDrafter(), off, [1, 2], 1, seed=int(rng.integers(1 << 31)))[0][0] for _ in range(3000)]
    obs = np.bincount(draws, minlength=5)
    exp = p_full * 3000
    keep = exp >= 5
    assert stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue < 0.01


def test_stop_and_length_and_cache_invariant():
    be = FakeBackend(vocab_size=6, sharpness=4.0)
    plain, _, _ = run(be, NoDrafter(), SamplingParams(), [1, 2, 3], 30)
    stop = plain[7]
    first = plain.index(stop)
    toks, steps, dec = run(be, Cacheback(), SamplingParams(), [1, 2, 3], 30, budget=8)
    toks2 = []
    dec = Decoder(be)
    for s in dec.steps([1, 2, 3], Cacheback(), SamplingParams(), 30, stop_ids=frozenset({stop})):
        toks2 += s.tokens
    assert toks2 == plain[: first + 1] and s.finish_reason == "stop"
    assert dec.cached == ([1, 2, 3] + toks2)[:-1] and be.cache_len == len(dec.cached)
    toks3, steps3, dec = run(be, Cacheback(), SamplingParams(), [1, 2, 3], 5)
    assert toks3 == plain[:5] and steps3[-1].finish_reason == "length"
    assert be.cache_len == 3 + 5 - 1


def test_early_stop_leaves_cache_consistent_and_reused():
    be = FakeBackend(vocab_size=6)
    dec = Decoder(be)
    gen = dec.steps([1, 2, 3, 4], Cacheback(), SamplingParams(), 50)
    got = next(gen)
    gen.close()
    assert be.cache_len == len(dec.cached) == 4 + len(got.tokens) - 1
    # a follow-up prompt extending the same sequence prefills only the new part
    prompt2 = [1, 2, 3, 4] + got.tokens + [5]
    out2 = [t for s in dec.steps(prompt2, NoDrafter(), SamplingParams(), 5) for t in s.tokens]
    fresh, _, _ = run(FakeBackend(vocab_size=6), NoDrafter(), SamplingParams(), prompt2, 5)
    assert out2 == fresh


def test_backend_reset_behind_the_decoders_back_is_noticed():
    """Someone drove the backend directly (a profile, a table build) and reset it: the
    next generation must prefill again, not trust its stale record of the cache."""
    be = FakeBackend(vocab_size=6)
    dec = Decoder(be)
    prompt = [1, 2, 3, 4, 5]
    first = [t for s in dec.steps(prompt, NoDrafter(), SamplingParams(), 6) for t in s.tokens]
    be.reset()
    be.prefill(np.array([5, 5]))  # and even left something else there
    be.trim(0)
    again = [t for s in dec.steps(prompt, NoDrafter(), SamplingParams(), 6) for t in s.tokens]
    assert be.cache == dec.cached == prompt + again[:-1]  # what is cached is what was read
    assert again == first


def test_input_errors():
    be = FakeBackend(context_limit=16)
    dec = Decoder(be)
    with pytest.raises(DraftwiseError, match="empty"):
        list(dec.steps([], NoDrafter(), SamplingParams(), 4))
    with pytest.raises(DraftwiseError, match="max_tokens"):
        list(dec.steps([1], NoDrafter(), SamplingParams(), 0))
    with pytest.raises(DraftwiseError, match="context limit is 16"):
        list(dec.steps(list(range(16)), NoDrafter(), SamplingParams(), 4))


def test_context_full_ends_with_length():
    be = FakeBackend(context_limit=20)
    toks, steps, _ = run(be, Cacheback(), SamplingParams(), [1, 2, 3], 100)
    assert steps[-1].finish_reason == "length" and be.cache_len <= 20
    plain, _, _ = run(FakeBackend(context_limit=20), NoDrafter(), SamplingParams(), [1, 2, 3], 100)
    assert toks[: len(plain)] == plain[: len(toks)]


@pytest.mark.parametrize("left", [1, 2, 3, 5, 8, 16, 17, 40])
@pytest.mark.parametrize("max_tokens", [1, 16, 200])
def test_the_context_edge_is_the_same_for_every_drafter(left, max_tokens):
    """Prompt and output together hold at most ``context_limit`` tokens, whatever drafts:
    the same tokens and finish reason as plain decoding, right to the edge."""
    limit = 48
    prompt = ([1, 2, 3] * limit)[: limit - left]
    plain, plain_steps, _ = run(FakeBackend(vocab_size=6, sharpness=4.0, context_limit=limit),
                                NoDrafter(), SamplingParams(), prompt, max_tokens)
    assert len(plain) == min(max_tokens, left)
    for drafter in (Cacheback(ll=1, fl=3), RandomTreeDrafter(6)):
        be = FakeBackend(vocab_size=6, sharpness=4.0, context_limit=limit)
        spec, steps, _ = run(be, drafter, SamplingParams(), prompt, max_tokens, budget=64)
        assert spec == plain
        assert steps[-1].finish_reason == plain_steps[-1].finish_reason == "length"
        assert be.cache_len < limit


def test_sizes_no_generation_could_use_are_refused_before_allocating():
    be = FakeBackend(context_limit=64)
    with pytest.raises(DraftwiseError, match="max_tokens must be at most"):
        next(Decoder(be).steps([1, 2], NoDrafter(), SamplingParams(), 10**12))
    with pytest.raises(DraftwiseError, match="draft budget must be at most"):
        next(Decoder(be).steps([1, 2], NoDrafter(), SamplingParams(), 4, budget=10**9))
    with pytest.raises(DraftwiseError, match="max_tokens must be an integer"):
        next(Decoder(be).steps([1, 2], NoDrafter(), SamplingParams(), 4.5))  # type: ignore[arg-type]


def test_capped_drafter_never_exceeds_its_budget_and_stays_lossless(tmp_path):
    from draftwise.drafting import make_drafter
    from draftwise.core.drafters.compose import Capped
    from draftwise.drafting import PartSpec, parse_spec

    be = FakeBackend(vocab_size=6, sharpness=4.0)
    prompt = [1, 2, 3, 1, 2, 3, 1]
    plain, _, _ = run(be, NoDrafter(), SamplingParams(), prompt, 60)
    for cap in (0, 1, 3):
        d = make_drafter(f"cacheback:fl=3,budget={cap}")
        assert isinstance(d, Capped) and d.name == f"cacheback:budget={cap}"
        spec, steps, _ = run(be, d, SamplingParams(), prompt, 60, budget=16)
        assert spec == plain
        assert max(s.drafted for s in steps) <= cap
    wide, steps, _ = run(be, make_drafter("cacheback:fl=3"), SamplingParams(), prompt, 60, budget=16)
    assert max(s.drafted for s in steps) > 3  # without the cap the same drafter goes wider
    # A caller's smaller budget still wins over the cap.
    _, steps, _ = run(be, make_drafter("cacheback:budget=8"), SamplingParams(), prompt, 60, budget=2)
    assert max(s.drafted for s in steps) <= 2
    assert parse_spec("cacheback:budget=4,fl=2").parts[0] == PartSpec("cacheback", {"fl": "2"}, 4)
    for bad in ("cacheback:budget=x", "cacheback:budget=-1"):
        with pytest.raises(DraftwiseError, match="budget"):
            parse_spec(bad)
    # State saves and loads through the cap (the inner drafter's file).
    d = make_drafter("cacheback:budget=4")
    run(be, d, SamplingParams(), prompt, 20)
    d.save(tmp_path / "c.drafter", "tok")
    e = make_drafter("cacheback:budget=4")
    e.load(tmp_path / "c.drafter", "tok")
    ctx = np.array(prompt + plain[:20])
    assert e.propose(ctx, 16).tokens.tolist() == d.propose(ctx, 16).tokens.tolist()


class ProfilingOnPlanDrafter(RandomTreeDrafter):
    """Measures a cost curve when told the path (as ``auto`` does for sampling on first
    use): that drives the backend and resets its cache."""

    def __init__(self, vocab: int, backend, seed: int = 0) -> None:
        super().__init__(vocab, seed)
        self.backend = backend

    def plan_for(self, sampling: bool) -> None:
        self.backend.reset()
        self.backend.prefill(np.array([0, 1, 2]))  # a profile's own tokens
        self.backend.trim(0)


def test_a_profile_measured_when_planning_does_not_corrupt_the_generation():
    be = FakeBackend(vocab_size=8, sharpness=2.0)
    params = SamplingParams(temperature=0.8, top_p=0.95)
    plain, _, _ = run(be, NoDrafter(), params, [3, 4, 5], 30, seed=1)
    spec, _, dec = run(be, ProfilingOnPlanDrafter(8, be, 1), params, [3, 4, 5], 30, seed=1)
    assert spec == plain
    assert be.cache == dec.cached


class _OverlappingFake(FakeBackend):
    """A backend that overlaps: runs ``while_waiting`` inside its verify, noting when."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.while_waiting = None
        self.log: list[str] = []

    def verify(self, root, tree, need_logits):
        self.log.append("launch")
        if self.while_waiting is not None:
            self.while_waiting()
        return super().verify(root, tree, need_logits)


class _Booked(RandomTreeDrafter):
    """A drafter with background bookkeeping: records when it runs."""

    def __init__(self, vocab, log) -> None:
        super().__init__(vocab)
        self.log = log

    def background(self) -> None:
        self.log.append("background")


@pytest.mark.parametrize("overlaps", [True, False])
def test_background_bookkeeping_runs_once_a_step_and_changes_nothing(overlaps):
    """Where the backend overlaps, the drafter's background work runs inside each verify
    (after the launch, before the result); elsewhere right after it; once a step either
    way, and the output is plain decoding's."""
    be = _OverlappingFake(vocab_size=6, sharpness=4.0) if overlaps else FakeBackend(vocab_size=6, sharpness=4.0)
    log = be.log if overlaps else []
    prompt = [1, 2, 3, 1, 2, 3, 1]
    plain, _, _ = run(FakeBackend(vocab_size=6, sharpness=4.0), NoDrafter(), SamplingParams(), prompt, 30)
    spec, steps, _ = run(be, _Booked(6, log), SamplingParams(), prompt, 30)
    assert spec == plain
    assert log.count("background") == len(steps)
    if overlaps:
        assert log == ["launch", "background"] * len(steps)
        assert be.while_waiting is None  # released after the generation


def test_auto_scores_its_trees_in_the_background():
    """auto's acceptance bookkeeping moved to ``background``: the decoder runs it, every
    tree but the last step's is scored, and the output is plain decoding's."""
    from draftwise.core.autotune import AutoDrafter
    from draftwise.core.costmodel import CostModel

    be = FakeBackend(vocab_size=6, sharpness=4.0)
    prompt = [1, 2, 3, 1, 2, 3, 1]
    auto = AutoDrafter([Cacheback()], CostModel(rows=[1, 64], ms=[10, 10.5]))
    before = auto.acc.tries.sum()
    plain, _, _ = run(be, NoDrafter(), SamplingParams(), prompt, 40)
    spec, _, _ = run(be, auto, SamplingParams(), prompt, 40)
    assert spec == plain
    assert auto.acc.tries.sum() > before  # trees were scored
    n_scored = auto.acc.tries.sum()
    auto.background()  # nothing new is known after the generation's last scoring
    assert auto.acc.tries.sum() >= n_scored
