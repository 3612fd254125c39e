"""Saved KV prefixes in the decoding loop (``core/prefixes.py``), on the fake backend."""

from __future__ import annotations

import numpy as np

from draftwise.core.decode import Decoder
from draftwise.core.drafters import NoDrafter
from draftwise.core.prefixes import Prefixes, Snapshots
from draftwise.core.sampling import SamplingParams
from tests.fakes import FakeBackend


class SnapBackend(FakeBackend):
    def save_prefix(self, n: int) -> list[int]:
        return list(self.cache[:n])

    def load_prefix(self, snapshot: list[int], n: int) -> None:
        self.cache = list(snapshot[:n])


def run(dec: Decoder, prompt: list[int], key: object = None) -> list[int]:
    dec.prefix_key = key
    steps = dec.steps(np.array(prompt), NoDrafter(), SamplingParams(), 6)
    return [t for s in steps for t in s.tokens]


def test_a_turn_after_another_request_prefills_only_what_is_new():
    assert isinstance(SnapBackend(), Snapshots)
    rng = np.random.default_rng(0)
    conv, other = rng.integers(0, 8, 40).tolist(), rng.integers(0, 8, 30).tolist()
    plain = Decoder(FakeBackend())
    dec = Decoder(SnapBackend())
    dec.prefixes = Prefixes(1000)
    out1 = run(dec, conv, "a")
    assert dec.prefilled == 39
    run(dec, other, "b")  # the live cache now holds another key's request
    turn2 = conv + out1 + [3, 4, 5]
    assert run(dec, turn2, "a") == run(plain, turn2)
    assert dec.prefilled == 3  # the answer's last token and two new ones (the third is the root)
    run(dec, turn2, "b")
    assert dec.prefilled == len(turn2) - 1  # "a"'s conversation is not "b"'s to reuse
    for entry_bound in (len(turn2) - 1, 10):  # a small store keeps only what fits
        p = Prefixes(entry_bound)
        p.put("a", turn2[:-1], "x")
        assert len(p) == (1 if entry_bound >= len(turn2) - 1 else 0)
