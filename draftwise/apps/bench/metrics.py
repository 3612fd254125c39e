"""Spec-Bench metrics from turn records: speedup, mean accepted tokens, identical outputs.

Definitions (per category and overall, per pass of ``--lifetime``):

- tokens/s of a turn = generated tokens / wall time of the turn (prefill included);
  a method's tokens/s = the mean over its turns.
- speedup = method's mean tokens/s / the baseline's mean tokens/s (Spec-Bench);
  ``speedup_vs_reference``: the same against the ``reference`` method (plain decoding in
  the ``--reference-dtype``, e.g. float32), measured in the same run;
  ``speedup_median`` = median over turns of (method tok/s / baseline tok/s, same turn);
  ``decode_speedup`` = the mean-ratio speedup with prefill time left out.
- MAT (mean accepted tokens) = tokens / verification steps, the bonus token included
  (plain decoding gives 1.0; peers report no steps: None).
- draft / verify ms per step = total draft / verify time / steps.
- identical: the output equals the baseline's for the same prompt and turn (token ids for
  our methods; decoded text for peers, whose tokenizer round trip may differ).

Example::

    >>> base = TurnRecord("none", BASELINE, "p", "qa", 1, 9, 10, 10, [1] * 10, 1.0, 0.1,
    ...                   0.9, 0.0, 900.0, "length", list(range(10)))
    >>> fast = TurnRecord("cb", DRAFTER, "p", "qa", 1, 9, 10, 4, [3, 3, 3, 1], 0.5, 0.1,
    ...                   0.4, 20.0, 380.0, "length", list(range(10)))
    >>> mark_identical([base, fast])
    >>> row = [r for r in summarize([base, fast]) if r.method == "cb"][0]
    >>> row.speedup, row.mat, row.identical, row.draft_ms_per_step
    (2.0, 2.5, 1, 5.0)
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from draftwise.apps.bench.records import BASELINE, DRAFTER, PEER, REFERENCE, TurnRecord

OVERALL = "overall"
__all__ = [
    "BASELINE", "DRAFTER", "OVERALL", "PEER", "REFERENCE", "SummaryRow", "mark_identical", "summarize"
]


@dataclass
class SummaryRow:
    """One method's numbers for one category (or ``overall``) of one pass."""

    pass_no: int
    category: str
    method: str
    kind: str
    turns: int
    tokens: int
    tokens_per_s: float
    speedup: float | None
    speedup_median: float | None
    decode_speedup: float | None
    mat: float | None
    draft_ms_per_step: float | None
    verify_ms_per_step: float | None
    identical: int
    identical_rate: float | None
    tree_per_step: float | None = None  # draft nodes verified per step (the budget used)
    speedup_vs_reference: float | None = None  # mean tok/s over the reference method's
    beam_width_per_step: float | None = None  # beam drafters: mean beams drafted per step
    beam_length_per_step: float | None = None  # and their mean length (0 on beamless steps)


    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _baselines(
    records: Sequence[TurnRecord], kind: str = BASELINE
) -> dict[tuple[int, str, int], TurnRecord]:
    return {r.key: r for r in records if r.kind == kind}


def _mean_ratio(group: Sequence[TurnRecord], refs: dict[tuple[int, str, int], TurnRecord]) -> float | None:
    """Mean tok/s of ``group`` over the mean tok/s of the same turns in ``refs``."""
    paired = [(r, refs[r.key]) for r in group if r.key in refs]
    if not paired:
        return None
    m_tps = statistics.fmean(_tps(r.tokens, r.wall_s) for r, _ in paired)
    return _ratio(m_tps, statistics.fmean(_tps(b.tokens, b.wall_s) for _, b in paired))


def mark_identical(
    records: Sequence[TurnRecord], decode: Callable[[list[int]], str] | None = None
) -> None:
    """Set ``identical`` on every record: equal to the baseline record of the same key.

    Peers are compared on ``decode(token_ids)`` (ids when ``decode`` is None).
    """
    base = _baselines(records)
    for r in records:
        ref = base.get(r.key)
        if ref is None:
            r.identical = None
        elif r.kind == PEER and decode is not None:
            r.identical = decode(r.token_ids) == decode(ref.token_ids)
        else:
            r.identical = r.token_ids == ref.token_ids


