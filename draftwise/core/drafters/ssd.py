"""SSD (seed 003): draft from everything this model has read and written so far.

Every request's prompt and output go into one bounded ring of tokens (``TokenStore``)
that lives as long as the drafter (the loaded model). To draft, find the earlier places
where the context's last tokens occurred, the longest such tail first (at most ``q_max``
tokens, at least ``q_min``), and propose what followed them there: the continuations of
length ``draft_len`` of at most ``max_matches`` matches (the newest), merged into a tree
ranked by how often each prefix occurred (``continuation_tree``).

Lookup is a suffix array of the store built by a background thread (``SuffixIndex``,
``BackgroundIndexer``): the longest match is one narrowing pass of binary searches, so
its cost grows with log(store size), not the size. Tokens written after the last build
are covered by a linear scan of that short tail, so this request's own text is found at
once. Drafting never waits for a rebuild.

Exact repeats: when a request's whole prompt was seen before as a prompt, the answer
given then is drafted as one long chain while the output keeps agreeing with it.

Example: the second time a prompt comes, its earlier answer is the draft::

    >>> d = SSD(background=False)
    >>> d.begin(np.array([1, 2, 3])); d.update(np.array([1, 2, 3, 7, 8, 9]), 3)
    >>> d.begin(np.array([1, 2, 3]))
    >>> d.propose(np.array([1, 2, 3]), budget=8).tokens.tolist()
    [7, 8, 9]
    >>> d.close()
"""

from __future__ import annotations

import hashlib
import os
import weakref
from dataclasses import dataclass

import numpy as np

from draftwise.core.drafters.background_index import BackgroundIndexer
from draftwise.core.drafters.continuation_tree import continuation_tree
from draftwise.core.drafters.suffix_array import SuffixIndex
from draftwise.core.drafters.token_store import TokenStore
from draftwise.core.tree import DraftTree
from draftwise.errors import DraftwiseError

# SA ranges larger than this many times max_matches are sampled evenly, not scanned
_SAMPLE_FACTOR = 16


@dataclass
class Matches:
    """Where the context's tail occurred: the match length and the logical positions of
    the last matched token (newest first), with the views needed to read what follows."""

    length: int
    ends: np.ndarray  # (m,) int64, descending
    index: SuffixIndex | None  # None when the index is stale (store reset or loaded)
    tail: np.ndarray  # (t,) the store's tokens at logical [tail_first, total)
    tail_first: int
    total: int


