"""Every drafter by name, with its declared options and how to build it.

Adding a drafter is one file (its class, under ``draftwise/core/drafters/``) plus one
``DrafterEntry`` here: its options (type, default, bounds, remote-settable or not), the
assets it needs built first, and a builder from (context, checked options).

Example::

    >>> sorted(REGISTRY)[:3]
    ['auto', 'bigram', 'cacheback']
    >>> [o.name for o in REGISTRY["ssd"].options if not o.remote][:2]
    ['capacity', 'rebuild_tokens']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from draftwise.core.autotune import AutoDrafter
from draftwise.core.drafters.base import Drafter, NoDrafter
from draftwise.core.drafters.cacheback import TABLE_MODES, Cacheback
from draftwise.core.drafters.card import VERIFY
from draftwise.core.drafters.context_ngram import VERIFY_MODES, ContextNgram
from draftwise.core.drafters.ngrammys import Bigram, NGrammys
from draftwise.core.drafters.ssd import SSD
from draftwise.drafting.assets import BIGRAM_TABLE, COST_PROFILE
from draftwise.drafting.context import DraftingContext
from draftwise.drafting.draft_models import build_card, build_draft
from draftwise.drafting.options import OBJECT, PATH, Option
from draftwise.drafting.redrafter import auto_redrafter, build_redrafter

Builder = Callable[[DraftingContext, dict[str, Any]], Drafter]

#: the most tree nodes any spec may ask for (``budget=N``); a server sets a lower cap
MAX_BUDGET = 1024


@dataclass(frozen=True)
class DrafterEntry:
    """A drafter's name, options and builder."""

    name: str
    summary: str
    options: tuple[Option, ...]
    build: Builder
    assets: frozenset[str] = frozenset()  # built before use (minutes or seconds)
    remote: bool = True  # may a network request name it?


# ----- builders ---------------------------------------------------------------------------
def build_cacheback(ctx: DraftingContext, opts: dict[str, Any]) -> Drafter:
    """Cacheback, plus the shipped frozen table when it was built for this tokenizer and
    the options neither give their own nor ask for ``table=dynamic``."""
    if "frozen_path" in opts and "tokenizer_id" not in opts and ctx.tokenizer_id is not None:
        opts["tokenizer_id"] = ctx.tokenizer_id
    own = "frozen" in opts or "frozen_path" in opts or opts.get("table") == "dynamic"
    if not own and opts.get("ll", 1) == 1 and ctx.assets is not None:  # shipped: 1-token leaders
        frozen = ctx.assets.frozen_table()
        if frozen is not None:
            opts["frozen"] = frozen
    return Cacheback(**opts)


def build_auto(ctx: DraftingContext, opts: dict[str, Any]) -> Drafter:
    """A precise Cacheback (3-token leaders), SSD and a broad Cacheback (1-token leaders,
    dual table when possible) in one tree, pruned each step by the device's cost curve and
    the online acceptance estimates. The acceptance model keeps statistics per member, so
    the few nodes ``auto`` can afford on a steep cost curve come from the precise member
    (measured: fixed ``cacheback:ll=3`` trees beat LL=1 ones on this CPU in float32,
    bench/results/auto-vs-grid)."""
    cost = opts.pop("cost", None)
    if cost is None:
        assets = ctx.need_assets("auto", "this device's cost profile (cost=CostModel)")
        quiet = ctx.progress is None
        cost = assets.cost_profile(quiet=quiet)
        # at temperature > 0 each verify brings every row's logits to the host: its own
        # curve, measured (or read) on the first such generation
        opts.setdefault("sampling_cost", lambda: assets.cost_profile(quiet=quiet, sampling=True))
    neural = opts.pop("redrafter", "auto")
    bw, t = opts.pop("rd_bw", 4), opts.pop("rd_t", 5)
    precise = Cacheback(ll=3, table="dynamic")
    precise.name = "cacheback-ll3"  # its own state file beside the others (save_members)
    members = [precise, SSD(), build_cacheback(ctx, {})]
    rd = auto_redrafter(ctx, neural, bw, t, cost)
    if rd is not None:  # last: the saved states of the others keep their indices
        members.append(rd)
    # the precise member's 3-token leaders say where a span may be copied: there every
    # member drafts, elsewhere the ReDrafter alone (on a steep curve; ``AutoDrafter``)
    return AutoDrafter(members, cost, copy_member=0 if rd is not None else None, **opts)


