"""The ssd drafter: matching equals a naive scan, drafts, replay, threads, lossless decoding."""

import threading
import time

import numpy as np
import pytest

from draftwise.core.decode import Decoder
from draftwise.drafting import make_drafter
from draftwise.core.drafters.base import Drafter, NoDrafter
from draftwise.core.drafters.ssd import SSD
from draftwise.core.sampling import SamplingParams
from draftwise.errors import DraftwiseError
from tests.fakes import FakeBackend


def feed(d, rng, n_requests, vocab, lo=3, hi=40):
    """Random requests through begin/update as the decoder would; returns them."""
    reqs = []
    for _ in range(n_requests):
        prompt = rng.integers(0, vocab, int(rng.integers(1, 10)))
        out = rng.integers(0, vocab, int(rng.integers(lo, hi)))
        d.begin(prompt)
        seq = prompt.tolist()
        i = 0
        while i < out.size:
            k = int(rng.integers(1, 4))
            seq += out[i : i + k].tolist()
            d.update(np.array(seq), len(out[i : i + k]))
            i += k
        reqs.append((prompt.tolist(), out.tolist()))
    return reqs


def naive_find(buf, first, context, q_max):
    """Longest match length and its end positions, by brute force over the store."""
    total = first + len(buf)
    pat = list(context[-q_max:])[::-1]
    lens = {}
    for e in range(first, total - 1):  # the newest token is the context's own end
        n = 0
        while n < len(pat) and e - n >= first and buf[e - n - first] == pat[n]:
            n += 1
        lens[e] = n
    best = max(lens.values(), default=0)
    return best, {e for e, n in lens.items() if n == best and best > 0}


@pytest.mark.parametrize("indexed", ["all", "part", "stale", "none"])
def test_find_equals_naive_scan(indexed):
    rng = np.random.default_rng(5)
    d = SSD(
        capacity=700,
        q_max=6,
        max_matches=10**6,
        background=False,
        rebuild_tokens=10**9,
        max_tail=10**6,
    )
    reqs = feed(d, rng, 40, vocab=4)  # 40 requests overflow the 700-token ring
    if indexed != "none":
        d.sync_index()
    if indexed == "part":
        feed(d, rng, 3, vocab=4)  # fresh text only the tail scan sees
    if indexed == "stale":
        saved = d.store.read(0, d.store.total)
        d.store.clear()  # a new epoch: the index no longer describes the store
        d.store.begin_request(saved[1:])
    # what the drafter knows: the index's snapshot (ring overwrites since do not reach
    # into it), then the store from the snapshot's end
    ix = d.indexer.index
    if ix.epoch == d.store.epoch and ix.size:
        first = ix.start
        buf = ix.rev[: ix.size][::-1].tolist() + d.store.read(ix.end, d.store.total).tolist()
    else:
        first, buf = d.store.oldest, d.store.read(0, d.store.total).tolist()
    for trial in range(60):
        if trial % 3 == 0:
            ctx = reqs[-1][0] + reqs[-1][1]  # the current request's own text
        else:
            ctx = rng.integers(0, 4, int(rng.integers(1, 9))).tolist()
        m = d.find(np.array(ctx))
        want_len, want_ends = naive_find(buf, first, ctx, 6)
        assert (m.length, set(m.ends.tolist())) == (want_len, want_ends), (indexed, ctx)
        assert np.all(np.diff(m.ends) < 0)  # newest first


def test_max_matches_keeps_the_newest():
    d = SSD(max_matches=5, background=False, rebuild_tokens=10**9)
    for i in range(20):
        d.begin([1, 2, 100 + i])
    d.sync_index()
    d.begin([9, 1, 2])
    m = d.find(np.array([9, 1, 2]))  # (1, 2) after all 20 requests; the own end is not one
    assert m.length == 2 and m.ends.size == 5
    assert d._continuations(m, 1)[:, 0].tolist() == [119, 118, 117, 116, 115]


