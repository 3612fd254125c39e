"""CARD on one machine (seed 002): the draft model keeps growing the candidate cache in a
worker thread while the target verifies; the target queries the cache, and the worker
corrects it with what the target emitted.

Query-and-correct, as threads:

- the *worker* owns the draft model and the ``CandidateCache``. It loops: take the
  newest context the target posted (if any) and correct the cache with it (a miss
  restarts from the target's token), grow one layer (one draft forward), publish an
  immutable ``Snapshot``. When the cache is full (depth or node limit) it sleeps until
  the next post.
- the *target* (the decoding loop) never waits for the worker: ``propose`` reads the
  latest snapshot (one reference), walks the tokens emitted since its root and takes
  the best subtree within the budget (empty on a miss: a plain step); ``update`` posts
  the new context. The only lock guards the post box and is never held across a
  forward.

Drafting changes what is verified, never what is emitted: acceptance is exact for any
tree, so the output equals plain decoding whatever the worker's timing.

Example::

    card = CardDrafter(lm, beam=8, topk=4, depth=8)
    try:
        for step in decoder.steps(prompt, card, SamplingParams(), max_tokens=64):
            ...
    finally:
        card.close()          # stops and joins the worker (also when garbage collected)
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from draftwise.core.draft_lm import DraftLM
from draftwise.core.drafters.candidate_cache import CandidateCache, Snapshot
from draftwise.core.tree import DraftTree
from draftwise.errors import DraftwiseError

if TYPE_CHECKING:  # at run time only passed in: core.draftplan imports the drafters' package
    from draftwise.core.draftplan import DraftPlanner

VERIFY = ("tree", "chain")  # the target verifies the best subtree, or CARD's best path


class _Worker:
    """The draft thread and everything it shares with the target (the post box)."""

    def __init__(self, lm: DraftLM, make_cache: Callable[[], CandidateCache],
                 thread_init: Callable[[], None] | None,
                 on_forward: Callable[[], None] | None) -> None:
        self.lm, self.make_cache = lm, make_cache
        self.thread_init, self.on_forward = thread_init, on_forward
        self.correct = True  # False: the ablation of seed 002 Table 2 (no correction)
        self.cv = threading.Condition()
        self.posted: np.ndarray | None = None  # newest context from the target
        self.reset_asked = False
        self.stopping = False
        self.error: BaseException | None = None
        self.snapshot: Snapshot | None = None  # replaced whole, never mutated
        self.forwards = self.hits = self.misses = 0
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        with self.cv:
            if self.thread is not None and self.thread.is_alive():
                return
            self.stopping = False
            self.thread = threading.Thread(target=self.run, name="draftwise-card", daemon=True)
            self.thread.start()

    def post(self, context: np.ndarray | None, reset: bool = False) -> None:
        with self.cv:
            if reset:
                self.reset_asked, self.posted, self.snapshot = True, None, None
            if context is not None:
                self.posted = np.array(context, np.int64)
            self.cv.notify()

    def stop(self) -> None:
        with self.cv:
            self.stopping = True
            self.cv.notify()
            thread, self.thread = self.thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def run(self) -> None:
        try:
            if self.thread_init is not None:
                self.thread_init()
            cache: CandidateCache | None = None
            growable = False
            while True:
                with self.cv:
                    while not (self.stopping or self.reset_asked or growable
                               or self.posted is not None):
                        self.cv.wait()
                    if self.stopping:
                        return
                    context, self.posted = self.posted, None
                    reset, self.reset_asked = self.reset_asked, False
                if reset:
                    self.lm.reset()
                    cache = None
                if context is not None:
                    cache = cache or self.make_cache()
                    if not self.correct and cache.context is not None \
                            and cache.snapshot().find(context) >= 0:
                        pass  # ablation "query, don't correct": keep growing the old tree
                    elif cache.sync(self.lm, context):
                        self.hits += 1
                    else:
                        self.misses += 1
                    self.snapshot = cache.snapshot()
                if cache is not None and cache.can_grow(self.lm):
                    if self.on_forward is not None:
                        self.on_forward()
                    cache.grow(self.lm)
                    self.forwards += 1
                    self.snapshot = cache.snapshot()
                growable = cache is not None and cache.can_grow(self.lm)
        except BaseException as exc:  # handed to the target's next propose
            self.error = exc


class CardDrafter:
    """CARD's query-and-correct drafting with a worker thread; see the module docstring.

    ``verify="chain"`` hands the target CARD's best path instead of the best subtree;
    ``correct=False`` is the paper's ablation (the cache is queried, never corrected
    while the target's tokens stay inside it; a miss still restarts it).

    ``thread_init`` runs first in the worker (e.g. to give torch one thread there);
    ``on_forward`` runs before each draft forward (tests inject random delays with it).
    """

    name = "card"

    def __init__(
        self,
        lm: DraftLM,
        beam: int = 8,
        topk: int = 4,
        depth: int = 8,
        max_nodes: int = 512,
        verify: str = "tree",
        correct: bool = True,
        thread_init: Callable[[], None] | None = None,
        on_forward: Callable[[], None] | None = None,
        planner: DraftPlanner | None = None,
    ) -> None:
        CandidateCache(beam, topk, depth, max_nodes)  # checks the options now
        if verify not in VERIFY:
            raise DraftwiseError(f"card verify must be one of {', '.join(VERIFY)}, got {verify!r}")
        self.lm = lm
        self.planner = planner  # auto: the subtree budget per step (parallel cost model)
        self.chain = verify == "chain"
        self.layout = "draft worker: own thread"  # refined by the builder, for the bench
        self._worker = _Worker(
            lm, lambda: CandidateCache(beam, topk, depth, max_nodes), thread_init, on_forward
        )
        self._worker.correct = correct
        # A drafter dropped without close() still stops its worker.
        self._finalizer = weakref.finalize(self, self._worker.stop)
        self.last_probs = np.zeros(0)

    def _check(self) -> None:
        err = self._worker.error
        if err is not None:
            raise DraftwiseError(f"the CARD draft worker failed: {err!r}") from err

    def reset(self) -> None:
        """Forget the cache; after a worker error, the next ``begin`` starts a new one."""
        if self._worker.error is not None and not self.worker_alive:
            self._worker.error = None
        if self.planner is not None:
            self.planner.reset()
        self._worker.post(None, reset=True)

    def begin(self, prompt: np.ndarray) -> None:
        self._check()
        if self.planner is not None:
            self.planner.begin()
        self._worker.start()
        self._worker.post(prompt)

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        self._check()
        snap = self._worker.snapshot
        if snap is None:
            return DraftTree.empty()
        context = np.asarray(context, np.int64)
        if self.planner is not None:
            budget = self.planner.plan(context.size, budget).budget
        tree, self.last_probs = snap.query(context, budget, self.chain)
        if self.planner is not None:
            self.planner.record(tree, context.size)
        return tree

    def update(self, context: np.ndarray, n_new: int) -> None:
        self._worker.post(context)
        if self.planner is not None:
            self.planner.update(np.asarray(context, np.int64))

    def close(self) -> None:
        """Stop and join the worker; a later ``begin`` starts a new one."""
        self._worker.stop()

    @property
    def worker_alive(self) -> bool:
        thread = self._worker.thread
        return thread is not None and thread.is_alive()

    def stats(self) -> dict[str, int]:
        w = self._worker
        plan = self.planner.counts if self.planner is not None else {}
        return {"forwards": w.forwards, "hits": w.hits, "misses": w.misses, **plan}

    def __enter__(self) -> CardDrafter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
