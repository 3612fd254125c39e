"""The decoding loop: draft, verify in one forward, accept, commit, repeat.

``Decoder`` owns one backend and remembers which tokens its KV cache holds, so a chat's
next turn only prefills what is new. ``Decoder.steps`` is a generator of ``Step``
objects (the tokens emitted by each verification pass); apps build text on top.

Invariant, kept even when the caller stops early or an exception flies: after the
generator finishes, the cache holds exactly ``sequence[:-1]`` of the tokens the caller
was given (the last one is the uncached root), so the next call can reuse it.

Example with plain greedy decoding (``NoDrafter``)::

    dec = Decoder(backend)
    for step in dec.steps(prompt_ids, NoDrafter(), SamplingParams(), max_tokens=16):
        print(step.tokens)          # one token per step without a drafter
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from draftwise.core.acceptance import accept, accept_greedy
from draftwise.core.backend import Backend, Overlapping, SamplingVerifier
from draftwise.core.batch import BatchDrafter, BatchVerifier, accept_batch, check_drafts
from draftwise.core.drafters.base import Background, CostObserver, Drafter, PathAware
from draftwise.core.prefixes import Prefixes, Snapshots
from draftwise.core.sampling import SamplingParams, next_token, recent_windows
from draftwise.core.threads import ThreadTunable, ThreadTuner
from draftwise.core.tree import DraftTree
from draftwise.errors import DraftwiseError


@dataclass
class Step:
    """One verification pass."""

    tokens: list[int]  # emitted this step: accepted draft tokens, then the bonus token
    accepted: int  # how many drafted tokens were accepted (before truncation)
    drafted: int  # nodes in the verified tree
    draft_s: float  # time to build the tree
    verify_s: float  # time of the forward pass, acceptance and cache commit
    finish_reason: str | None = None  # "stop", "length" or None while running
    beam: tuple[int, int] | None = None  # (width, length) of a beam drafter's beams


# A draft tree's node cap (``budget``) may not exceed this: a verify step carries
# ``1 + budget`` rows, and the decoder allocates per-step arrays of that size.
MAX_BUDGET = 4096
# No request may ask for more tokens than this (16.7 M, beyond any model's context): a
# larger ``max_tokens`` is a mistake, not a long generation. Up to it, generation simply
# stops at the context's end (finish reason "length").
MAX_TOKENS = 1 << 24


def check_prompt(n_prompt: int, limit: int) -> None:
    """Refuse a prompt that leaves no room to generate in a context of ``limit`` tokens
    (one line naming both).

    Example::

        >>> check_prompt(9031, 8192)
        Traceback (most recent call last):
        ...
        draftwise.errors.DraftwiseError: the prompt has 9031 tokens; the model's context limit is 8192
    """
    if n_prompt >= limit:
        raise DraftwiseError(
            f"the prompt has {n_prompt} tokens; the model's context limit is {limit}"
        )


def check_request(max_tokens: int, budget: int) -> None:
    """Refuse (one line naming the value) sizes no generation could use, before anything
    is allocated. A ``max_tokens`` beyond the context *left* after a prompt is fine:
    generation stops at the context's end, and the decoder allocates for what fits.

    Example::

        >>> check_request(10**12, 16)
        Traceback (most recent call last):
        ...
        draftwise.errors.DraftwiseError: max_tokens must be at most 16777216, got 1000000000000
    """
    _check_int("max_tokens", max_tokens, 1, MAX_TOKENS)
    _check_int("draft budget", budget, 0, MAX_BUDGET)


def _check_int(what: str, value: object, lo: int, hi: int) -> None:
    """``value`` is an integer in ``lo..hi``, else one line naming ``what`` and it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise DraftwiseError(f"{what} must be an integer, got {value!r}")
    if value < lo:
        raise DraftwiseError(f"{what} must be >= {lo}, got {value}")
    if value > hi:
        raise DraftwiseError(f"{what} must be at most {hi}, got {value}")