def _tps(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _per_step(total: float | None, steps: int) -> float | None:
    return total / steps if total is not None and steps else None


def _row(
    pass_no: int,
    category: str,
    group: list[TurnRecord],
    base: dict[tuple[int, str, int], TurnRecord],
    reference: dict[tuple[int, str, int], TurnRecord] | None = None,
) -> SummaryRow:
    first = group[0]
    refs = [base.get(r.key) for r in group]
    paired = [(r, b) for r, b in zip(group, refs, strict=True) if b is not None]
    tps = statistics.fmean(_tps(r.tokens, r.wall_s) for r in group)
    speedup = speedup_med = dec_speedup = None
    if paired:
        b_tps = statistics.fmean(_tps(b.tokens, b.wall_s) for _, b in paired)
        b_dec = statistics.fmean(_tps(b.tokens, b.decode_s) for _, b in paired)
        m_tps = statistics.fmean(_tps(r.tokens, r.wall_s) for r, _ in paired)
        m_dec = statistics.fmean(_tps(r.tokens, r.decode_s) for r, _ in paired)
        speedup, dec_speedup = _ratio(m_tps, b_tps), _ratio(m_dec, b_dec)
        ratios = [
            x
            for r, b in paired
            if (x := _ratio(_tps(r.tokens, r.wall_s), _tps(b.tokens, b.wall_s))) is not None
        ]
        speedup_med = statistics.median(ratios) if ratios else None
    steps = sum(r.steps or 0 for r in group)
    tokens = sum(r.tokens for r in group)
    draft = None if first.draft_ms is None else sum(r.draft_ms or 0.0 for r in group)
    verify = None if first.verify_ms is None else sum(r.verify_ms or 0.0 for r in group)
    flags = [r.identical for r in group if r.identical is not None]
    return SummaryRow(
        pass_no=pass_no,
        category=category,
        method=first.method,
        kind=first.kind,
        turns=len(group),
        tokens=tokens,
        tokens_per_s=tps,
        speedup=speedup,
        speedup_median=speedup_med,
        decode_speedup=dec_speedup,
        mat=tokens / steps if steps else None,
        draft_ms_per_step=_per_step(draft, steps),
        verify_ms_per_step=_per_step(verify, steps),
        identical=sum(flags),
        identical_rate=sum(flags) / len(flags) if flags else None,
        tree_per_step=_per_step(float(sum(sum(r.tree_sizes) for r in group)), steps)
        if first.kind != PEER
        else None,
        speedup_vs_reference=_mean_ratio(group, reference) if reference else None,
        beam_width_per_step=_beam_mean(group, 0, steps),
        beam_length_per_step=_beam_mean(group, 1, steps),
    )


def _beam_mean(group: Sequence[TurnRecord], k: int, steps: int) -> float | None:
    """Mean beam width (k=0) or length (k=1) per step; None for a method without beams."""
    if not any(r.beams for r in group):
        return None
    return _per_step(float(sum(b[k] for r in group for b in r.beams)), steps)


def summarize(records: Sequence[TurnRecord]) -> list[SummaryRow]:
    """Rows per (pass, category, method), then per (pass, ``overall``, method).

    Methods and categories keep the order in which they first appear in ``records``.
    """
    base = _baselines(records)
    reference = _baselines(records, REFERENCE)
    methods = list(dict.fromkeys(r.method for r in records))
    categories = list(dict.fromkeys(r.category for r in records))
    passes = sorted({r.pass_no for r in records})
    rows: list[SummaryRow] = []
    for p in passes:
        for cat in [*categories, OVERALL]:
            for m in methods:
                group = [
                    r
                    for r in records
                    if r.pass_no == p and r.method == m and cat in (OVERALL, r.category)
                ]
                if group:
                    rows.append(_row(p, cat, group, base, reference))
    return rows
