"""The co-located pair's page (benchmarks/pair.py): synthetic runs, no server."""

from __future__ import annotations

import pytest

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