def test_degenerate_store_stays_bounded():
    d = SSD(capacity=1 << 16, max_matches=16, background=False, rebuild_tokens=10**9)
    d.begin(np.zeros(60000, np.int64))
    d.sync_index()
    t0 = time.perf_counter()
    for _ in range(20):
        m = d.find(np.zeros(30, np.int64))
        t = d.propose(np.zeros(30, np.int64), 8)
    assert m.length == 16 and m.ends.size == 16
    assert t.tokens.tolist() == [0] * 8 and t.is_chain()
    assert time.perf_counter() - t0 < 2.0  # bounded work per step, even on a busy machine


def test_tree_ranks_by_frequency_then_recency():
    d = SSD(background=False, replay=False)
    for out in ([4, 5], [6, 7], [4, 5], [8, 9], [4, 5]):
        d.begin([1, 2, 3])
        d.update(np.array([1, 2, 3] + out), 2)
    d.begin([0, 2, 3])
    t = d.propose(np.array([0, 2, 3]), budget=4)
    # (4, 5) three times; then the newest of the single ones, (8, 9)
    assert t.tokens.tolist() == [4, 8, 5, 9] and t.parents.tolist() == [-1, -1, 0, 1]
    assert len(d.propose(np.array([0, 2, 3]), budget=3)) == 3
    assert len(d.propose(np.array([0, 2, 3]), budget=0)) == 0
    assert len(d.propose(np.array([77]), budget=4)) == 0  # never seen


def test_exact_repeat_replays_the_answer():
    d = SSD(background=False)
    answer = list(range(10, 40))
    d.begin([1, 2, 3])
    d.update(np.array([1, 2, 3] + answer), len(answer))
    d.begin([5, 5])  # another request in between
    d.update(np.array([5, 5, 9]), 1)
    d.begin([1, 2, 3])
    t = d.propose(np.array([1, 2, 3]), budget=20)
    assert t.tokens.tolist() == answer[:20] and t.is_chain()
    d.update(np.array([1, 2, 3] + answer[:5]), 5)
    assert d.propose(np.array([1, 2, 3] + answer[:5]), 8).tokens.tolist() == answer[5:13]
    d.update(np.array([1, 2, 3] + answer[:5] + [99]), 1)  # the output diverged
    assert d._replay is None
    d.begin([1, 2])  # a prefix of a known prompt is not the same prompt
    assert d._replay is None


def test_threaded_propose_only_sees_complete_indexes():
    """One thread writes requests (rebuilds fire all the time) while another drafts;
    every drafted path must really follow the context's last token somewhere."""
    d = SSD(capacity=1 << 13, draft_len=4, rebuild_tokens=200, rebuild_seconds=0.01)
    rng = np.random.default_rng(6)
    history = []
    lock = threading.Lock()
    stop = threading.Event()

    def writer():
        wr = np.random.default_rng(7)
        while not stop.is_set() and len(history) < 60000:
            prompt = wr.integers(0, 1000, 20)
            out = np.concatenate([prompt[5:15], wr.integers(0, 1000, 30)])
            with lock:
                history.extend([-1] + prompt.tolist() + out.tolist())
            d.begin(prompt)
            d.update(np.concatenate([prompt, out]), out.size)
            time.sleep(0.002)  # about as fast as a model, so both threads get turns

    th = threading.Thread(target=writer, daemon=True)
    th.start()
    seen = []
    # at least 1.5 s of interleaving, and on until the index was rebuilt a few times (a
    # slow CPU needs longer; 20 s at most): the pauses let the index thread get the GIL
    t0 = time.monotonic()
    while time.monotonic() - t0 < 1.5 or (
        time.monotonic() - t0 < 20 and (d.indexer.builds < 3 or len(seen) <= 50)
    ):
        time.sleep(0.0005)
        with lock:
            hist = list(history)
        if len(hist) < 100:
            continue
        p = int(rng.integers(30, len(hist)))
        ctx = [t for t in hist[p - 30 : p] if t >= 0]
        tree = d.propose(np.array(ctx), 8)
        for node in range(len(tree)):
            seen.append((ctx[-1],) + tuple(tree.tokens[tree.path_to(node)].tolist()))
    stop.set()
    th.join()
    d.close()
    assert d.indexer.builds >= 3 and len(seen) > 50
    grams = {tuple(history[i : i + n]) for n in range(2, 6) for i in range(len(history))}
    bad = [s for s in seen if s not in grams]
    assert not bad, bad[:5]