class SSD:
    """The SSD drafter; options are keyword arguments, see the module docstring."""

    name = "ssd"

    def __init__(
        self,
        *,
        capacity: int = 1 << 20,
        q_max: int = 16,
        q_min: int = 1,
        draft_len: int = 16,
        max_matches: int = 64,
        rebuild_tokens: int = 4096,
        rebuild_seconds: float = 30.0,
        max_tail: int = 1 << 16,
        replay: bool = True,
        background: bool = True,
    ) -> None:
        for name, value, low in (
            ("capacity", capacity, 2),
            ("rebuild_tokens", rebuild_tokens, 1),
            ("q_max", q_max, 1),
            ("q_min", q_min, 1),
            ("draft_len", draft_len, 1),
            ("max_matches", max_matches, 1),
            ("max_tail", max_tail, 1),
        ):
            if not isinstance(value, (int, np.integer)) or value < low:
                raise DraftwiseError(f"ssd {name} must be an integer >= {low}, got {value!r}")
        if not isinstance(rebuild_seconds, (int, float)) or not rebuild_seconds > 0:
            raise DraftwiseError(f"ssd rebuild_seconds must be > 0, got {rebuild_seconds!r}")
        if q_min > q_max:
            raise DraftwiseError(f"ssd q_min ({q_min}) must be <= q_max ({q_max})")
        self.q_max, self.q_min, self.draft_len = int(q_max), int(q_min), int(draft_len)
        self.max_matches, self.max_tail, self.replay = int(max_matches), int(max_tail), replay
        self.store = TokenStore(capacity)
        self.indexer = BackgroundIndexer(
            self.store, rebuild_tokens, rebuild_seconds, background, pad=self.q_max + 1
        )
        # stops the thread when the drafter is collected; the thread never refers to self
        self._finalizer = weakref.finalize(self, self.indexer.close)
        self._finalizer.atexit = False  # at exit the daemon thread just dies, no waiting
        self._prompts: dict[bytes, int] = {}  # prompt digest -> logical prompt start
        self._replay: tuple[int, int, int] | None = None  # (answer start, end, matched)

    # ----- lifecycle ----------------------------------------------------------------
    def reset(self) -> None:
        self.store.clear()
        self.indexer.reset()
        self._prompts.clear()
        self._replay = None

    def close(self) -> None:
        """Stop the background thread for good; drafting goes on from the last index
        and the tail scan (``sync_index`` still rebuilds on request)."""
        self.indexer.close()

    def sync_index(self) -> None:
        """Bring the index up to date now, in this thread (tests, after ``load``)."""
        self.indexer.sync()

    def save(self, path: str | os.PathLike[str], tokenizer_id: str) -> None:
        """Save the token store atomically as ``.npz``; see ``TokenStore.save``."""
        self.store.save(path, tokenizer_id)

    def load(self, path: str | os.PathLike[str], tokenizer_id: str) -> None:
        """Replace the store with the one saved at ``path`` for the same tokenizer."""
        self.store.load(path, tokenizer_id)
        self.indexer.reset()
        self._replay = None
        self._prompts = {}
        for start, answer, _ in self.store.records():
            self._prompts[_digest(self.store.read(start, answer))] = start
        self.indexer.notify()

    # ----- the Drafter protocol -----------------------------------------------------
    def begin(self, prompt: np.ndarray) -> None:
        prompt = np.asarray(prompt, dtype=np.int64).reshape(-1)
        key = _digest(prompt)
        self._replay = self._find_answer(key, prompt) if self.replay else None
        self.store.begin_request(prompt)
        self._prompts[key] = self.store.total - prompt.size
        if len(self._prompts) > 2 * len(self.store.records()) + 64:
            self._prune_prompts()
        self.indexer.notify()

    def update(self, context: np.ndarray, n_new: int) -> None:
        if n_new <= 0:
            return
        new = np.asarray(context[-n_new:], dtype=np.int64)
        self.store.append(new)
        if self._replay is not None:
            start, end, matched = self._replay
            lo = start + matched
            same = lo + n_new <= end and np.array_equal(self.store.read(lo, lo + n_new), new)
            self._replay = (start, end, matched + n_new) if same else None
        self.indexer.notify()

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        if budget <= 0 or context.size == 0:
            return DraftTree.empty()
        replay = self._replay
        if replay is not None:
            start, end, matched = replay
            lo, hi = start + matched, min(end, start + matched + budget)
            chain = self.store.read(lo, hi)
            if chain.size == hi - lo > 0:
                n = chain.size
                return DraftTree(chain, np.arange(-1, n - 1), np.zeros(n, np.int16))
            if chain.size != hi - lo:  # the ring overwrote the old answer meanwhile
                self._replay = None
        m = self.find(context)
        if m.length < self.q_min or m.ends.size == 0:
            return DraftTree.empty()
        conts = self._continuations(m, min(self.draft_len, budget))
        return continuation_tree(conts, m.ends, budget)

    # ----- matching -----------------------------------------------------------------
    def find(self, context: np.ndarray) -> Matches:
        """The longest tail of ``context`` (at most ``q_max`` tokens) seen before, and up
        to ``max_matches`` of its occurrences, newest first. The store's newest token is
        never a match end: it is the context's own end, with nothing after it yet. The
        text searched is the index's snapshot (tokens the ring overwrote since stay there
        until the next rebuild) followed by the store's newer tokens."""
        q = self.q_max
        ix = self.indexer.index
        pattern = np.asarray(context[-q:], dtype=np.int64)[::-1]  # (<= q,) newest first
        lo = ix.end - q if ix.epoch == self.store.epoch else 0
        tail, first, total, epoch = self.store.read_since(lo, self.max_tail)
        if ix.epoch != epoch and lo:  # the store was reset or loaded meanwhile
            tail, first, total, epoch = self.store.read_since(0, self.max_tail)
        if ix.epoch != epoch:
            ix_ok, scan_from = False, first  # stale: the tail scan covers what it can
        else:
            ix_ok, scan_from = True, max(ix.end, first)
        # matches inside the index: nested slot ranges, deepest = longest
        ranges = ix.narrow(pattern) if ix_ok else []
        own = ix_ok and ix.end == total  # the index holds the context's own end
        while ranges:
            lo, hi = ranges[-1]
            if hi - lo - int(own and lo <= ix.newest_slot < hi) > 0:
                break
            ranges.pop()
        # matches in the tail: ends at logical [scan_from, total - 1)
        t_ends, t_lens = _scan_tail(tail, first, scan_from, total - 1, pattern, q)
        length = max(len(ranges), int(t_lens.max()) if t_lens.size else 0)
        k = self.max_matches
        ends = t_ends[t_lens >= length][::-1][:k] if length else t_ends[:0]
        if length and len(ranges) == length and ends.size < k:
            lo, hi = ranges[-1]
            ends = np.concatenate([ends, self._index_ends(ix, lo, hi, total, k - ends.size)])
        return Matches(length, ends, ix if ix_ok else None, tail, first, total)

    def _index_ends(self, ix: SuffixIndex, lo: int, hi: int, total: int, k: int) -> np.ndarray:
        """The newest ``k`` match ends among slots ``[lo, hi)``; a huge range (a
        degenerate store) is sampled evenly first so a step stays cheap."""
        limit = _SAMPLE_FACTOR * self.max_matches
        if hi - lo > limit:
            slots = lo + (np.arange(limit, dtype=np.int64) * (hi - lo)) // limit
            ends = ix.end - 1 - ix.sa[slots].astype(np.int64)
        else:
            ends = ix.match_ends(lo, hi)
        ends = ends[ends != total - 1]  # the context's own end
        if ends.size > k:
            ends = ends[np.argpartition(-ends, k - 1)[:k]]
        return np.sort(ends)[::-1]

    def _continuations(self, m: Matches, w: int) -> np.ndarray:
        """(matches, w) tokens after each match, ``-1`` from a separator or the end on."""
        pos = m.ends[:, None] + np.arange(1, w + 1)  # (m, w) logical positions
        ix = m.index
        # the tail holds [tail_first, total); the index, when current, what lies before
        tail_lo = m.tail_first if ix is None else max(m.tail_first, ix.end)
        if m.tail.size:  # gathers clipped into range; the mask keeps the valid cells
            in_tail = (pos >= tail_lo) & (pos < m.total)
            out = np.where(in_tail, m.tail.take(pos - m.tail_first, mode="clip"), np.int64(-1))
        else:
            out = np.empty(pos.shape, np.int64)
            out.fill(-1)
        if ix is not None:
            in_ix = pos < ix.end
            if in_ix.any():
                out = np.where(in_ix, ix.rev.take(ix.end - 1 - pos, mode="clip"), out)
        out[np.logical_or.accumulate(out < 0, axis=1)] = -1  # never cross a separator
        return out

    # ----- exact repeats ------------------------------------------------------------
    def _find_answer(self, key: bytes, prompt: np.ndarray) -> tuple[int, int, int] | None:
        start = self._prompts.get(key)
        rec = self.store.record_at(start) if start is not None else None
        if rec is None or rec[2] < 0:
            return None
        p_start, a_start, end = rec
        if not np.array_equal(self.store.read(p_start, a_start), prompt):
            return None  # overwritten since, or a digest collision
        return (a_start, end, 0) if end > a_start else None

    def _prune_prompts(self) -> None:
        held = {r[0] for r in self.store.records()}
        self._prompts = {k: v for k, v in self._prompts.items() if v in held}


