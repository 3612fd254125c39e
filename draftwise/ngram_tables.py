"""The model-derived bigram table, built once per model and cached on disk.

``ensure_bigram_table(model)`` loads ``cache_dir()/tables/bigram-<model>-<tokenizer>.npz``
or, on first use, builds it (every vocabulary token as a one-token sequence at position
0, no BOS or chat prefix, as in The N-Grammys; batches of ``BATCH`` rows with a progress
bar), adds the unigram ranking from the embeddings, and writes it atomically. The file
records the tokenizer identity; a mismatch or a corrupt file is rebuilt over.
SmolLM2-135M (49,152 tokens) takes about 2.5 minutes on a 2-core CPU.

``make_table_drafter(model, spec, options)`` builds ``bigram``/``ngrammys`` (also inside a
``+`` combination) with that table; ``Model.drafter`` calls it.

Example::

    model = draftwise.load()
    table = ensure_bigram_table(model)        # builds on first use, then loads
    d = model.drafter("ngrammys:k=5,w=4")
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftwise import tuning
from draftwise.core.drafters import NEEDS_BIGRAM_TABLE, Combined, Drafter, make_drafter, parse_spec
from draftwise.core.drafters.bigram_table import (
    BigramTable,
    TableSource,
    build_bigram_table,
    unigram_ranking,
)
from draftwise.errors import DraftwiseError
from draftwise.models.paths import cache_dir

if TYPE_CHECKING:
    from draftwise.api import Model

TABLE_K = 20  # top-k kept per token: the paper's useful k range is <= 25
BATCH = 512  # one-token rows per forward


def table_path(model: Model) -> Path:
    """Where this model's bigram table lives (per model directory and tokenizer)."""
    tok = model.tokenizer.identity()[:16]
    return cache_dir() / "tables" / f"bigram-{Path(model.model_dir).name}-{tok}.npz"


def _source(model: Model) -> TableSource:
    be = model.backend
    if not isinstance(be, TableSource):
        raise DraftwiseError(f"backend {be.name!r} cannot build a bigram table (no next_topk)")
    return be


def build_for_model(model: Model, k: int = TABLE_K, quiet: bool = False) -> BigramTable:
    """Build the table from the model (no disk access)."""
    src = _source(model)
    uni = unigram_ranking(*src.embeddings())
    return build_bigram_table(
        lambda ids: src.next_topk(ids, k), model.backend.vocab_size, k, BATCH, uni,
        None if quiet else tuning._bar("bigram table"),
    )


def ensure_bigram_table(model: Model, quiet: bool = False) -> BigramTable:
    """Load this model's cached table, or build and cache it (see module docstring)."""
    path = table_path(model)
    tok = model.tokenizer.identity()
    if path.exists():
        try:
            return BigramTable.load(path, tok)
        except DraftwiseError as exc:
            if not quiet:
                print(f"rebuilding the bigram table: {exc}", file=sys.stderr)
    table = build_for_model(model, quiet=quiet)
    path.parent.mkdir(parents=True, exist_ok=True)
    table.save(path, tok)
    return table


def needs_table(spec: str) -> bool:
    """Whether any part of the drafter spec needs the model-derived bigram table."""
    return any(parse_spec(p)[0] in NEEDS_BIGRAM_TABLE for p in spec.split("+"))


def make_table_drafter(model: Model, spec: str, options: dict[str, Any]) -> Drafter:
    """Build ``spec`` (e.g. ``ngrammys:k=5,w=4`` or ``ngrammys+cacheback``), giving the
    bigram table to the parts that need it."""
    parts = spec.split("+")
    if len(parts) > 1:
        if options:
            raise DraftwiseError(f"options are not supported for a combined drafter ({spec!r})")
        return Combined([make_table_drafter(model, p, {}) for p in parts])
    name, _ = parse_spec(spec)
    if name in NEEDS_BIGRAM_TABLE and "table" not in options and "table_path" not in options:
        options = {**options, "table": ensure_bigram_table(model)}
    return make_drafter(spec, **options)
