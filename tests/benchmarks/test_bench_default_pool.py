"""How the standing guard (benchmarks/bench_default.py) pools a cell's segments: every answer of `lazybatch load`
into one average and p99, perf_analyzer's figures weighted by their requests, and a queue that grows through each
segment called unsustained."""

from __future__ import annotations

import math

import numpy as np

from benchmarks.bench_default import pool_perf
from benchmarks.harness.measure import pool_load


def _segment(latencies: list[float], duration: float = 2.0, sent: int | None = None) -> dict:
    n = len(latencies)
    records = [(duration * i / n, lat, True) for i, lat in enumerate(latencies)]
    return {"sent": n if sent is None else sent, "ok": n, "errors": 0, "latencies": latencies, "records": records,
            "send_rate": n / duration, "duration": duration}


def test_a_cells_answers_are_pooled_over_its_segments():
    a, b = [1.0] * 300, [3.0] * 100
    c = pool_load([_segment(a), _segment(b)], sla_ms=2.5)
    assert c["requests"] == 400 and math.isclose(c["avg_ms"], 1.5)  # pooled, not the mean of 1.0 and 3.0
    assert math.isclose(c["p99_ms"], float(np.percentile(a + b, 99)))
    assert math.isclose(c["violations"], 100 / 400) and math.isclose(c["throughput"], 400 / 4.0)
    assert c["sustained"]


def test_a_queue_growing_through_every_segment_is_not_sustained():
    growing = [1.0 + 9.0 * i / 300 for i in range(300)]  # each segment's second half far slower than its first
    c = pool_load([_segment(growing), _segment(growing)], sla_ms=100.0)
    assert c["drift"] > 1.2 and not c["sustained"]
    lost = pool_load([_segment([1.0] * 300, sent=400)], sla_ms=100.0)  # a quarter never answered
    assert not lost["sustained"]


def test_perf_analyzer_segments_are_weighted_by_their_requests():
    c = pool_perf([{"avg_ms": 1.0, "p99_ms": 2.0, "throughput": 100.0, "requests": 300},
                   {"avg_ms": 3.0, "p99_ms": 6.0, "throughput": 50.0, "requests": 100}])
    assert math.isclose(c["avg_ms"], 1.5) and math.isclose(c["p99_ms"], 3.0) and c["requests"] == 400
    failed = pool_perf([{"avg_ms": math.nan, "p99_ms": math.nan, "throughput": 0.0, "requests": 0}])
    assert math.isnan(failed["avg_ms"])  # a run that measured nothing is named, not averaged in