def greedy_tokens(be, drafter, prompt, n, budget=8):
    steps = list(Decoder(be).steps(prompt, drafter, SamplingParams(), n, budget=budget))
    return [t for s in steps for t in s.tokens], len(steps)


@pytest.mark.parametrize("options", [{}, {"replay": False}, {"background": False, "q_min": 2}])
def test_greedy_equals_plain_and_learns_across_requests(options):
    be = FakeBackend(vocab_size=40, sharpness=4.0, seed=1, context_limit=256)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11]]
    plain = {tuple(p): greedy_tokens(be, NoDrafter(), p, 60)[0] for p in prompts}
    d = make_drafter("ssd", **options)
    assert isinstance(d, Drafter) and d.name == "ssd"
    mats = []
    for _ in range(2):
        toks, steps = 0, 0
        for p in prompts:
            got, n_steps = greedy_tokens(be, d, p, 60)
            assert got == plain[tuple(p)]
            toks, steps = toks + len(got), steps + n_steps
        mats.append(toks / steps)
    d.close()
    assert mats[1] > mats[0] * 1.3, mats


def test_sampling_equals_plain_with_same_seed():
    be = FakeBackend(vocab_size=8, sharpness=2.0)
    params = SamplingParams(temperature=0.8, top_p=0.95)
    d = SSD(background=False)
    for seed in range(4):
        plain = [
            t
            for s in Decoder(be).steps([3, 4], NoDrafter(), params, 40, seed=seed)
            for t in s.tokens
        ]
        for _ in range(2):
            got = [t for s in Decoder(be).steps([3, 4], d, params, 40, seed=seed) for t in s.tokens]
            assert got == plain


def test_save_load_and_reset(tmp_path):
    d = SSD(background=False)
    d.begin([1, 2, 3])
    d.update(np.array([1, 2, 3, 7, 8, 9]), 3)
    d.save(tmp_path / "ssd.npz", "tok")
    e = SSD(background=False)
    with pytest.raises(DraftwiseError, match="other-tok"):
        e.load(tmp_path / "ssd.npz", "other-tok")
    e.load(tmp_path / "ssd.npz", "tok")
    e.begin([1, 2, 3])  # the prompt index survived the round trip
    assert e.propose(np.array([1, 2, 3]), 8).tokens.tolist() == [7, 8, 9]
    e.reset()
    e.begin([1, 2, 3])
    assert len(e.propose(np.array([1, 2, 3]), 8)) == 0 and e.store.total == 4


def test_background_thread_is_daemon_and_closes():
    d = SSD(rebuild_tokens=1)
    d.begin([1, 2, 3])
    th = d.indexer._thread
    assert th is not None and th.daemon
    deadline = time.monotonic() + 5
    while d.indexer.builds == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert d.indexer.index.end == d.store.total
    d.close()
    assert not th.is_alive()
    d.close()  # idempotent


@pytest.mark.parametrize(
    "options, word",
    [
        ({"q_max": 0}, "q_max"),
        ({"q_min": 5, "q_max": 4}, "q_min"),
        ({"capacity": 1}, "capacity"),
        ({"max_matches": 0}, "max_matches"),
        ({"rebuild_tokens": 0}, "rebuild_tokens"),
        ({"rebuild_seconds": 0}, "rebuild_seconds"),
        ({"draft_len": 1.5}, "draft_len"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_options(options, word):
    with pytest.raises(DraftwiseError, match=word):
        make_drafter("ssd", **options)