def _with_bigram_table(cls: type[Bigram]) -> Builder:
    def build(ctx: DraftingContext, opts: dict[str, Any]) -> Drafter:
        if "table_path" in opts and "tokenizer_id" not in opts and ctx.tokenizer_id is not None:
            opts["tokenizer_id"] = ctx.tokenizer_id
        if "table" not in opts and "table_path" not in opts:
            assets = ctx.need_assets(cls.name, "the model-derived bigram table (table=BigramTable)")
            opts["table"] = assets.bigram_table(quiet=ctx.progress is None)
        return cls(**opts)

    return build


def _plain(cls: Callable[..., Drafter]) -> Builder:
    return lambda ctx, opts: cls(**opts)


# ----- options shared by the n-gram drafters -------------------------------------------------
def _ngram_options(q: bool) -> tuple[Option, ...]:
    opts = (
        Option("k", int, 10, "drafts (rows) per step", low=1, high=64),
        Option("w", int, 10, "tokens per draft", low=1, high=32),
        Option("verify", str, "auto", "verify drafts as a tree or a batch", choices=VERIFY_MODES),
    )
    return opts + ((Option("q", int, 1, "context tokens matched", low=1, high=8),) if q else ())


_TABLE_OPTIONS = (
    Option("table", OBJECT, None, "a BigramTable (default: the model's, built once)", remote=False),
    Option("table_path", PATH, None, "a bigram table file", remote=False),
    Option("tokenizer_id", str, None, "the tokenizer a table file must match", remote=False),
)

REGISTRY: dict[str, DrafterEntry] = {}


def register(entry: DrafterEntry) -> DrafterEntry:
    if entry.name in REGISTRY:
        raise ValueError(f"drafter {entry.name!r} registered twice")
    REGISTRY[entry.name] = entry
    return entry


register(DrafterEntry("none", "plain decoding: no draft", (), _plain(NoDrafter)))
register(DrafterEntry(
    "cacheback", "LRU n-gram tables: dynamic (prompt + output) and the shipped frozen one", (
        Option("ll", int, 1, "leader length (tokens matched)", low=1, high=8),
        Option("fl", int, 3, "follower length (tokens drafted per leader)", low=1, high=16),
        Option("crt", int, 4, "tree nodes reserved for depth", low=0, high=64),
        Option("table", str, "dual", "which tables draft", choices=TABLE_MODES),
        Option("lc", int, 1 << 16, "leaders kept (memory)", low=1, high=1 << 22, remote=False),
        Option("fc", int, 32, "followers kept per leader (memory)", low=1, high=1024, remote=False),
        Option("frozen", OBJECT, None, "a FrozenTable", remote=False),
        Option("frozen_path", PATH, None, "a frozen table file (draftwise build-table)", remote=False),
        Option("tokenizer_id", str, None, "the tokenizer a table file must match", remote=False),
    ), build_cacheback,
))
register(DrafterEntry(
    "ssd", "suffix array over everything read and written; exact repeats replayed", (
        Option("q_max", int, 16, "longest context matched", low=1, high=64),
        Option("q_min", int, 1, "shortest context matched", low=1, high=64),
        Option("draft_len", int, 16, "tokens drafted", low=1, high=64),
        Option("max_matches", int, 64, "matches counted per query", low=1, high=1024),
        Option("replay", bool, True, "replay exact repeats whole"),
        Option("capacity", int, 1 << 20, "tokens remembered (memory)", low=2, high=1 << 27, remote=False),
        Option("rebuild_tokens", int, 4096, "new tokens per index rebuild", low=1, high=1 << 24,
               remote=False),
        Option("rebuild_seconds", float, 30.0, "seconds between rebuilds", low=1e-3, high=86400,
               remote=False),
        Option("max_tail", int, 1 << 16, "unindexed tokens scanned (time)", low=1, high=1 << 20,
               remote=False),
        Option("background", bool, True, "rebuild the index in a background thread", remote=False),
    ), _plain(SSD),
))
register(DrafterEntry(
    "context-ngram", "the context's own n-gram continuations (N-Grammys)", _ngram_options(q=True),
    _plain(ContextNgram),
))
register(DrafterEntry(
    "bigram", "model-derived bigram top-k table (N-Grammys)",
    _ngram_options(q=False) + _TABLE_OPTIONS, _with_bigram_table(Bigram), frozenset({BIGRAM_TABLE}),
))
register(DrafterEntry(
    "ngrammys", "context n-grams, then the bigram table (N-Grammys mixed strategy)",
    _ngram_options(q=True) + _TABLE_OPTIONS, _with_bigram_table(NGrammys), frozenset({BIGRAM_TABLE}),
))
register(DrafterEntry(
    "auto", "Cacheback + SSD (+ ReDrafter) in one tree, sized each step by this device's cost curve", (
        Option("max_budget", int, 64, "most tree nodes per step", low=0, high=MAX_BUDGET),
        Option("cost", OBJECT, None, "a CostModel (default: this device's profile)", remote=False),
        Option("redrafter", str, "auto", "ReDrafter as a member (auto: when a checkpoint "
               "for this model is found and a plain step costs >= 8 ms, several times its "
               "~2 ms of drafting: bf16/float32 on CPU, not the 4bit default mode)",
               choices=("auto", "on", "off"), remote=False),
        Option("rd_bw", int, 4, "ReDrafter member's largest beam width (sized each step "
               "from what the planner keeps)", low=1, high=16, remote=False),
        Option("rd_t", int, 5, "ReDrafter member's most tokens per beam (likewise)", low=1,
               high=16, remote=False),
    ), build_auto, frozenset({COST_PROFILE}),
))


