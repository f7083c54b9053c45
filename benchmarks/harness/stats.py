"""Repetitions of a figure summarised with their spread, and the ratios and verdicts the results pages quote."""

from __future__ import annotations

import math
import statistics
from typing import Sequence

from benchmarks.harness.verdict import TIE, judge_spread


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation between ranks (numpy's default, as every page and
    client/load.py compute it); NaN for no values."""
    if not len(values):
        return math.nan
    s = sorted(float(v) for v in values)
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def bins(points: Sequence[tuple[float, float]], width: float, end: float) -> tuple[list[float], list[float]]:
    """A time series of (t, value) points as the mean value per bin of ``width`` seconds over [0, ``end``): the bins'
    centres and their means (NaN for an empty bin; points past ``end`` fall in the last bin)."""
    n = max(1, int(math.ceil(end / width)))
    acc: list[list[float]] = [[] for _ in range(n)]
    for t, v in points:
        acc[min(max(int(t // width), 0), n - 1)].append(v)
    return [(i + 0.5) * width for i in range(n)], [statistics.fmean(a) if a else math.nan for a in acc]


def violation(latencies_ms: Sequence[float], errors: int, sent: int, sla_ms: float) -> float:
    """The SLA violation rate every page quotes: answers later than ``sla_ms`` plus failed requests, over the
    requests sent (NaN for none sent)."""
    if not sent:
        return math.nan
    return (sum(1 for v in latencies_ms if v > sla_ms) + errors) / sent


def spread(values: Sequence[float]) -> dict[str, float]:
    """Repetitions of one figure: mean, min, max and their count (the docs quote mean [min-max])."""
    v = [float(x) for x in values]
    return {"mean": statistics.fmean(v), "min": min(v), "max": max(v), "n": len(v)}


def fmt(s: dict[str, float], digits: int = 2, unit: str = "") -> str:
    """``1.23x [1.10-1.31]`` style: the mean and the range over repetitions."""
    return f"{s['mean']:.{digits}f}{unit} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def verdict(s: dict[str, float], at_least: float) -> str:
    """met / tie / missed for a ratio goal of at least ``at_least`` by the one rule (harness.verdict): a range that
    straddles the goal is a tie, not a win; the tie says so in the pages' words."""
    said = judge_spread(s, at_least)
    return "tie (the spread straddles the goal)" if said == TIE else said


def held_out_ratios(baselines: dict[str, Sequence[float]], ours: Sequence[float]) -> tuple[list[float], list[str]]:
    """The best baseline's figure / ours, repetition by repetition (e.g. average latencies, lower is better), where
    repetition k's best is the baseline with the lowest mean over the other repetitions. Chosen on repetition k
    itself, the lowest of several noisy figures is biased low, against ours: a policy identical to one baseline
    would often come out behind. Also returns the baseline chosen for each repetition."""
    n = min([len(v) for v in baselines.values()] + [len(ours)]) if baselines else 0
    ratios, picks = [], []
    for k in range(n):
        def others(name: str) -> float:
            vals = baselines[name][:n]
            rest = [a for j, a in enumerate(vals) if j != k and a > 0 and math.isfinite(a)] or list(vals)
            return statistics.fmean(rest)

        best = min(baselines, key=others)
        t, o = baselines[best][k], ours[k]
        if o > 0 and t > 0 and math.isfinite(t / o):
            ratios.append(t / o)
            picks.append(best)
    return ratios, picks


def geomean(values: Sequence[float]) -> float:
    """The mean of ratios: 2x and 0.5x average to 1x (an arithmetic mean would call that 1.25x)."""
    return math.exp(statistics.fmean(math.log(v) for v in values))
