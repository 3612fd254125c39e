"""``draftwise.Session``: queued thread-safe generation, cancellation, stop strings, state files."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from draftwise.core.decode import common_prefix
from draftwise.core.drafters import NoDrafter
from draftwise.errors import DraftwiseError
from draftwise.session import CancelToken, Persistent, StopText

A = "Name three primes."
B = "List the planets of the solar system in order, with one fact about each planet."


@pytest.mark.parametrize(
    "pieces, stops, shown, stopped",
    [
        (["abc E", "ND more"], ["END"], "abc ", True),
        (["a", "b", "c"], ["x"], "abc", False),
        (["hello wor", "ld!"], ["world", "lo w"], "hel", True),
        (["E", "N", "X"], ["END"], "ENX", False),  # a false start is released
    ],
)
def test_stop_text(pieces, stops, shown, stopped):
    s = StopText(stops)
    out = "".join(s.feed(p) for p in pieces) + s.flush()
    assert (out, s.stopped) == (shown, stopped)


def test_stop_text_rejects_empty():
    with pytest.raises(DraftwiseError, match="''"):
        StopText([""])


class SavingDrafter(NoDrafter):
    """A drafter with persistence, as the Persistent protocol describes."""

    name = "saving"

    def __init__(self) -> None:
        self.loaded: str | None = None

    def save(self, path, tokenizer_id: str) -> None:
        Path(path).write_text(tokenizer_id)

    def load(self, path, tokenizer_id: str) -> None:
        if Path(path).read_text() != tokenizer_id:
            raise DraftwiseError(f"'{path}' was saved with another tokenizer")
        self.loaded = tokenizer_id


def test_persistent_protocol():
    assert isinstance(SavingDrafter(), Persistent)
    assert not isinstance(NoDrafter(), Persistent)


@pytest.fixture(scope="module")
def session(torch_model):
    from draftwise import Session

    s = Session(torch_model)
    yield s
    s.close()


@pytest.fixture(scope="module")
def answers(session):
    return {p: session.generate(p, max_tokens=12) for p in (A, B)}


def consistent(model) -> bool:
    return model.backend.cache_len == len(model.decoder.cached)


@pytest.mark.torch
def test_two_threads_equal_single_thread(session, answers):
    got: dict[str, str] = {}
    barrier = threading.Barrier(2)

    def work(prompt: str) -> None:
        barrier.wait()
        got[prompt] = session.generate(prompt, max_tokens=12)

    threads = [threading.Thread(target=work, args=(p,)) for p in (A, B)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert got == answers
    assert not session.busy and consistent(session.model)


@pytest.mark.torch
def test_cancel_mid_stream_keeps_cache_consistent(session, answers):
    token = CancelToken()
    seen = []
    for r in session.stream(B, cancel=token, max_tokens=200):
        seen.append(r)
        if len(seen) == 2:
            token.cancel()
    assert len(seen) == 2 and seen[-1].finish_reason is None
    assert consistent(session.model) and not session.busy
    assert session.generate(A, max_tokens=12) == answers[A]
    session.model.decoder.reset()  # a fresh cache gives the same answer
    assert session.generate(A, max_tokens=12) == answers[A]


@pytest.mark.torch
def test_close_iterator_and_session_cancel(session, answers):
    stream = session.stream(B, max_tokens=200)
    next(stream)
    assert session.busy
    stream.close()  # the caller stops early
    assert not session.busy and consistent(session.model)

    pieces: list[str] = []

    def on_token(r) -> None:
        pieces.append(r.text)
        if len(pieces) == 3:  # another thread (a UI's stop button) cancels
            t = threading.Thread(target=session.cancel)
            t.start()
            t.join()

    text = session.generate(B, max_tokens=200, on_token=on_token)
    assert len(pieces) == 3 and text == "".join(pieces)
    assert session.generate(B, max_tokens=12) == answers[B]


@pytest.mark.torch
def test_stop_string_trims(session, answers):
    word = answers[B].split()[2]
    text = session.generate(B, max_tokens=12, stop=[word])
    assert text == answers[B][: answers[B].index(word)]


@pytest.mark.torch
def test_save_load_and_close(default_model_dir, tmp_path):
    pytest.importorskip("torch")
    import draftwise
    from draftwise import Session

    model = draftwise.load(default_model_dir, backend="torch", dtype="float32")
    model.drafters["saving"] = SavingDrafter()
    s = Session(model, cache_dir=tmp_path)
    assert s.save() == [tmp_path / "saving.drafter"]
    (tmp_path / "bad.drafter").write_text("x")  # an unknown drafter name is skipped
    s.close()
    model.drafters["saving"] = fresh = SavingDrafter()
    s2 = Session(model, cache_dir=tmp_path)
    assert fresh.loaded == model.tokenizer.identity() and s2.load_errors == []
    s2.close()
    with pytest.raises(DraftwiseError, match="closed"):
        s2.generate(A, max_tokens=2)


@pytest.mark.torch
def test_remote_options_are_checked_before_anything_runs(session):
    """A client's drafter spec: registry names and remote-safe options only, no asset
    built inside a request, a bounded budget; the session's own drafter is always fine."""
    session.check_remote({})  # the session's default drafter
    session.check_remote({"drafter": "cacheback:fl=2", "budget": 64})
    bad = [
        ({"drafter": "ssd:capacity=536870912"}, "cannot be set by a request"),
        ({"drafter": "cacheback:frozen_path=/etc/shadow"}, "cannot be set by a request"),
        ({"drafter": "cacheback:zz=1"}, "unknown option 'zz'"),
        ({"budget": 65}, "budget must be an integer in 0..64"),
        ({"drafter": 3}, "must be a spec string"),
    ]
    if not session.model.assets.ready("bigram_table"):
        bad.append(({"drafter": "ngrammys"}, "bigram table is not built"))
    for opts, words in bad:
        with pytest.raises(DraftwiseError, match=words):
            session.stream("hi", remote=True, **opts)
    assert not session.busy
    # the same options from the app itself (not remote) are the app's own business
    assert session.generate("Say hi.", drafter="cacheback:fl=2", max_tokens=2, remote=False)


