"""How far a drafter's own path probabilities overstate its chain's acceptance in the text
at hand, learnt online (``SoloCalibration``): ``auto``'s solo way reads its floors
through it.

The ReDrafter states a probability for each token it drafts; ``auto``'s solo way keeps a
chain token where that path probability reaches a floor (``AutoDrafter._solo_floor``: what
the token's verify row and chain step cost, at the way's tokens per ms). The network is
overconfident, and more so in some texts than others: on 80 held-out corpus prompts
(AMD EPYC Zen 4, 2026-11-30) a first token it gives 0.4-0.6 was accepted about a third of
the time, a fourth one it gives 0.4-0.6 a quarter. Per depth ``j`` this keeps the sums of
the path probabilities of the chain tokens verified in this text and of their outcomes
(token ``j`` and those before it accepted), each starting at 1 (a ratio of one), and
scales the floor at depth ``j`` by their ratio: where the network says 0.5 and a third
are accepted, a floor of 0.2 asks it for 0.3.

Replayed over recorded chains of those prompts (``scripts/solo_floor_replay.py``, tokens
per ms against plain decoding, chains of up to 3): 1.246x with the raw floors, 1.261x
with this ratio (binned probabilities with a monotone fit: 1.262x); in the third of the
prompts where the first token was accepted least (0.34), 1.105x -> 1.128x, where one
token a step gave 1.130x; in the best third (0.60) 1.495x -> 1.491x.

Example::

    >>> cal = SoloCalibration(depths=3)
    >>> for _ in range(8):
    ...     cal.observe([0.6, 0.4], accepted=0)   # two tokens kept, neither accepted
    >>> [round(v, 2) for v in cal.floors([0.1, 0.2, 0.3])]
    [0.58, 0.84, 0.84]
"""

from __future__ import annotations

from collections.abc import Sequence

PRIOR = 1.0  # each depth's sums start here: a ratio of one, worth about two tokens


class SoloCalibration:
    """Per chain depth: sums of verified tokens' path probabilities and of their
    acceptances in the current text (``reset`` at a new one)."""

    def __init__(self, depths: int) -> None:
        if depths < 1:
            raise ValueError(f"a calibration needs depths >= 1, got {depths}")
        self.depths = depths
        self.reset()

    def reset(self) -> None:
        self._said = [PRIOR] * self.depths  # sum of path probabilities, per depth
        self._got = [PRIOR] * self.depths  # sum of acceptances, per depth

    def observe(self, paths: Sequence[float], accepted: int) -> None:
        """A verified chain: ``paths`` the kept tokens' path probabilities (depth order),
        ``accepted`` how many of them the target accepted (a prefix)."""
        said, got = self._said, self._got
        for j, p in enumerate(paths[: self.depths]):
            said[j] += p
            if accepted > j:
                got[j] += 1.0

    def floors(self, need: Sequence[float]) -> list[float]:
        """``need`` (per depth, in calibrated terms) as floors on the drafter's own path
        probabilities: each times that depth's said / got, capped at 1, non-decreasing.
        Plain Python floats (a per-step path, run right after a verify)."""
        out, best = [], 0.0
        for j, v in enumerate(need):
            k = min(j, self.depths - 1)
            f = v * self._said[k] / self._got[k]
            f = 1.0 if f > 1.0 else f
            best = f if f > best else best
            out.append(best)
        return out
