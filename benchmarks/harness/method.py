"""The measurement method's rules, fixed before a run, that decide whether a cell's figure is a result at all
(docs/results/README.md, "Method"):

- **a settled noise floor**: every repetition's identical copy of the baseline, scored by the same rule as the
  policy, lies within ``FLOOR_BAND``; where one strays, the machine did not resolve that cell at that length, and
  the cell is rerun longer (``bench_default --settle``) or published without a verdict, which counts as not met;
- **enough requests for a p99**: ``MIN_P99_REQUESTS`` per configuration, pooled over the repetitions, with the count
  shown; under it the p99 is printed as unresolved;
- **the offered load really offered**: a cell whose client sent below ``CLIENT_PACE`` of its schedule's pace is
  client-bound (the load generator, not the server, was the limit);
- **the machine's busy time** beside every cell, from /proc/stat, so that a load's label can be checked against
  what the cores did.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

FLOOR_BAND = (0.90, 1.10)  # each repetition's identical copy must score within this, or the cell is unsettled
MIN_P99_REQUESTS = 1000  # requests per configuration, pooled over repetitions, for a p99 to count
CLIENT_PACE = 0.95  # sent / the schedule's pace at least this, or the cell is client-bound

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


def p99_note(requests: int) -> str:
    """The request count a p99 rests on, flagged where it is under MIN_P99_REQUESTS."""
    return f"{requests:,}" + ("" if requests >= MIN_P99_REQUESTS else f" (< {MIN_P99_REQUESTS:,}: p99 unresolved)")


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine so far, from /proc/stat's first line; busy is everything but
    idle and iowait (steal included: time the cores were not ours). (0, 0) where /proc/stat cannot be read."""
    try:
        fields = PROC_STAT.read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0, 0
    vals = [int(v) for v in fields[:8]]
    total = sum(vals)
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return total - idle, total


def busy_between(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The machine's busy fraction (0-1 over all cores) between two ``cpu_times`` readings; NaN without any."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total if total > 0 else math.nan
