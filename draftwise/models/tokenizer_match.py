"""Whether a draft model can draft for a target: both must read and write the same ids.

A draft model proposes token ids that the target verifies, so the two tokenizers must map
text to ids identically. Identical ``tokenizer.json`` bytes pass at once; otherwise the
vocabularies (with added tokens) must be equal and the end-of-sequence ids too, and the
error names the first difference in one line.

Example::

    >>> check_same_tokenizer(target_tok, draft_tok, "/models/draft")  # doctest: +SKIP
    DraftwiseError: draft model '/models/draft' has another tokenizer: vocabulary of
    151665 tokens, the target's has 49152
"""

from __future__ import annotations

from draftwise.errors import DraftwiseError
from draftwise.models.tokenizer import Tokenizer


def tokenizer_difference(target: Tokenizer, draft: Tokenizer) -> str | None:
    """How ``draft`` differs from ``target`` in words, or None when they match."""
    if target.identity() == draft.identity():
        return None
    tv = target.backend.get_vocab(with_added_tokens=True)
    dv = draft.backend.get_vocab(with_added_tokens=True)
    if len(tv) != len(dv):
        return f"vocabulary of {len(dv)} tokens, the target's has {len(tv)}"
    if tv != dv:
        t_by_id = {i: t for t, i in tv.items()}
        d_by_id = {i: t for t, i in dv.items()}
        for i in sorted(set(t_by_id) | set(d_by_id)):
            if t_by_id.get(i) != d_by_id.get(i):
                return f"token id {i} is {d_by_id.get(i)!r}, in the target {t_by_id.get(i)!r}"
    if target.eos_token_ids != draft.eos_token_ids:
        return (f"end-of-sequence ids {sorted(draft.eos_token_ids)}, "
                f"the target's are {sorted(target.eos_token_ids)}")
    sample = "Hello, world! 12345 ünïcödé\n\tdef f(x): return x"
    if target.encode(sample) != draft.encode(sample):
        return "same vocabulary but text is split differently (normalizer or pre-tokenizer)"
    return None  # same vocabulary and splitting: other bytes (e.g. formatting) differ


def check_same_tokenizer(target: Tokenizer, draft: Tokenizer, where: str) -> None:
    """Raise a one-line DraftwiseError naming the difference, if any."""
    diff = tokenizer_difference(target, draft)
    if diff is not None:
        raise DraftwiseError(f"draft model '{where}' has another tokenizer: {diff}")