@pytest.mark.torch
def test_model_refuses_a_second_live_generation(torch_model, session, answers):
    import draftwise

    first = draftwise.stream_generate(torch_model, B, max_tokens=50, drafter="none")
    next(first)
    second = draftwise.stream_generate(torch_model, A, max_tokens=12, drafter="none")
    with pytest.raises(DraftwiseError, match="already generating"):
        next(second)
    first.close()  # the first one ends: the model is free again
    assert consistent(torch_model)
    assert draftwise.generate(torch_model, A, max_tokens=12, drafter="auto") == answers[A]
    assert session.generate(A, max_tokens=12) == answers[A]


SECRET = "The vault code of Zorbulax is 7-4-1-9-3-3-8, written on the blue tile."


@pytest.mark.torch
def test_states_keep_drafters_apart(torch_model):
    """What the drafters learn under one state id never drafts under another: each id
    has its own drafter objects (checked through SSD's token store), at most
    ``max_states`` of them, least recently used dropped."""
    from draftwise import Session

    s = Session(torch_model, max_states=2)
    shared_before = dict(torch_model.drafters)
    ids_a = torch_model.encode_prompt(SECRET)
    for _ in range(2):
        s.generate(SECRET, state="key-0", drafter="ssd", max_tokens=8)
    s.generate("Name three primes.", state="key-1", drafter="ssd", max_tokens=8)
    ssd_a = s._states["key-0"]["ssd"]
    ssd_b = s._states["key-1"]["ssd"]
    assert ssd_a is not ssd_b and torch_model.drafters == shared_before
    assert len(ssd_a.store.records()) == 2 and len(ssd_b.store.records()) == 1

    def holds(store, ids) -> bool:
        tokens = store.snapshot()[0].tolist()
        k = len(ids)
        return any(tokens[i : i + k] == ids for i in range(len(tokens) - k + 1))

    ids_b = torch_model.encode_prompt("Name three primes.")
    shared = common_prefix(ids_a, np.asarray(ids_b))  # the chat template's system part
    secret = ids_a[shared : shared + 12]
    assert holds(ssd_a.store, secret) and not holds(ssd_b.store, secret)
    # B sends A's text: it drafts from its own store only (no replay of A's answer)
    r = list(s.stream(SECRET, state="key-1", drafter="ssd", max_tokens=8))
    fresh = list(s.stream(SECRET, state="key-2", drafter="ssd", max_tokens=8))  # evicts key-0
    assert [x.from_draft for x in r] == [x.from_draft for x in fresh]
    assert list(s._states) == ["key-1", "key-2"]


def test_invariant_reaches_session_chat_and_serve(monkeypatch):
    import draftwise.api
    import draftwise.session
    from draftwise.apps import chat, serve

    seen: list[object] = []

    def fake_load(model, backend="auto", dtype=None, invariant="auto"):
        seen.append(invariant)
        raise SystemExit("stop here")

    monkeypatch.setattr(draftwise.api, "load", fake_load)
    for module, flag in [(chat, "--invariant"), (serve, "--no-invariant")]:
        args = module.setup_arg_parser().parse_args([flag])
        with pytest.raises(SystemExit):
            module.main(args)
    with pytest.raises(SystemExit):
        draftwise.session.Session(invariant=True)
    assert seen == [True, False, True]


@pytest.mark.torch
def test_saved_prefixes_survive_interleaved_requests(torch_model):
    """With saved prefixes, a conversation's next turn prefills only the new turn even
    after another key's request replaced the live cache; another key never reuses it;
    the answers equal those decoded from an empty cache."""
    from draftwise import Session

    dec = torch_model.decoder
    s = Session(torch_model, keep_prefixes=4096)
    try:
        turn1 = [{"role": "user", "content": A}]
        ans1 = s.generate(turn1, state="k0", max_tokens=8, drafter="none")
        s.generate(B, state="k1", max_tokens=8, drafter="none")  # the live cache is now B's
        turn2 = turn1 + [
            {"role": "assistant", "content": ans1},
            {"role": "user", "content": "And two more?"},
        ]
        n1, n2 = len(torch_model.encode_prompt(turn1)), len(torch_model.encode_prompt(turn2))
        got = s.generate(turn2, state="k0", max_tokens=8, drafter="none")
        assert dec.prefilled <= n2 - n1 - 8 + 4  # the new turn (+ the answer's last token)
        other = s.generate(turn2, state="k1", max_tokens=8, drafter="none")
        ids_b, ids2 = torch_model.encode_prompt(B), torch_model.encode_prompt(turn2)
        own = common_prefix(ids_b, np.asarray(ids2))  # the chat template's system part
        assert dec.prefilled == n2 - 1 - own  # k1 reuses its own B prompt, not k0's turns
    finally:
        dec.prefixes, dec.prefix_key = None, None
    dec.reset()
    assert got == other == s.generate(turn2, max_tokens=8, drafter="none")
