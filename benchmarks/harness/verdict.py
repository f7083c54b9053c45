"""The one verdict rule every results page uses (docs/results/README.md): a figure's interval against its goal.

"met" only where the whole interval is on the goal's side: for a goal of at least ``goal`` (higher is better) its
lower bound is at or above the goal; for a goal of at most ``goal`` (lower is better: a latency ratio, a miss
ratio) its upper bound is at or below it. "missed" where the whole interval is on the other side (the upper bound
below an at-least goal, the lower bound above an at-most goal). Otherwise "tie": the interval straddles the goal,
and a tie is not a win. An interval that touches the goal from the goal's side meets it (the goal says "at least"
or "at most"); one that touches it from the other side is a tie, not a miss.

The interval is whatever the page quotes beside the figure, in that one run: the range over repetitions (mean
[min-max]), the range over slices, or a pooled bootstrap interval. A single figure with no spread is the interval
[x, x]: met or missed, never a tie, so a page that judges one figure says it has no spread.

``count`` tallies verdicts per cell; ``count_line`` puts the policy's count beside the noise floor's (an identical
copy of a baseline judged by the same rule: every verdict it gets other than a tie is a false one)."""

from __future__ import annotations

import math
from typing import Iterable, Mapping

MET, TIE, MISSED = "met", "tie", "missed"
VERDICTS = (MET, TIE, MISSED)


def judge(lo: float, hi: float, goal: float, *, lower_is_better: bool = False) -> str:
    """met / tie / missed for the interval [lo, hi] against ``goal`` (at least ``goal``, or at most it with
    ``lower_is_better``). A NaN bound cannot clear anything: a tie."""
    lo, hi = float(lo), float(hi)
    if math.isnan(lo) or math.isnan(hi):
        return TIE
    if lo > hi:
        lo, hi = hi, lo
    if lower_is_better:
        return MET if hi <= goal else MISSED if lo > goal else TIE
    return MET if lo >= goal else MISSED if hi < goal else TIE


def judge_spread(s: Mapping[str, float], goal: float, *, lower_is_better: bool = False) -> str:
    """``judge`` on a repetitions summary (harness.stats.spread: its min and max are the interval)."""
    return judge(s["min"], s["max"], goal, lower_is_better=lower_is_better)


def judge_value(x: float, goal: float, *, lower_is_better: bool = False) -> str:
    """``judge`` on one figure with no spread (the interval [x, x]): met or missed."""
    return judge(x, x, goal, lower_is_better=lower_is_better)


def count(verdicts: Iterable[str]) -> dict[str, int]:
    """How many cells got each verdict ({"met": n, "tie": n, "missed": n}); a label with words after the verdict
    ("tie (the spread straddles the goal)") counts by its first word."""
    out = dict.fromkeys(VERDICTS, 0)
    for v in verdicts:
        word = v.split(" ")[0]
        if word not in out:
            raise ValueError(f"not a verdict: {v!r}")
        out[word] += 1
    return out


def count_text(n: Mapping[str, int]) -> str:
    """``3 met, 20 tie, 5 missed``."""
    return ", ".join(f"{n.get(v, 0)} {v}" for v in VERDICTS)


def count_line(ours: Mapping[str, int], floor: Mapping[str, int] | None, who: str = "eager",
               floor_name: str = "the identical copy") -> str:
    """The per-cell count beside the noise floor's: ``per cell eager 1 met, 25 tie, 2 missed; the identical copy
    0 met, 25 tie, 3 missed``. The floor's met and missed are that rule's false verdicts on this machine."""
    line = f"per cell {who} {count_text(ours)}"
    return line + (f"; {floor_name} {count_text(floor)}" if floor is not None else "; no noise floor measured")