# Draft models allocate a KV cache (and may read a checkpoint) when built: local only.
_DRAFT_MODEL_OPTIONS = (
    Option("layers", int, 8, "early exit: the target's first L layers draft", low=1, high=1024,
           remote=False),
    Option("model", PATH, None, "a draft model with the target's tokenizer (HF dir or .gguf)",
           remote=False),
    Option("head", int, 0, "draft only ids below N (a view of the head; 0 = all)", low=0,
           high=1 << 24, remote=False),
    Option("lm", OBJECT, None, "a DraftLM", remote=False),
    Option("auto", bool, False, "size the tree per step from both models' cost curves "
           "(measured once per device)", remote=False),
)


def _tree_options(beam: int, topk: int, depth: int) -> tuple[Option, ...]:
    return (
        Option("beam", int, beam, "K: nodes expanded per layer", low=1, high=64, remote=False),
        Option("topk", int, topk, "k: children per expanded node", low=1, high=64, remote=False),
        Option("depth", int, depth, "layers grown below the root", low=1, high=64, remote=False),
        Option("max_nodes", int, 512, "candidates kept", low=2, high=1 << 16, remote=False),
    )


register(DrafterEntry(
    "draft", "a draft model grows a tree by path score (beam=topk=1: a chain), then verify",
    _DRAFT_MODEL_OPTIONS + _tree_options(4, 4, 5), build_draft, remote=False,
))
register(DrafterEntry(
    "card", "CARD: a draft model fills a candidate cache in a worker thread during verify",
    _DRAFT_MODEL_OPTIONS + _tree_options(8, 4, 8) + (
        Option("verify", str, "tree", "target verifies the best subtree or CARD's best chain",
               choices=VERIFY, remote=False),
        Option("correct", bool, True, "correct the cache (false: ablation)",
               remote=False),
        Option("threads", int, 1, "torch threads of the draft worker", low=1, high=256,
               remote=False),
    ), build_card, remote=False,
))
register(DrafterEntry(
    "redrafter", "ReDrafter: a trained RNN on the target's hidden state drafts by beam search",
    (
        Option("bw", int, 2, "beam width", low=1, high=16, remote=False),
        Option("t", int, 4, "tokens per beam", low=1, high=16, remote=False),
        Option("pruned", bool, True, "also verify the prefixes beam search pruned (seed 001: "
               "false)", remote=False),
        Option("extend", bool, True, "also draft the context's tokens outside the draft "
               "vocabulary (false: the fixed vocabulary only)", remote=False),
        Option("path", PATH, None, "a checkpoint dir (draftwise train-drafter)", remote=False),
        Option("net", OBJECT, None, "a RecurrentNet", remote=False),
    ), build_redrafter, remote=False,
))


def drafter_names() -> list[str]:
    return sorted(REGISTRY)