def _digest(tokens: np.ndarray) -> bytes:
    return hashlib.blake2b(np.asarray(tokens, "<i8").tobytes(), digest_size=16).digest()


def _scan_tail(
    tail: np.ndarray, first: int, lo: int, hi: int, pattern: np.ndarray, q: int
) -> tuple[np.ndarray, np.ndarray]:
    """Ends (logical, ascending) in ``[lo, hi)`` where ``tail`` (logical ``first`` on)
    matches ``pattern`` (the context's tail, newest first) backwards, and match lengths.

    Example: tail ``[5, 6, 9, 5, 6]``, pattern ``(6, 5)``: ends 1 and 4, both length 2.
    """
    if pattern.size == 0 or hi <= lo:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    local = (tail[lo - first : hi - first] == pattern[0]).nonzero()[0]
    if local.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    local += lo - first
    back = local[:, None] - np.arange(q)  # (c, q) tail indices, newest first
    vals = np.where(back >= 0, tail[np.maximum(back, 0)], -2)
    pat = np.empty(q, np.int64)
    pat.fill(-3)  # a short context matches nothing past its start
    pat[: pattern.size] = pattern
    eq = np.empty((local.size, q + 1), bool)  # a last False column: a full match's length is q
    eq[:, q] = False
    np.equal(vals, pat, out=eq[:, :q])
    lens = eq.argmin(axis=1)  # (c,) the first mismatch
    local += first
    return local, lens
