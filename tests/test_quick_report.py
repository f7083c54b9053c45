"""benchmarks/bench_triton.py's verdict (the quickstart's table): best Triton / eager slice by slice, Triton's best
chosen on the other slices, with the range over the slices, a range across 1.00 called a tie; the same for the
identical copy of Triton 0 ms (the noise floor). No server: synthetic cells."""

from __future__ import annotations

import pytest

from benchmarks import bench_triton


def row(model, avg, slices, sla=200.0, p99=50.0):
    return {"fraction": 0.1, "model": f"resnet50_{model}", "sla_ms": sla, "avg_ms": avg, "p99_ms": p99,
            "sent": 60, "slice_avg_ms": slices}


@pytest.fixture(scope="module")
def bench():
    return bench_triton


def verdict_row(bench, rows):
    lines = bench.verdict(rows, {"model": "resnet50"})
    assert len(lines) == 3  # header, rule, one load
    return [c.strip() for c in lines[2].strip("|").split("|")]


def test_a_range_across_one_is_a_tie_and_the_best_triton_is_chosen_on_the_other_slices(bench):
    rows = [row("eager", 27.0, [25.0, 27.0, 29.0]),
            row("eager", 40.0, [40.0, 40.0, 40.0], sla=100.0),  # the verdict reads the largest SLA's run
            row("triton_0us", 26.0, [27.5, 26.0, 24.5]), row("triton_5000us", 31.0, [31.0, 31.0, 31.0]),
            row("triton_20000us", 45.0, [45.0, 45.0, 45.0]), row("serial", 20.0, [20.0, 20.0, 20.0])]
    load, ratio, verdict, noise, _, best, n = verdict_row(bench, rows)
    assert load == "10%" and best == "triton_0us x3" and n == "60"  # serial is not a Triton config
    geo = (27.5 / 25.0 * 26.0 / 27.0 * 24.5 / 29.0) ** (1 / 3)
    assert ratio == f"{geo:.2f}x [0.84-1.10]"
    assert verdict.startswith("tie") and noise == "-"  # no twin in this run


def test_held_out_choice_removes_the_bias_against_a_copy_of_triton():
    """Two Triton configurations with the same mean whose noise takes turns, and eager equal to their mean in
    every slice: chosen on the scored slice, the lower of the two wins every slice and eager can never be ahead;
    held out, the choice does not see the scored slice's noise."""
    bench = bench_triton
    a = row("triton_0us", 30.0, [25.0, 35.0, 30.0])
    b = row("triton_5000us", 30.0, [35.0, 25.0, 30.0])
    eager = row("eager", 30.0, [30.0, 30.0, 30.0])
    ratios, picks = bench.held_out_ratios({r["model"]: r["slice_avg_ms"] for r in (a, b)}, eager["slice_avg_ms"])
    assert [round(r, 3) for r in ratios] == [round(35 / 30, 3), round(35 / 30, 3), 1.0]
    assert picks[:2] == ["resnet50_triton_5000us", "resnet50_triton_0us"]
    in_sample = [min(a["slice_avg_ms"][k], b["slice_avg_ms"][k]) / 30.0 for k in range(3)]
    assert max(in_sample) <= 1.0  # what the old rule saw: never above 1, "behind" or at best level
    assert bench.level(ratios) == "eager level or ahead"


def test_the_twin_is_scored_by_the_same_rule_and_never_chosen_as_best(bench):
    rows = [row("eager", 26.0, [26.0, 26.0, 26.0]), row("triton_0us", 26.0, [25.0, 26.0, 27.0]),
            row("triton_0us_twin", 20.0, [19.0, 20.0, 21.0])]
    _, ratio, verdict, noise, _, best, _ = verdict_row(bench, rows)
    assert best == "triton_0us x3"  # the twin is faster here but it is the noise floor, not a configuration
    assert verdict.startswith("tie") and noise.endswith("level or ahead") and noise.startswith("1.30x")


@pytest.mark.parametrize("eager, expect", [([20.0, 21.0, 22.0], "eager level or ahead"),
                                           ([30.0, 29.0, 28.0], "eager behind")])
def test_every_slice_on_one_side_is_a_verdict(bench, eager, expect):
    rows = [row("eager", sum(eager) / 3, eager), row("triton_0us", 26.0, [26.0, 26.0, 26.0])]
    assert verdict_row(bench, rows)[2] == expect


def test_runs_without_slices_fall_back_to_the_pooled_ratio(bench):
    rows = [row("eager", 20.0, []), row("triton_0us", 26.0, [])]  # bench.json files older than the slice column
    _, ratio, verdict, *_ = verdict_row(bench, rows)
    assert ratio == "1.30x" and verdict == "eager level or ahead"
