"""Capacity under an SLA, as MLPerf Inference's server scenario scores it: the highest Poisson rate a model sustains
with its p99 within a fixed bound, found by a rate search over windows of one fixed length.

Why: past its capacity a queue grows with the run, so an average or a p99 there says how long the run was, not what
a user would see. A rate counts only where the window is steady and answered: ``steady`` checks that the window's
second half's median latency is at most ``DRIFT`` times its first's (no queue growing through it; medians, because
the means of a latency-critical model's halves moved 1.25-1.36x apart at 30% load beside a busy neighbour, from a
few slow requests, with no queue growing), that it holds at least ``MIN_REQUESTS`` answers, that at least
``ANSWERED`` of the requests sent were answered, and that the client really sent what was asked (at least ``SENT``
of it; below that the figure is the client's limit, not the server's). A rate passes where it is steady and its p99
is within the SLA.

Beside a latency-critical model (Heracles' question, ISCA 2015: how much best-effort work the machine carries while
the latency-critical service keeps its SLO), the rate searched is the best-effort model's, the latency-critical one
runs at a fixed rate in the same window, and a window passes where both were sustained and the latency-critical
model's p99 is within its SLA (``record(rate, best_effort, guarded=latency_critical)``).

The search is a loop the caller drives (``lazybatch load --capacity``): ``next_rate()`` says what
to measure, ``record(rate, result)`` what came of it, until ``next_rate()`` is None. It doubles from the starting
rate until a rate fails (or ``max_rate``), halves until one passes (or ``min_rate``), then bisects between the
highest pass and the lowest failure for ``steps`` windows. Every window's figures stay in ``probes``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

DRIFT = 1.2  # a window's second half's median latency may be at most this times its first's
# answers a window needs to be judged at all: the drift compares the medians of its halves, and a median of 100
# requests strays about 9% (latency CV 0.5), so 1.2x is 2 standard deviations of their ratio; with 17 a half, a
# steady window at 40/s for 1 s read 1.24x (a CI run)
MIN_REQUESTS = 200
ANSWERED = 0.98  # answered / sent at least this
SENT = 0.95  # sent / asked at least this, or the client was the limit


@dataclass(frozen=True)
class Steadiness:
    """Whether one window was sustained, and why not."""

    steady: bool
    drift: float  # second half's median latency / first half's (by send time)
    answered: float  # answered / sent
    sent: float  # the rate the client sent at / the rate its schedule asked for
    why: str


def steady(records: Sequence[tuple[float, float, bool]], send_rate: float, duration_s: float) -> Steadiness:
    """A window's records (scheduled send offset s, latency ms, answered ok), in send order, and the rate the
    client really sent them at (``LoadResult.send_rate``). The schedule's own rate is its count over its last
    offset: a Poisson window of a few seconds holds 30% more or fewer requests than rate x duration, which says
    nothing about the client."""
    n = len(records)
    ok = [(t, lat) for t, lat, good in records if good and not math.isnan(lat)]
    answered = len(ok) / n if n else 0.0
    last = records[-1][0] if records else 0.0
    sent = send_rate / (n / last) if n > 1 and last > 0 else 1.0
    half = duration_s / 2
    first = [lat for t, lat in ok if t < half]
    second = [lat for t, lat in ok if t >= half]
    drift = float(np.median(second) / np.median(first)) if first and second else math.nan
    if len(ok) < MIN_REQUESTS:
        return Steadiness(False, drift, answered, sent, f"{len(ok)} answers: too few to judge (at least "
                                                        f"{MIN_REQUESTS}; a longer window)")
    if sent < SENT:
        return Steadiness(False, drift, answered, sent, f"client-bound: sent {sent:.0%} of the offered rate")
    if answered < ANSWERED:
        return Steadiness(False, drift, answered, sent, f"answered {answered:.1%} of the requests sent")
    if not drift <= DRIFT:
        return Steadiness(False, drift, answered, sent, f"not sustained: the second half's median was {drift:.2f}x "
                                                        f"the first's")
    return Steadiness(True, drift, answered, sent, "steady")


@dataclass
class Probe:
    """One window of the search: the searched model's rate, its throughput, average and request count; the p99
    the SLA bounds (the latency-critical model's where one runs beside it)."""

    rate: float
    passed: bool
    p99_ms: float
    avg_ms: float
    throughput: float
    requests: int
    why: str
    guarded_avg_ms: float = math.nan  # beside a latency-critical model: its average in the window


@dataclass
class CapacitySearch:
    """The highest rate whose window is steady with its p99 within ``sla_ms`` (see the module's docstring)."""

    sla_ms: float
    start_rate: float
    steps: int = 5
    min_rate: float = 0.1
    max_rate: float = 100_000.0
    probes: list[Probe] = field(default_factory=list)
    bisections: int = 0  # windows measured once both a pass and a failure were known

    def __post_init__(self) -> None:
        if not self.sla_ms > 0:
            raise ValueError(f"the SLA must be a positive number of ms, got {self.sla_ms}")
        if not 0 < self.min_rate <= self.start_rate <= self.max_rate:
            raise ValueError(f"the starting rate must lie in [{self.min_rate:g}, {self.max_rate:g}] requests/s, "
                             f"got {self.start_rate:g}")

    @property
    def best(self) -> Probe | None:
        """The highest rate that passed, or None."""
        passed = [p for p in self.probes if p.passed]
        return max(passed, key=lambda p: p.rate) if passed else None

    @property
    def lowest_failure(self) -> Probe | None:
        failed = [p for p in self.probes if not p.passed]
        return min(failed, key=lambda p: p.rate) if failed else None

    def next_rate(self) -> float | None:
        """The next rate to measure, or None: the search is over."""
        if not self.probes:
            return self.start_rate
        best, fail = self.best, self.lowest_failure
        if fail is None:  # everything passed so far: double, up to max_rate
            return min(best.rate * 2, self.max_rate) if best.rate < self.max_rate else None
        if best is None:  # nothing passed: halve
            r = fail.rate / 2
            return r if r >= self.min_rate else None
        if self.bisections >= self.steps or fail.rate <= best.rate:
            return None
        return (best.rate + fail.rate) / 2

    def record(self, rate: float, result: Any, guarded: Any = None) -> Probe:
        """One window's ``LoadResult`` (client/load.py) at ``rate``: judged steady and within the SLA or not.
        ``guarded``: the latency-critical model's result in the same window, whose p99 the SLA bounds (the searched
        model then need only be sustained)."""
        s = steady(result.records, result.send_rate, result.duration_s)
        judged = result if guarded is None else guarded
        g = s if guarded is None else steady(guarded.records, guarded.send_rate, guarded.duration_s)
        p99 = float(judged.p99_ms)
        who = "" if guarded is None else f"{guarded.model}'s "
        if not s.steady:
            passed, why = False, s.why
        elif not g.steady:
            passed, why = False, f"{guarded.model}: {g.why}"
        elif not p99 <= self.sla_ms:
            passed, why = False, f"{who}p99 {p99:.1f} ms over the {self.sla_ms:g} ms SLA"
        else:
            passed, why = True, f"{who}p99 {p99:.1f} ms within the {self.sla_ms:g} ms SLA, {s.why}"
        probe = Probe(rate, passed, p99, float(result.avg_ms), float(result.throughput), result.sent, why,
                      float(guarded.avg_ms) if guarded is not None else math.nan)
        if self.best is not None and self.lowest_failure is not None:
            self.bisections += 1
        self.probes.append(probe)
        return probe

    def table(self) -> str:
        """The windows measured, in order, and the verdict."""
        lines = ["| rate /s | requests | avg ms | p99 ms | throughput /s | passed | why |",
                 "| --- | --- | --- | --- | --- | --- | --- |"]
        for p in self.probes:
            lines.append(f"| {p.rate:.1f} | {p.requests} | {p.avg_ms:.1f} | {p.p99_ms:.1f} | {p.throughput:.1f} | "
                         f"{'yes' if p.passed else 'no'} | {p.why} |")
        best, fail = self.best, self.lowest_failure
        if best is None:
            lines.append(f"\nCapacity under a p99 of {self.sla_ms:g} ms: below {self.probes[-1].rate:.1f}/s (no rate "
                         f"passed)")
        else:
            above = f", {fail.rate:.1f}/s failed" if fail is not None else " (the highest rate tried)"
            lines.append(f"\nCapacity under a p99 of {self.sla_ms:g} ms: {best.rate:.1f}/s{above}")
        return "\n".join(lines)
