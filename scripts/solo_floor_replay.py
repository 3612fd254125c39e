"""Does calibrating the ReDrafter's path probabilities online improve ``auto``'s solo
floors? Records live chains, then replays floor policies over them.

``record``: decodes corpus prompts (never benchmark ones) with ``redrafter:bw=1,t=4`` and
no floor, keeping per step the four drafted tokens' path probabilities (the network's
own) and how many the target accepted; prints how the probabilities are calibrated.
``replay``: what a step's tokens per ms would have been with a chain cut by each policy
(a fixed length; ``AutoDrafter._solo_floor``'s floors on the raw probabilities; the same
floors read through a per-depth calibration learnt online, per prompt or across them),
from a verify cost curve (``--costs``, ms at 1..5 rows) and the drafting costs below
(``--draft-ms`` a first token, ``--token-ms`` each further one). Greedy acceptance is a
prefix, so a chain cut at ``k`` tokens emits ``min(accepted, k) + 1``.

Measured (2026-11-30, AMD EPYC Zen 4, the shipped run-3 network, corpus lines 400-459, 128
tokens; costs of the session-q bench): the network is overconfident (depth 1: mean
probability 0.61, accepted 0.47; a token it gives 0.4-0.5 is accepted 0.32), but learning
that online moved the replayed ratio little: greedy, chains of up to 3, floors at 0.4
tokens/ms: 1.296x plain (raw) against 1.297-1.300x (calibrated); seeded T = 0.8: 1.041x /
1.067x against a fixed one-token chain's 1.074x. Session u (lines 400-479, the same
costs): 1.255x raw, 1.264x binned, 1.265x ``auto``'s per-depth ratio
(``core/solo_calibration.py``, which ``auto`` now uses) at 0.4 tokens/ms, 1.233x /
1.260x / 1.256x at 0.3; the gain is in the prompts whose chains fail most (the third with
the least accepted first token: 1.105x raw, 1.128x with the ratio, one token 1.130x).

Example::

    python scripts/solo_floor_replay.py record --lines 400:460 --out /tmp/g.npy
    python scripts/solo_floor_replay.py replay /tmp/g.npy --costs 3.34,3.66,4.22,4.79,5.30
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from draftwise.core.solo_calibration import SoloCalibration

CORPUS = Path(__file__).resolve().parents[2] / "shared/corpus/prompts.jsonl"
T = 4  # tokens a recorded chain drafts
EDGES = np.array([0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0001])
MID = (EDGES[:-1] + EDGES[1:]) / 2


def record(lines: str, out: Path, temp: float, tokens: int) -> None:
    import draftwise

    lo, hi = (int(x) for x in lines.split(":"))
    rows = [json.loads(x) for x in CORPUS.read_text().splitlines()[lo:hi]]
    m = draftwise.load()
    d = m.drafter(f"redrafter:bw=1,t={T}")
    kw = {"temp": temp, "seed": 0} if temp > 0 else {}
    steps = []  # (T path probabilities, accepted, prompt)
    for i, r in enumerate(rows):
        gen = draftwise.stream_generate(m, r["prompt"], drafter=d, max_tokens=tokens, **kw)
        for resp in gen:
            bt = d.last
            if bt is not None and resp.drafted and len(bt.path_logp) == T:
                steps.append([*np.exp(bt.path_logp), resp.from_draft, i])
    s = np.array(steps)  # (steps, T + 2)
    np.save(out, s)
    for j in range(T):
        p, ok = s[:, j], s[:, T] > j
        print(f"depth {j + 1}: mean probability {p.mean():.3f}, accepted {ok.mean():.3f}")
        for a, b in zip(EDGES[:-1:2], EDGES[2::2], strict=False):
            sel = (p >= a) & (p < b)
            if sel.sum() >= 20:
                print(f"  [{a:.2f}, {b:.2f}): {int(sel.sum()):5d} tokens, "
                      f"mean {p[sel].mean():.3f}, accepted {ok[sel].mean():.3f}")


class OnlineCalibration:
    """Per depth and bin of the raw path probability: Beta counts starting at the bin's
    middle (worth ``w`` tokens), monotone in the probability when read."""

    def __init__(self, w: float) -> None:
        self.hits = np.tile(MID * w, (T, 1))  # (T, bins)
        self.tries = np.full((T, MID.size), w)

    def observe(self, p: np.ndarray, accepted: int) -> None:
        for j, pj in enumerate(p):
            b = int(np.searchsorted(EDGES, pj, side="right")) - 1
            self.tries[j, b] += 1
            self.hits[j, b] += accepted > j

    def raw_floor(self, need: np.ndarray) -> np.ndarray:
        """(T,) the least raw path probability whose calibrated acceptance reaches
        ``need`` at each depth (the bins' lower edges), made non-decreasing."""
        out = []
        for j, nd in enumerate(need):
            rate = isotonic(self.hits[j] / self.tries[j], self.tries[j])  # (bins,)
            ok = np.flatnonzero(rate >= nd)
            out.append(EDGES[ok[0]] if ok.size else 1.0)
        return np.maximum.accumulate(out)


def isotonic(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The non-decreasing fit of ``y`` weighted by ``w`` (pool adjacent violators).

    Example::

        >>> isotonic(np.array([0.2, 0.0, 1.0]), np.array([1.0, 3.0, 1.0])).tolist()
        [0.05, 0.05, 1.0]
    """
    vals, wts, sizes = [], [], []
    for v, x in zip(y.tolist(), w.tolist(), strict=True):
        vals.append(v)
        wts.append(x)
        sizes.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            v2, w2, n2 = vals.pop(), wts.pop(), sizes.pop()
            vals[-1] = (vals[-1] * wts[-1] + v2 * w2) / (wts[-1] + w2)
            wts[-1] += w2
            sizes[-1] += n2
    return np.repeat(vals, sizes)


def replay(s: np.ndarray, c: np.ndarray, t: int, mode: str, rate: float, draft_ms: float,
           token_ms: float, w: float = 2.0, chain_step: float = 0.04) -> float:
    """Tokens per ms over the recorded steps, as a multiple of plain decoding's."""
    need = np.maximum.accumulate(
        [(c[j + 1] - c[j] + (chain_step * c[0] if j else 0.0)) * rate for j in range(t)])
    tok = ms = 0.0
    cal: OnlineCalibration | SoloCalibration = OnlineCalibration(w)
    last = -1
    for row in s:
        p, acc, prompt = row[:T], int(row[T]), int(row[T + 1])
        if mode in ("online", "ratio") and prompt != last:
            cal, last = (OnlineCalibration(w) if mode == "online" else SoloCalibration(T)), prompt
        if mode == "fixed":
            k = t
        else:
            if mode == "raw":
                floor = need
            elif isinstance(cal, SoloCalibration):  # ``auto``'s (core/solo_calibration.py)
                floor = np.array(cal.floors(need.tolist()))
            else:
                floor = cal.raw_floor(need)
            k = 0
            while k < t and p[k] >= floor[k]:
                k += 1
            if mode != "raw":
                cal.observe(p[:k].tolist() if mode == "ratio" else p[:k], acc)
        drafted = t if mode == "fixed" else min(k + 1, t)  # a cut chain drafted one more
        tok += min(acc, k) + 1
        ms += draft_ms + token_ms * (drafted - 1) + c[k]
    return tok / ms * c[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--lines", default="400:460", help="corpus prompts.jsonl lines lo:hi")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--temp", type=float, default=0.0)
    r.add_argument("--tokens", type=int, default=128)
    q = sub.add_parser("replay")
    q.add_argument("steps", type=Path)
    q.add_argument("--costs", default="3.34,3.66,4.22,4.79,5.30",
                   help="verify ms at 1..5 rows")
    q.add_argument("--draft-ms", type=float, default=0.30)
    q.add_argument("--token-ms", type=float, default=0.095)
    a = p.parse_args()
    if a.cmd == "record":
        if not CORPUS.is_file():
            raise SystemExit(f"no corpus at {CORPUS} (../shared beside the clone)")
        record(a.lines, a.out, a.temp, a.tokens)
        return
    c = np.array([float(x) for x in a.costs.split(",")])
    if c.size != T + 1:
        raise SystemExit(f"--costs needs {T + 1} numbers (1..{T + 1} rows), got {a.costs!r}")
    s = np.load(a.steps)
    for t in (1, 3):
        print(f"fixed t={t}: {replay(s, c, t, 'fixed', 0, a.draft_ms, a.token_ms):.3f}x")
    for t in (2, 3, 4):
        for rate in (0.3, 0.4):
            got = [replay(s, c, t, m, rate, a.draft_ms, a.token_ms)
                   for m in ("raw", "online", "ratio")]
            print(f"chains of up to {t}, {rate} tokens/ms: raw floors {got[0]:.3f}x, "
                  f"calibrated online per prompt {got[1]:.3f}x (binned), {got[2]:.3f}x "
                  f"(auto's per-depth ratio)")


if __name__ == "__main__":
    main()
