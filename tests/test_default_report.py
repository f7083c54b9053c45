"""benchmarks/bench_default.py's arithmetic: per repetition the best Triton configuration against eager, spread over
repetitions, and a range that straddles the goal called a tie (no server: synthetic cells)."""

from __future__ import annotations

import pytest

from tests.benchhelpers import load_benchmark


def cell(load, rep, policy, avg, p99, thr=10.0, viol=0.0):
    return {"driver": "load", "load": load, "rep": rep, "policy": policy, "avg_ms": avg, "p99_ms": p99,
            "throughput": thr, "violations": viol, "sent": 10, "ok": 10, "errors": 0}


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_default")


def test_best_triton_is_chosen_per_repetition_and_ratios_spread(bench):
    cells = []
    for rep, (t0, t5, ours) in enumerate([(10.0, 12.0, 8.0), (11.0, 9.0, 10.0), (10.0, 10.0, 10.0)]):
        cells += [cell(0.7, rep, "eager", ours, 20.0), cell(0.7, rep, "triton_0us", t0, 25.0),
                  cell(0.7, rep, "triton_5000us", t5, 30.0), cell(0.7, rep, "triton_20000us", 50.0, 60.0)]
    res = {"model": "m", "t1_ms": 1.0, "sla_ms": 5.0, "cells": cells}
    row = bench.ratios(res, "load")[0]
    assert row["avg"]["min"] == pytest.approx(0.9) and row["avg"]["max"] == pytest.approx(1.25)
    assert row["avg"]["mean"] == pytest.approx((1.25 + 0.9 + 1.0) / 3)
    assert row["p99"]["mean"] == pytest.approx(1.25)
    text = "\n".join(bench.report(res, "load"))
    assert "tie" in text and "| 70% |" in text


def test_verdicts(bench):
    from harness import verdict

    assert verdict({"min": 1.01, "max": 1.2}, 1.0) == "met"
    assert verdict({"min": 0.95, "max": 1.2}, 1.0).startswith("tie")
    assert verdict({"min": 0.8, "max": 0.9}, 1.0) == "missed"