def common_prefix(a: list[int], b: np.ndarray) -> int:
    """Length of the longest common prefix of ``a`` and ``b``."""
    n = min(len(a), b.size)
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n], np.int64) != b[:n])
    return int(diff[0]) if diff.size else n


class Decoder:
    """Runs speculative (or plain) decoding on one backend."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.cached: list[int] = []  # the tokens the backend's cache holds, in order
        self.prefilled = 0  # prompt tokens the last generation computed (the rest reused)
        self._device_sampling = False  # this generation samples every row on the device
        # Saved cache prefixes (off unless set; see core/prefixes.py), looked up under
        # ``prefix_key``; with a store, another key's live cache is never reused either.
        self.prefixes: Prefixes | None = None
        self.prefix_key: object = None
        self._owner: object = None  # the key whose generation filled the live cache
        # the kernels' thread count, re-chosen from the steps' own timings (threads.py)
        self.threads: ThreadTuner | None = None

    def reset(self) -> None:
        self.backend.reset()
        self.cached = []

    def _prefill(self, prompt: np.ndarray) -> None:
        """Bring the cache to ``prompt[:-1]``, reusing the longest cached prefix."""
        # Trust only what the backend still holds: a caller that reset or trimmed the
        # backend directly (a profile measurement, a table build, a test) shortened it.
        self.cached = self.cached[: self.backend.cache_len]
        keep = common_prefix(self.cached, prompt[:-1])
        if self.prefixes is not None and isinstance(self.backend, Snapshots):
            if self._owner != self.prefix_key:
                keep = 0
            n, snapshot = self.prefixes.best(self.prefix_key, prompt[:-1])
            if n > keep:
                self.backend.load_prefix(snapshot, n)
                self.cached, keep = prompt[:n].tolist(), n
            self._owner = self.prefix_key
        if keep < self.backend.cache_len:
            self.backend.trim(keep)
        self.cached = self.cached[:keep]
        self.prefilled = max(0, prompt.size - 1 - keep)
        if prompt.size - 1 > keep:
            self.backend.prefill(prompt[keep:-1])
        self.cached = prompt[:-1].tolist()

    def steps(
        self,
        prompt: np.ndarray | list[int],
        drafter: Drafter,
        params: SamplingParams,
        max_tokens: int,
        *,
        seed: int | None = None,
        stop_ids: frozenset[int] = frozenset(),
        budget: int = 16,
    ) -> Iterator[Step]:
        """Generate up to ``max_tokens`` tokens after ``prompt``; yields one Step per pass.

        ``budget`` caps the draft tree's nodes. Generation ends after a token in
        ``stop_ids`` (which is emitted) or after ``max_tokens`` tokens.
        """
        prompt = np.asarray(prompt, dtype=np.int64).reshape(-1)
        limit = self.backend.context_limit
        if prompt.size == 0:
            raise DraftwiseError("the prompt is empty: give at least one token of input")
        check_request(max_tokens, budget)
        check_prompt(prompt.size, limit)
        # The context edge, one rule for every drafter: prompt and output together hold at
        # most ``limit`` tokens (the last one is never fed), so a step may emit at most
        # ``limit - n`` more and a tree is capped below that (``cap`` below); plain and
        # speculative decoding stop at the same token.
        max_tokens = min(max_tokens, limit - prompt.size)
        # One uniform per emitted token, keyed by its position: the token at absolute
        # position prompt.size + e is drawn at u[e], whichever step and tree row emits it
        # (the same draws, in the same order, as one rng.random() per token).
        uniforms = np.random.default_rng(seed).random(max_tokens + budget + 2)
        seq = np.empty(prompt.size + max_tokens + budget + 1, np.int64)
        seq[: prompt.size] = prompt
        n = prompt.size  # tokens in seq; seq[n-1] is the uncached root
        emitted = 0
        if isinstance(drafter, PathAware):
            # auto: the sampling path's cost curve. Before the prefill: measuring it on
            # first use drives (and resets) the backend.
            drafter.plan_for(params.needs_logits)
        self._tune_threads()
        self._prefill(prompt)
        drafter.begin(prompt)
        batched = self._use_batch(drafter, params)  # fixed for the generation
        node_cap = getattr(self.backend, "max_tree_nodes", None)
        # bookkeeping that does not decide the next draft: once a step, inside the
        # verify while the device works where the backend overlaps, else right after it
        ran = [False]
        background = drafter.background if isinstance(drafter, Background) else None

        def in_background() -> None:
            if background is not None and not ran[0]:
                ran[0] = True
                background()

        hooked = background is not None and isinstance(self.backend, Overlapping)
        # protocol checks once, not per step (each isinstance on a runtime-checkable
        # protocol walks its attributes: ~10 us)
        observer = not batched and isinstance(drafter, CostObserver)
        self._device_sampling = (params.needs_logits and isinstance(self.backend, SamplingVerifier)
                                 and self.backend.device_sampling)
        if hooked:
            self.backend.while_waiting = in_background  # type: ignore[union-attr]
        try:
            while True:
                ran[0] = False
                room = limit - self.backend.cache_len - 1  # rows left after the root
                cap = max(0, min(budget, room, max_tokens - emitted - 1))
                if node_cap is not None:  # a backend of fixed-shape steps (CUDA graphs)
                    cap = min(cap, node_cap)
                threads = self.threads.current() if self.threads is not None else None
                if threads is not None:
                    self.backend.set_kernel_threads(threads)  # type: ignore[attr-defined]
                t0 = time.perf_counter()
                if batched:
                    drafts = check_drafts(drafter.propose_batch(seq[:n], cap))  # type: ignore[attr-defined]
                    drafts = drafts[:, : min(drafts.shape[1], room, max_tokens - emitted - 1)]
                    t1 = time.perf_counter()
                    accepted, n_drafted = self._verify_batch(int(seq[n - 1]), drafts)
                    beam = None
                    new = accepted
                    n_acc = len(accepted) - 1
                else:
                    tree = drafter.propose(seq[:n], cap)
                    t1 = time.perf_counter()
                    beam = getattr(drafter, "last_beam", None)
                    path, bonus = self._verify(seq[:n], tree, params, uniforms[emitted:])
                    new = [int(t) for t in tree.tokens[path]] + [bonus]
                    n_acc, n_drafted = len(path), len(tree)
                t2 = time.perf_counter()
                in_background()  # (a no-op where the verify ran it)
                if observer:  # auto: costs learnt live
                    drafter.observe_verify(n_drafted + 1, n - 1, (t2 - t1) * 1e3)
                if threads is not None:
                    self.threads.record(threads, n_drafted + 1, (t2 - t1) * 1e3)  # type: ignore[union-attr]
                cut = len(new)
                finish = None
                for i, tok in enumerate(new):
                    if tok in stop_ids:
                        cut, finish = i + 1, "stop"
                        break
                if finish is None and emitted + cut >= max_tokens:
                    cut, finish = max_tokens - emitted, "length"  # or the context is full
                new = new[:cut]
                seq[n : n + cut] = new
                n += cut
                emitted += cut
                drafter.update(seq[:n], cut)
                yield Step(new, n_acc, n_drafted, t1 - t0, t2 - t1, finish, beam)
                if finish is not None:
                    return
        finally:
            if hooked:
                self.backend.while_waiting = None  # type: ignore[union-attr]
            if self.threads is not None:  # what else runs in this thread gets torch's count
                self.backend.set_kernel_threads(None)  # type: ignore[attr-defined]
            # the cache may hold rows past what was emitted (truncation, early stop)
            keep = min(self.backend.cache_len, n - 1)
            self.backend.trim(keep)
            self.cached = seq[:keep].tolist()
            if self.prefixes is not None and isinstance(self.backend, Snapshots) and keep:
                self.prefixes.put(self.prefix_key, self.cached, self.backend.save_prefix(keep))

    def _tune_threads(self) -> None:
        """A tuner for the backend's thread counts as they are now (a caller may have
        changed torch's count since: then its choice starts afresh)."""
        counts = self.backend.thread_counts if isinstance(self.backend, ThreadTunable) else ()
        if len(counts) < 2:
            self.threads = None
        elif self.threads is None or self.threads.counts != tuple(dict.fromkeys(counts)):
            self.threads = ThreadTuner(counts)

    def _use_batch(self, drafter: Drafter, params: SamplingParams) -> bool:
        """The batched path: greedy decoding, a drafter with a (k, w) matrix, a backend
        that verifies batches, and the drafter's ``verify`` mode (``auto`` = the
        backend's measured default)."""
        if params.needs_logits or not isinstance(drafter, BatchDrafter):
            return False
        if not isinstance(self.backend, BatchVerifier):
            return False
        return drafter.verify == "batch" or (drafter.verify == "auto" and self.backend.batch_by_default)

    def _verify_batch(self, root: int, drafts: np.ndarray) -> tuple[list[int], int]:
        """One batched forward; commits the best row. Returns (emitted tokens, drafted)."""
        backend = self.backend
        assert isinstance(backend, BatchVerifier)
        if drafts.shape[0] == 0 or drafts.shape[1] == 0:
            drafts = np.zeros((1, 0), np.int64)  # a plain step: one row, the root alone
        argmax = backend.verify_batch(root, drafts)
        row, n_acc, bonus = accept_batch(drafts, argmax)
        backend.commit_batch(row, n_acc + 1)
        return [int(t) for t in drafts[row, :n_acc]] + [bonus], int(drafts.size)

    def _verify(
        self, context: np.ndarray, tree: DraftTree, params: SamplingParams, u: np.ndarray
    ) -> tuple[list[int], int]:
        """One forward pass over the tree; commits the accepted path to the cache. ``u``:
        the uniforms of this step's tokens, ``u[d]`` for the token at depth ``d``."""
        backend = self.backend
        if params.needs_logits and self._device_sampling:
            # every row sampled on the device; descend as greedy over the sampled tokens
            window = params.repetition_context
            recent = recent_windows(context, tree.tokens, tree.parents, tree.depth, window)
            rows_u = u[tree.verify_positions()]  # (N+1,) row r emits the token at its depth
            sampled = backend.verify_sampled(int(context[-1]), tree, params, rows_u, recent)
            path, bonus = accept_greedy(tree, sampled)
        else:
            path, bonus = self._verify_host(context, tree, params, u)
        backend.commit(np.asarray([0] + [p + 1 for p in path], dtype=np.int64))
        return path, bonus

    def _verify_host(
        self, context: np.ndarray, tree: DraftTree, params: SamplingParams, u: np.ndarray
    ) -> tuple[list[int], int]:
        """The forward, then acceptance on the host (argmax, or each row's logits)."""
        out = self.backend.verify(int(context[-1]), tree, need_logits=params.needs_logits)
        if not params.needs_logits:
            return accept_greedy(tree, out.argmax)
        window = params.repetition_context
        sample = out.sample  # the backend's compiled next_token, where it has one
        # (read only without it: a backend may make the float32 copy on first read)
        logits = out.logits if sample is None else None
        assert sample is not None or logits is not None  # the backend contract, not user input

        def emit(row: int, path: list[int]) -> int:
            recent = context[:0]  # repetition_context == 0: no penalty window
            if window:
                recent = np.concatenate([context[-window:], tree.tokens[path]])[-window:]
            if sample is not None:
                return sample(row, recent, params, float(u[len(path)]))
            assert logits is not None
            return next_token(logits[row], recent, params, float(u[len(path)]))

        return accept(tree, emit)
