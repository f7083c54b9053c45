"""The capacity search (client/capacity.py) on synthetic windows: what counts as sustained, and the search finding
the highest rate within the SLA of a model whose latency is known by construction. The served search is in
tests/triton/test_load_capacity.py."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from lazybatch.client.capacity import CapacitySearch, steady


@dataclass
class Window:
    """The fields of a LoadResult the search reads."""

    duration_s: float
    records: list[tuple[float, float, bool]]
    p99_ms: float = math.nan
    avg_ms: float = math.nan
    throughput: float = 0.0
    sent: int = 0
    send_rate: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)


def window(rate: float, duration_s: float, latency, answered: float = 1.0, sent: float = 1.0) -> Window:
    """``rate x duration`` requests evenly spread, ``latency(t)`` ms each, the last ``1 - answered`` lost, sent by a
    client that kept ``sent`` of the schedule's pace."""
    n = int(rate * duration_s)
    recs = []
    for i in range(n):
        t = (i + 1) / rate
        ok = i < n * answered
        recs.append((t, latency(t) if ok else math.nan, ok))
    lats = sorted(lat for _, lat, ok in recs if ok)
    p99 = lats[min(len(lats) - 1, int(0.99 * len(lats)))] if lats else math.nan
    return Window(duration_s, recs, p99, sum(lats) / len(lats) if lats else math.nan, len(lats) / duration_s, n,
                  rate * sent, lats)


def test_a_steady_window_passes_and_each_way_of_not_sustaining_says_why():
    def judged(w: Window):
        return steady(w.records, w.send_rate, w.duration_s)

    assert judged(window(100, 4, lambda t: 10.0)).steady
    growing = judged(window(100, 4, lambda t: 10.0 + 20 * t))
    assert not growing.steady and growing.drift > 1.2 and "not sustained" in growing.why
    lost = judged(window(100, 4, lambda t: 10.0, answered=0.9))
    assert not lost.steady and "answered" in lost.why
    few = judged(window(4, 4, lambda t: 10.0))
    assert not few.steady and "too few" in few.why
    spiky = judged(window(100, 4, lambda t: 200.0 if t > 2 and int(t * 100) % 10 == 0 else 10.0))
    assert spiky.steady  # a few slow requests in one half move its mean, not its median: no queue grew
    client = judged(window(100, 4, lambda t: 10.0, sent=0.8))
    assert not client.steady and client.why.startswith("client-bound")


def fake_model(capacity: float, base_ms: float = 5.0):
    """A model whose latency is flat below ``capacity`` requests/s and whose queue grows with time above it."""
    def measure(rate: float, duration_s: float = 60.0) -> Window:  # long enough for MIN_REQUESTS at 5/s
        if rate <= capacity:
            return window(rate, duration_s, lambda t: base_ms * (1 + rate / capacity))
        return window(rate, duration_s, lambda t: base_ms + 1000 * t * (rate / capacity - 1))
    return measure


@pytest.mark.parametrize("capacity,start", [(37.0, 5.0), (37.0, 200.0), (8.0, 10.0)])
def test_the_search_brackets_the_capacity_within_its_last_step(capacity, start):
    measure = fake_model(capacity)
    search = CapacitySearch(sla_ms=20.0, start_rate=start, steps=6)
    rate = search.next_rate()
    while rate is not None:
        search.record(rate, measure(rate))
        rate = search.next_rate()
    best, fail = search.best, search.lowest_failure
    assert best is not None and fail is not None
    assert best.rate <= capacity < fail.rate
    assert fail.rate - best.rate <= capacity / 2 ** 5  # six bisections of a bracket at most 2x wide
    assert search.bisections == 6 and "Capacity under a p99 of 20 ms" in search.table()


def test_the_sla_bounds_the_capacity_before_the_queue_does():
    """Flat latency of 5 x (1 + rate / 40) ms: a 9 ms p99 bound is met up to 32/s, well below the 40/s capacity."""
    measure = fake_model(40.0)
    search = CapacitySearch(sla_ms=9.0, start_rate=8.0, steps=8)
    rate = search.next_rate()
    while rate is not None:
        search.record(rate, measure(rate))
        rate = search.next_rate()
    assert 31.0 <= search.best.rate <= 32.0 < search.lowest_failure.rate
    assert "over the 9 ms SLA" in search.lowest_failure.why


def test_nothing_passes_and_bad_arguments_are_refused():
    search = CapacitySearch(sla_ms=1.0, start_rate=40.0, min_rate=8.0)
    rate = search.next_rate()
    while rate is not None:
        search.record(rate, fake_model(100.0)(rate))
        rate = search.next_rate()
    assert search.best is None and [p.rate for p in search.probes] == [40.0, 20.0, 10.0]
    assert "no rate passed" in search.table()
    with pytest.raises(ValueError, match="SLA"):
        CapacitySearch(sla_ms=0, start_rate=1)
    with pytest.raises(ValueError, match="starting rate"):
        CapacitySearch(sla_ms=10, start_rate=0)


def test_beside_a_latency_critical_model_its_p99_bounds_the_best_effort_rate():
    """Heracles' question: the best-effort model's rate searched, the latency-critical one at a fixed rate beside
    it, whose p99 grows with its neighbour's load: the search stops where that p99 crosses its SLA, although the
    best-effort model itself would go on."""
    search = CapacitySearch(sla_ms=12.0, start_rate=10.0, steps=6)
    rate = search.next_rate()
    while rate is not None:
        be = fake_model(1000.0)(rate)
        lc = window(50.0, 8.0, lambda t, rate=rate: 5.0 + rate / 10)  # 12 ms at 70/s of best effort
        lc.model = "critical"
        search.record(rate, be, guarded=lc)
        rate = search.next_rate()
    assert 66.0 <= search.best.rate <= 70.0 < search.lowest_failure.rate
    assert "critical's p99" in search.lowest_failure.why and search.best.guarded_avg_ms <= 12.0
    sick = window(50.0, 8.0, lambda t: 5.0 + 30 * t)
    sick.model = "critical"
    assert "critical: not sustained" in CapacitySearch(12.0, 10.0).record(10.0, fake_model(1000.0)(10.0), sick).why
