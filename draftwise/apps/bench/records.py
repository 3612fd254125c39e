"""What one measured turn of one method leaves behind: ``TurnResult`` and ``TurnRecord``.

A *method* is the baseline ``none``, a drafter name, or a peer (``hf``, ``hf-pld``,
``mlx-lm``). Each conversation turn of each method gives one ``TurnRecord``.

A bench folder keeps every record in ``results.json.gz`` (gzip of the JSON; folders
written before it have ``results.json``): ``read_results(folder)`` reads either.

Example::

    >>> r = TurnResult(token_ids=[5, 6, 2], wall_s=0.5, prefill_s=0.1, accept_lengths=[2, 1])
    >>> r.tokens, r.steps, r.decode_s
    (3, 2, 0.4)
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: The records a bench run writes (gzip of the JSON), and the plain JSON of older runs.
RESULTS_FILE = "results.json.gz"
LEGACY_RESULTS_FILE = "results.json"


def results_path(folder: str | os.PathLike[str]) -> Path:
    """The records file of a bench folder: ``results.json.gz``, else an older
    ``results.json``; a path to either file is returned as is.

    Raises ``FileNotFoundError`` naming the folder when it holds neither.
    """
    path = Path(folder).expanduser()
    if path.is_file():
        return path
    for name in (RESULTS_FILE, LEGACY_RESULTS_FILE):
        if (path / name).is_file():
            return path / name
    raise FileNotFoundError(
        f"{path}: no {RESULTS_FILE} or {LEGACY_RESULTS_FILE} (not a bench output folder?)"
    )


def read_results(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """Everything a ``draftwise bench`` run recorded (config, summary, records), from its
    folder's ``results.json.gz`` or, for folders written before it, ``results.json``.

    Example::

        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "results.json.gz").write_bytes(gzip.compress(b'{"complete": true}'))
        >>> read_results(d)
        {'complete': True}
    """
    path = results_path(folder)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":  # gzip magic: whatever the file is named
        raw = gzip.decompress(raw)
    data: dict[str, Any] = json.loads(raw.decode("utf-8"))
    return data

#: Kinds of method: the plain-decoding baseline, one of our drafters, or another library.
BASELINE, DRAFTER, PEER = "baseline", "drafter", "peer"
REFERENCE = "reference"  # plain decoding in another dtype (--reference-dtype): a second baseline


@dataclass
class TurnResult:
    """One generation as a method returns it.

    ``accept_lengths`` holds the tokens emitted per verification step (accepted draft
    tokens plus the bonus token); peers leave it empty (they report no steps).
    """

    token_ids: list[int]
    wall_s: float  # the whole generation: prefill + decoding
    prefill_s: float  # until the first token was known
    accept_lengths: list[int] = field(default_factory=list)
    draft_ms: float | None = None  # total over the turn (our methods only)
    verify_ms: float | None = None
    finish_reason: str | None = None
    tree_sizes: list[int] = field(default_factory=list)  # draft nodes verified per step
    beams: list[list[int]] = field(default_factory=list)  # [width, length] of beams per step

    @property
    def tokens(self) -> int:
        return len(self.token_ids)

    @property
    def steps(self) -> int | None:
        return len(self.accept_lengths) or None

    @property
    def decode_s(self) -> float:
        return round(max(self.wall_s - self.prefill_s, 0.0), 9)


@dataclass
class TurnRecord:
    """One measured turn: which method, which prompt and turn, and what it took."""

    method: str
    kind: str  # BASELINE, DRAFTER or PEER
    prompt_id: str
    category: str
    turn: int  # 1-based
    prompt_tokens: int
    tokens: int
    steps: int | None
    accept_lengths: list[int]
    wall_s: float  # median over repeats (this record is the median repeat)
    prefill_s: float
    decode_s: float
    draft_ms: float | None
    verify_ms: float | None
    finish_reason: str | None
    token_ids: list[int]
    wall_s_repeats: list[float] = field(default_factory=list)
    pass_no: int = 1  # 2 for the second pass of --lifetime
    identical: bool | None = None  # output equals the baseline's (set by metrics)
    tree_sizes: list[int] = field(default_factory=list)  # draft nodes verified per step
    beams: list[list[int]] = field(default_factory=list)  # [width, length] of beams per step

    @classmethod
    def from_result(
        cls,
        res: TurnResult,
        *,
        method: str,
        kind: str,
        prompt_id: str,
        category: str,
        turn: int,
        prompt_tokens: int,
        pass_no: int = 1,
    ) -> TurnRecord:
        return cls(
            method=method,
            kind=kind,
            prompt_id=prompt_id,
            category=category,
            turn=turn,
            prompt_tokens=prompt_tokens,
            tokens=res.tokens,
            steps=res.steps,
            accept_lengths=list(res.accept_lengths),
            wall_s=res.wall_s,
            prefill_s=res.prefill_s,
            decode_s=res.decode_s,
            draft_ms=res.draft_ms,
            verify_ms=res.verify_ms,
            finish_reason=res.finish_reason,
            token_ids=list(res.token_ids),
            wall_s_repeats=[res.wall_s],
            pass_no=pass_no,
            tree_sizes=list(res.tree_sizes),
            beams=[list(b) for b in res.beams],
        )

    @property
    def key(self) -> tuple[int, str, int]:
        """(pass, prompt id, turn): a baseline record with the same key is the reference."""
        return (self.pass_no, self.prompt_id, self.turn)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
