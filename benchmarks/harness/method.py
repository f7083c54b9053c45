"""The measurement method's rules, fixed before a run, that decide whether a cell's figure is a result at all
(docs/results/README.md, "Method"):

- **a settled noise floor**: every repetition's identical copy of the baseline, scored by the same rule as the
  policy, lies within ``FLOOR_BAND``; where one strays, the machine did not resolve that cell at that length, and
  the cell is rerun longer (``bench_default --settle``) or published without a verdict, which counts as not met;
- **a figure clear of its floor**: a verdict that a configuration is ahead or behind stands only where the copy's
  range over the repetitions stays clear of the figure's; where what chance gave an identical copy reaches the
  figure, the figure is no result (``floor_reaches``: run longer). A tie stays a tie;
- **enough requests for a p99**: ``MIN_P99_REQUESTS`` per configuration, pooled over the repetitions, with the count
  shown; under it the p99 is printed as unresolved;
- **the offered load really offered**: a cell whose client sent below ``CLIENT_PACE`` of its schedule's pace is
  client-bound (the load generator, not the server, was the limit);
- **the machine's busy time** beside every cell, from /proc/stat, so that a load's label can be checked against
  what the cores did;
- **the cores were ours**: configurations take turns in short segments, and a segment during which the hypervisor
  took more than ``STEAL_MAX`` of the machine (/proc/stat's steal) is measured again after a pause
  (``STEAL_RETRIES`` times at most). On this 2-core VM steal came in spells of seconds to a minute, up to 40% of
  the machine; a 2 s segment under a spell ran 2-7x slower for every configuration alike, and one such segment in
  a cell moved an identical copy's ratio to 0.38-4.95x. Segments whose steal stayed high are kept and counted.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")

FLOOR_BAND = (0.90, 1.10)  # each repetition's identical copy must score within this, or the cell is unsettled
MIN_P99_REQUESTS = 1000  # requests per configuration, pooled over repetitions, for a p99 to count
CLIENT_PACE = 0.95  # sent / the schedule's pace at least this, or the cell is client-bound
STEAL_MAX = 0.02  # a segment during which steal took more of the machine than this is measured again
STEAL_RETRIES = 30  # ... at most this many times, each after STEAL_PAUSE_S (spells last seconds to a minute and more)
STEAL_PAUSE_S = 3.0

PROC_STAT = Path("/proc/stat")


def floor_settled(copy_ratios: Sequence[float]) -> bool:
    """Whether every repetition's identical copy scored within FLOOR_BAND (no repetitions: not settled)."""
    lo, hi = FLOOR_BAND
    return bool(copy_ratios) and all(lo <= r <= hi and math.isfinite(r) for r in copy_ratios)


def floor_note(copy_ratios: Sequence[float]) -> str:
    """Why a cell has no verdict, in the pages' words."""
    lo, hi = FLOOR_BAND
    return (f"no verdict: the noise floor read {min(copy_ratios):.2f}-{max(copy_ratios):.2f}, outside "
            f"{lo:.2f}-{hi:.2f} (run longer)") if copy_ratios else "no verdict: no noise floor"


def floor_reaches(figure: Sequence[float], copy_ratios: Sequence[float]) -> bool:
    """Whether the identical copy's range over the repetitions meets the figure's (both per repetition, scored by the
    same rule): a figure the copy reaches says nothing a configuration identical to the baseline would not."""
    return bool(figure) and bool(copy_ratios) and min(copy_ratios) <= max(figure) and min(figure) <= max(copy_ratios)


def floor_verdict(figure: Sequence[float], copy_ratios: Sequence[float], decisive: bool) -> str | None:
    """Why the figure has no verdict beside its noise floor, in the pages' words, or None where its verdict stands:
    the floor strayed outside its band (``floor_settled``), or the verdict is ``decisive`` (ahead or behind, met or
    missed: not a tie) and the copy reaches the figure (``floor_reaches``)."""
    if not floor_settled(copy_ratios):
        return floor_note(copy_ratios)
    if decisive and floor_reaches(figure, copy_ratios):
        return (f"no verdict: the noise floor read {min(copy_ratios):.2f}-{max(copy_ratios):.2f}, reaching the "
                f"figure's {min(figure):.2f}-{max(figure):.2f} (run longer)")
    return None


def p99_note(requests: int) -> str:
    """The request count a p99 rests on, flagged where it is under MIN_P99_REQUESTS."""
    return f"{requests:,}" + ("" if requests >= MIN_P99_REQUESTS else f" (< {MIN_P99_REQUESTS:,}: p99 unresolved)")


def cpu_times() -> tuple[int, int, int]:
    """(busy, total, steal) jiffies of the whole machine so far, from /proc/stat's first line; busy is everything
    but idle and iowait (steal included), steal the time the hypervisor ran something else on our cores. (0, 0, 0)
    where /proc/stat cannot be read."""
    try:
        fields = PROC_STAT.read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0, 0, 0
    vals = [int(v) for v in fields[:8]]
    total = sum(vals)
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return total - idle, total, vals[7] if len(vals) > 7 else 0


def busy_between(before: tuple[int, ...], after: tuple[int, ...]) -> float:
    """The machine's busy fraction (0-1 over all cores) between two ``cpu_times`` readings; NaN without any."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else math.nan


def steal_between(before: tuple[int, ...], after: tuple[int, ...]) -> float:
    """The fraction of the machine (0-1 over all cores) the hypervisor took between two ``cpu_times`` readings;
    NaN without any."""
    total = after[1] - before[1]
    return (after[2] - before[2]) / total if total > 0 else math.nan


def stolen(steal: float) -> bool:
    """Whether a segment's steal was over STEAL_MAX (NaN, where /proc/stat says nothing, is not)."""
    return steal > STEAL_MAX


def segments_for(rate: float, segment_s: float, reps: int, *, minimum: int, per_config: int = MIN_P99_REQUESTS) -> int:
    """Segments per configuration and repetition, fixed before the run: at least ``minimum``, and enough that the
    expected requests pooled over the repetitions reach ``per_config`` (the p99's floor)."""
    need = per_config / max(rate * segment_s * reps, 1e-9)
    return max(minimum, math.ceil(need))


@dataclass(frozen=True)
class Turn:
    """What the machine did during one measurement: its busy and steal shares, how often it was measured again for
    steal, and whether the last try's steal stayed over STEAL_MAX (kept, and counted)."""

    busy: float
    steal: float
    retried: int
    stolen: bool


def measured(measure: Callable[[], T], *,
             read: Callable[[], tuple[int, ...]] = cpu_times) -> tuple[T, dict[str, float]]:
    """``measure()`` once, and the machine's busy and steal shares meanwhile (``busy``, ``steal``): for a run too
    short to measure a stolen window again (``while_ours`` does)."""
    before = read()
    value = measure()
    after = read()
    return value, {"busy": busy_between(before, after), "steal": steal_between(before, after)}


def while_ours(measure: Callable[[], T], *, read: Callable[[], tuple[int, ...]] = cpu_times,
               pause: Callable[[float], None] = time.sleep) -> tuple[T, Turn]:
    """``measure()``, taken again after STEAL_PAUSE_S while the hypervisor stole more than STEAL_MAX of the machine
    during it, STEAL_RETRIES times at most: its last result and what the machine did meanwhile."""
    retried = 0
    while True:
        value, machine = measured(measure, read=read)
        steal = machine["steal"]
        if not stolen(steal) or retried >= STEAL_RETRIES:
            return value, Turn(machine["busy"], steal, retried, stolen(steal))
        retried += 1
        pause(STEAL_PAUSE_S)
