"""The N-Grammys drafters: ``bigram`` (extended model bigram) and ``ngrammys`` (mixed).

``ngrammys`` (§4.3) fills its ``k`` drafts of length ``w`` with the context n-gram's
continuations first (as many as the context offers, possibly none), then with the
extended model bigram of the last token, skipping bigram drafts the context already gave.
Both hand their drafts to the decoder either as a tree (``propose``: shared prefixes
merged, cut breadth-first to ``budget``) or as the (k, w) matrix of the paper's batched
verification (``propose_batch``); ``verify`` picks the path: ``"auto"`` (the backend's
measured default), ``"tree"`` or ``"batch"``.

Both need the model-derived :class:`BigramTable`; ``model.drafter("ngrammys")`` builds it
on first use and caches it on disk (``draftwise.drafting.assets``).

Example with a toy table (next token ``x + 1``, second choice ``x + 2``, mod 6)::

    >>> from draftwise.core.drafters.bigram_table import build_bigram_table
    >>> t = build_bigram_table(lambda x: np.stack([(x + 1) % 6, (x + 2) % 6], 1), 6, k=2)
    >>> d = NGrammys(table=t, k=3, w=2)
    >>> d.propose_batch(np.array([4, 0, 5, 4]), budget=16).tolist()  # context first
    [[0, 5], [5, 0], [0, 1]]
"""

from __future__ import annotations

import os

import numpy as np

from draftwise.core.drafters.bigram_table import BigramTable
from draftwise.core.drafters.context_ngram import check_qkw, check_verify, match_context
from draftwise.core.tree import DraftTree
from draftwise.errors import DraftwiseError


def _table(table: BigramTable | None, table_path: str | os.PathLike[str] | None,
           tokenizer_id: str | None, name: str) -> BigramTable:
    if table is not None:
        return table
    if table_path is None:
        raise DraftwiseError(
            f"the {name} drafter needs the model-derived bigram table: use "
            f"model.drafter({name!r}) (builds and caches it on first use) or pass table=..."
        )
    if tokenizer_id is None:
        raise DraftwiseError(f"{name} table_path={os.fspath(table_path)!r} needs tokenizer_id")
    return BigramTable.load(table_path, tokenizer_id)


class Bigram:
    """Extended model bigram: the table's top-``k`` after the last token, each chained
    greedily to ``w`` tokens."""

    name = "bigram"

    def __init__(
        self,
        table: BigramTable | None = None,
        k: int = 10,
        w: int = 10,
        verify: str = "auto",
        table_path: str | os.PathLike[str] | None = None,
        tokenizer_id: str | None = None,
    ) -> None:
        check_qkw(1, k, w)
        check_verify(verify)
        self.table = _table(table, table_path, tokenizer_id, self.name)
        self.k, self.w, self.verify = int(k), int(w), verify

    def reset(self) -> None:
        pass

    def begin(self, prompt: np.ndarray) -> None:
        pass

    def propose_batch(self, context: np.ndarray, budget: int) -> np.ndarray:
        """(k, w) drafts after ``context``; ``budget`` is left to the caller (the batch
        path verifies whole rows)."""
        return self.table.drafts(int(context[-1]), self.k, self.w)

    def propose(self, context: np.ndarray, budget: int) -> DraftTree:
        return DraftTree.from_paths(self.propose_batch(context, budget).tolist(), budget=budget)

    def update(self, context: np.ndarray, n_new: int) -> None:
        pass


class NGrammys(Bigram):
    """Mixed strategy: context n-gram continuations (query length ``q``) first, then the
    extended bigram fills the remaining drafts up to ``k``."""

    name = "ngrammys"

    def __init__(
        self,
        table: BigramTable | None = None,
        k: int = 10,
        w: int = 10,
        q: int = 1,
        verify: str = "auto",
        table_path: str | os.PathLike[str] | None = None,
        tokenizer_id: str | None = None,
    ) -> None:
        check_qkw(q, k, w)
        super().__init__(table, k, w, verify, table_path, tokenizer_id)
        self.q = int(q)
        self.last_from_context = 0  # drafts the context gave at the last proposal

    def propose_batch(self, context: np.ndarray, budget: int) -> np.ndarray:
        ctx = match_context(context, self.q, self.w, self.k)  # (m, w)
        self.last_from_context = ctx.shape[0]
        need = self.k - ctx.shape[0]
        if need <= 0:
            return ctx
        big = self.table.drafts(int(context[-1]), self.k, self.w)  # (k', w)
        if ctx.shape[0]:  # drop bigram drafts the context already proposed
            dup = (big[:, None, :] == ctx[None, :, :]).all(axis=2).any(axis=1)
            big = big[~dup]
        return np.concatenate([ctx, big[:need]], axis=0)
