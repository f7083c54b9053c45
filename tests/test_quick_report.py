"""benchmarks/bench_triton.py's verdict (the quickstart's table): best Triton / eager with the range over the
slices, a range across 1.00 called a tie (no server: synthetic cells)."""

from __future__ import annotations

import pytest

from tests.benchhelpers import load_benchmark


def row(model, avg, slices, sla=200.0, p99=50.0):
    return {"fraction": 0.1, "model": f"resnet50_{model}", "sla_ms": sla, "avg_ms": avg, "p99_ms": p99,
            "sent": 60, "slice_avg_ms": slices}


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_triton")


def verdict_row(bench, rows):
    lines = bench.verdict(rows, {"model": "resnet50"})
    assert len(lines) == 3  # header, rule, one load
    return [c.strip() for c in lines[2].strip("|").split("|")]


def test_a_range_across_one_is_a_tie_and_the_best_triton_is_the_lowest_mean(bench):
    rows = [row("eager", 27.0, [25.0, 27.0, 29.0]),
            row("eager", 40.0, [40.0, 40.0, 40.0], sla=100.0),  # the verdict reads the largest SLA's run
            row("triton_0us", 26.0, [27.5, 26.0, 24.5]), row("triton_5000us", 31.0, [31.0, 31.0, 31.0]),
            row("triton_20000us", 45.0, [45.0, 45.0, 45.0]), row("serial", 20.0, [20.0, 20.0, 20.0])]
    load, ratio, verdict, _, best, n = verdict_row(bench, rows)
    assert load == "10%" and best == "resnet50_triton_0us" and n == "60"  # serial is not a Triton config
    assert ratio == "0.96x [0.84-1.10]"
    assert verdict.startswith("tie")


@pytest.mark.parametrize("eager, expect", [([20.0, 21.0, 22.0], "eager level or ahead"),
                                           ([30.0, 29.0, 28.0], "eager behind")])
def test_every_slice_on_one_side_is_a_verdict(bench, eager, expect):
    rows = [row("eager", sum(eager) / 3, eager), row("triton_0us", 26.0, [26.0, 26.0, 26.0])]
    assert verdict_row(bench, rows)[2] == expect


def test_runs_without_slices_fall_back_to_the_pooled_ratio(bench):
    rows = [row("eager", 20.0, []), row("triton_0us", 26.0, [])]  # bench.json files older than the slice column
    _, ratio, verdict, *_ = verdict_row(bench, rows)
    assert ratio == "1.30x" and verdict == "eager level or ahead"
