"""benchmarks/bench_triton.py's verdict: best Triton / eager slice by slice, Triton's best
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


# The co-located pair's page (benchmarks/pair.py): synthetic runs, no server.

def pair_data(small_avg: dict[str, list[float]], alone: list[float], large_avg: float = 100.0) -> dict:
    """Runs of the pair: per configuration the small model's average per repetition (its p99 twice that), the large
    one's ``large_avg`` everywhere; ``alone``: the small model alone under lazybatch per repetition."""
    from benchmarks.colocation import pair

    configs = list(small_avg)
    runs = []

    def run(k, mode, cfg, role, avg):
        prefix = {"small": "mlp", "large": "resnet50"}[role]
        runs.append({"rep": k, "mode": mode, "config": cfg, "role": role, "model": f"{prefix}_{cfg}",
                     "start_unix": 0.0, "sent": 3, "ok": 3, "errors": 0, "avg_ms": avg, "p99_ms": 2 * avg,
                     "latencies_ms": [avg, avg, avg]})

    for k in range(len(alone)):
        for cfg in configs:
            run(k, "together", cfg, "small", small_avg[cfg][k])
            run(k, "together", cfg, "large", large_avg)
        run(k, "alone", configs[0], "small", alone[k])
        run(k, "alone", configs[0], "large", large_avg)
    meta = {"prefixes": {"small": "mlp", "large": "resnet50"}, "configs": configs,
            "t1_ms": {"small": 3.0, "large": 30.0}, "rates": {"small": 100.0, "large": 36.7},
            "loads": {"small": 0.3, "large": 1.1}, "duration_s": 3.0, "reps": len(alone)}
    assert pair.ROLES == ("small", "large")
    return {"meta": meta, "runs": runs}


def test_the_pair_scores_best_triton_over_lazybatch_held_out_with_the_one_rule():
    from benchmarks.colocation import pair

    data = pair_data({"eager_shared": [5.0, 5.0, 5.0], "triton_0us": [12.0, 9.0, 10.0],
                      "triton_5000us": [20.0, 20.0, 20.0]}, alone=[4.0, 4.0, 5.0])
    by = {v["figure"]: v for v in pair.score(data)}
    small = by["small avg: best Triton / lazybatch"]
    assert small["picks"] == ["triton_0us"] * 3
    assert (small["lo"], small["hi"]) == pytest.approx((1.8, 2.4))
    assert small["vs_one"] == "met" and small["vs_goal"] == "tie"  # 2x goal inside [1.8-2.4]: a tie, not a win
    large = by["large avg: best Triton / lazybatch"]
    assert large["ratio"] == pytest.approx(1.0) and large["vs_one"] == "met" and large["vs_goal"] == "met"
    alone = by["small avg under lazybatch: beside the large one / alone"]
    assert (alone["lo"], alone["hi"]) == pytest.approx((1.0, 1.25)) and alone["vs_goal"] == "met"
    text = pair.markdown(data)
    assert "| small avg: best Triton / lazybatch | 2.05x [1.80-2.40] | met | >= 2x | tie |" in text
    assert "| small mlp_eager_shared | lazybatch (CPU share) | alone | 9 | 0 | 4.3 | 5.0 |" in text
    assert "| small mlp_triton_5000us | Triton 5 ms | yes | 9 | 0 | 20.0 | 20.0 |" in text


def test_the_pair_calls_lazybatch_behind_only_where_every_repetition_says_so():
    from benchmarks.colocation import pair

    data = pair_data({"eager_shared": [10.0, 10.0, 10.0], "triton_0us": [9.0, 8.0, 11.0]}, alone=[4.0] * 3)
    small = pair.score(data)[0]
    assert small["vs_one"] == "tie" and small["vs_goal"] == "missed"  # [0.8-1.1]: a tie at 1.00, below 2x
    data = pair_data({"eager_shared": [10.0, 10.0, 10.0], "triton_0us": [9.0, 8.0, 7.0]}, alone=[4.0] * 3)
    assert pair.score(data)[0]["vs_one"] == "missed"


def test_the_pinned_baseline_needs_a_core_per_model():
    """Host policies pin the pair's small model to core 0 and the large one to the rest; on one core there is no
    pinned baseline (no flags, and the pair leaves PINNED out) instead of a failed run."""
    from benchmarks.colocation import pair

    assert pair.pinning_args(4) == [f"--host-policy={pair.PIN_POLICY['small']},cpu-cores=0-0",
                                   f"--host-policy={pair.PIN_POLICY['large']},cpu-cores=1-3"]
    assert pair.pinning_args(1) == [] and not pair.can_pin(1) and pair.can_pin(2)
