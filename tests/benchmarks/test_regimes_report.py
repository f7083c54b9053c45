"""The goal verdicts bench_regimes.py writes on the results page, on synthetic cells (no server).

The page's claims are computed from the cells; these check that a verdict can come out either way and that the
ceiling and capacity figures are the arithmetic the page says they are.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.regimes import page, replay, verdicts


def _cell(policy: str, load: float, avg: float, thr: float, sent: float, viol: float = 0.0) -> dict:
    return {"policy": policy, "load": load, "avg_ms": avg, "throughput": thr, "send_rate": sent, "rate": sent,
            "violation": {"5x": viol}}


def _res(regime: str, cells: list[dict], t1_lazy: float = 10.0, t1: float = 8.0) -> dict:
    return {"model": "m", "cells": cells, "sched_multiple": 5.0, "t1_ms": t1, "t1_lazy_ms": t1_lazy, "mu": 100.0,
            "max_batch_size": 8, "scaling": {"regime": regime, "batch_sizes": [1, 2], "whole_ms": [10.0, 19.0]}}


def test_latency_ceiling_says_when_2x_is_out_of_reach():
    cells = []
    for f, tri in ((0.4, 15.0), (0.9, 18.0)):  # the best Triton config waits less than 2x t1_lazy (10 ms)
        cells += [_cell("lazy", f, 12.0, f * 100, f * 100), _cell("serial", f, 20.0, f * 100, f * 100),
                  _cell("triton_0us", f, tri, f * 100, f * 100)]
    cells += [_cell("lazy", 2.0, 20.0, 200, 200), _cell("serial", 2.0, 900.0, 110, 200),
              _cell("triton_0us", 2.0, 50.0, 200, 200)]
    lines = verdicts.goals(_res("batching pays", cells))
    text = "\n".join(lines)
    assert "40%: 1.25x vs triton_0us, 90%: 1.50x vs triton_0us -> NOT met" in text
    assert "bounds it: 40%: 1.50x, 90%: 1.80x" in text and "out of reach at 40%, 90% on this machine" in text
    # without per-stage cost the bound scales by t1_lazy / t1
    assert "40%: 1.88x, 90%: 2.25x" in text
    assert "200%: 2.50x vs triton_0us" in text  # beyond mu, reported
    assert "ratio 1.82x (goal >= 1.2x) -> met" in text


def test_latency_goal_met_prints_no_ceiling():
    cells = []
    for f in (0.4, 0.9):
        cells += [_cell("lazy", f, 10.0, f * 100, f * 100), _cell("serial", f, 20.0, f * 100, f * 100),
                  _cell("triton_5000us", f, 25.0, f * 100, f * 100)]
    text = "\n".join(verdicts.goals(_res("batching pays", cells)))
    assert "40%: 2.50x vs triton_5000us, 90%: 2.50x vs triton_5000us -> met" in text
    assert "Ceiling" not in text


def test_no_gain_goal_judges_capacity_where_serial_is_past_it():
    cells = [_cell("lazy", 0.4, 50.0, 40, 40), _cell("serial", 0.4, 48.0, 40, 40),
             # past capacity: the queue grows, lazy's average 1.3x serial's, but the capacities differ by 2%
             _cell("lazy", 1.2, 1300.0, 98, 120), _cell("serial", 1.2, 1000.0, 100, 120)]
    text = "\n".join(verdicts.goals(_res("no batching gain", cells)))
    assert "40%: 1.04, 120%: 1.30 -> goal (<= 1.10 at every load) NOT met on average latency" in text
    assert "where serial keeps up (40%: 1.04)" in text and "120%: 1.02) -> met" in text
    # a real capacity loss fails it
    cells[2] = _cell("lazy", 1.2, 1300.0, 80, 120)
    text = "\n".join(verdicts.goals(_res("no batching gain", cells)))
    assert "120%: 1.25) -> NOT met" in text


def test_batch_cap_matches_the_policy_rule_and_fused_lazy_is_named():
    # linear (no gain), one slow run at batch 2 (skipped), a knee after 2
    for whole, cap in (([10.0, 19.0, 37.0, 75.0], 1), ([10.0, 21.0, 12.0, 13.0], 8), ([10.0, 11.0, 30.0, 70.0], 2)):
        assert replay.batch_cap({"batch_sizes": [1, 2, 4, 8], "whole_ms": whole}, 8) == cap, whole
    res = _res("no batching gain", [_cell("lazy", 0.4, 40.0, 40, 40), _cell("serial", 0.4, 48.0, 40, 40)])
    res["cells"][0]["overhead_per_stage_ms"] = 0.2
    res["stages"] = 20
    res["lazy_fused"] = "20 stages run as one whole-graph pass (fuse_stages: auto, ...)"
    text = "\n".join(verdicts.why(res, SimpleNamespace(sched_sla_multiple=5.0)))
    assert "median 0.200 ms per whole-graph pass" in text  # not 0.2 x 20 stages
    assert "runs each request through the whole graph" in text
    assert "lazy ran whole passes, serial stage by stage" in "\n".join(verdicts.goals(res))


def test_lazy_fused_is_measured_against_lazy_not_counted_among_all_policies():
    cells = []
    for f, (stg, fus) in ((0.4, (10.0, 12.0)), (0.9, (20.0, 15.0))):
        cells += [_cell("lazy", f, stg, f * 100, f * 100, viol=0.05),
                  _cell("lazy_fused", f, fus, f * 100, f * 100, viol=0.01),  # the variant has fewer violations
                  _cell("serial", f, 30.0, f * 100, f * 100, viol=0.2),
                  _cell("triton_0us", f, 25.0, f * 100, f * 100, viol=0.1)]
    for c in cells:
        c["overhead_per_stage_ms"] = 0.3 if c["policy"] == "lazy_fused" else 0.1
    res = _res("batching pays", cells) | {"stages": 8}
    text = "\n".join(verdicts.goals(res))
    assert "lowest at 2 of 2 loads -> met" in text  # lazy is not judged against its own variant
    why = "\n".join(verdicts.why(res, SimpleNamespace(sched_sla_multiple=5.0)))
    assert "lazy_fused / lazy per load: 40%: 1.20, 90%: 0.75" in why
    assert "violations at 5x lazy_fused / lazy: 40%: 1%/5%, 90%: 1%/5%" in why
    assert "median 0.300 ms per whole-graph pass" in why
    assert page.variants_in([res]) == {"lazy_fused": ["m"]}
    assert "lazy_inline" not in why  # not measured here
    # and a model measured without it says nothing about it
    plain = _res("batching pays", [c for c in cells if c["policy"] != "lazy_fused"]) | {"stages": 8}
    assert "lazy_fused" not in "\n".join(verdicts.why(plain, SimpleNamespace(sched_sla_multiple=5.0)))


def test_lazy_fused_model_directory_asks_for_whole_graph_passes(tmp_path):
    from benchmarks.regimes.policies import parameters_for
    from lazybatch.shipped import build_default_repository

    policies = {"lazy": "lazy", "lazy_fused": "lazy", "lazy_inline": "lazy"}
    repo = build_default_repository(tmp_path / "repo", kind="tiny", work=tmp_path / "build", profile_reps=1,
                                    policies=policies, parameters=parameters_for(policies), log=lambda m: None)
    fused = (repo / "tiny_lazy_fused" / "config.pbtxt").read_text()
    assert 'key: "fuse_stages"' in fused and 'string_value: "true"' in fused
    inline = (repo / "tiny_lazy_inline" / "config.pbtxt").read_text()
    assert 'key: "response_thread"' in inline and 'string_value: "false"' in inline
    plain = (repo / "tiny_lazy" / "config.pbtxt").read_text()
    assert "fuse_stages" not in plain and "response_thread" not in plain


def _sim(avg: dict[str, float], load: float = 0.4, viol: dict[str, float] | None = None) -> dict:
    viol = viol or {}
    return {"t1_ms": 5.0, "mu": 200.0, "seeds": 3, "requests": 1000, "sla_multiples": [5.0], "sched_multiple": 5.0,
            "max_batch_size": 8,
            "cells": [{"load": load, "policy": p, "rate": load * 200, "avg_ms": a, "p99_ms": a, "throughput": load * 200,
                       "mean_batch": 1.0, "violations": {"5x": viol.get(p, 0.0)}} for p, a in avg.items()]}


def test_simulated_goal_says_whether_the_algorithm_itself_reaches_2x():
    base = {"lazy": 10.0, "oracle": 9.0, "serial": 30.0, "graph_0ms": 12.0, "graph_5ms": 15.0, "graph_20ms": 25.0}
    res = _res("batching pays", []) | {"simulated": _sim(base, viol={"lazy": 0.02, "oracle": 0.01})}
    text = "\n".join(verdicts.simulated_goals(res))
    assert "40%: 1.20x vs graph_0ms" in text and "stays under 2x at 40%" in text
    assert "fewest 5x violations at 0 of 1 loads" in text
    res["simulated"] = _sim(base | {"graph_0ms": 25.0, "graph_5ms": 30.0})
    text = "\n".join(verdicts.simulated_goals(res))
    assert "40%: 2.50x vs graph_0ms" in text and "meets 2x on this table" in text
    assert "fewest 5x violations at 1 of 1 loads" in text
    assert verdicts.simulated_goals(_res("no batching gain", []) | {"simulated": _sim(base)}) == []
    table = "\n".join(verdicts.simulated_table(res))
    assert "| 40% | 10.00 | 9.00 | 30.00 | 25.00 | 30.00 | 25.00 | 2.50x (graph_0ms) | 0.0% | 0.0% (lazy) | 1.00x |" in table


def test_results_from_before_the_simulation_get_it_from_their_runs_table(tmp_path):
    from tests.simhelpers import flat_table

    table = flat_table(4, unit=1e-3, max_batch=8)
    d = tmp_path / "repos" / "m" / "m_lazy" / "1"
    d.mkdir(parents=True)
    table.save(d / "latency.json")
    st = SimpleNamespace(sla_multiples=[2.0, 5.0], sched_sla_multiple=5.0)
    res = _res("batching pays", [_cell("lazy", 0.5, 1.0, 1.0, 1.0)])
    replay.add_simulated(res, st, None)  # nowhere to find a table: left without
    assert "simulated" not in res
    replay.add_simulated(res, st, tmp_path)
    assert res["latency_table"]["model"] == table.graph.name
    assert {c["load"] for c in res["simulated"]["cells"]} == {0.5}
    assert res["simulated"]["t1_ms"] == pytest.approx(4.0)


def _sliced(policy: str, load: float, slices: list[float], p99: float = 50.0) -> dict:
    return _cell(policy, load, sum(slices) / len(slices), 10, 10) | {"slice_avg_ms": slices,
                                                                     "slice_p99_ms": [p99] * len(slices)}


def test_default_against_the_best_baseline_counts_ties_as_ties():
    cells = [  # 40%: eager equal to Triton 0 ms up to noise (a tie); 90%: eager lower in every slice (met)
        _sliced("eager", 0.4, [10.0, 11.0, 9.0]), _sliced("lazy", 0.4, [20.0, 20.0, 20.0]),
        _sliced("triton_0us", 0.4, [10.5, 10.0, 9.5]), _sliced("triton_5000us", 0.4, [15.0, 15.0, 15.0]),
        _sliced("eager", 0.9, [10.0, 10.0, 10.0]), _sliced("lazy", 0.9, [30.0, 30.0, 30.0]),
        _sliced("triton_0us", 0.9, [12.0, 13.0, 12.5]), _sliced("triton_5000us", 0.9, [20.0, 20.0, 20.0])]
    lines = verdicts.default_vs_best(_res("batching pays", cells))
    rows = [line for line in lines if line.startswith("| 40%") or line.startswith("| 90%")]
    assert "| tie |" in rows[0] and "1.00x [0.91-1.06]" in rows[0] and "triton_0us x3" in rows[0]
    assert "| met |" in rows[1] and "1.25x [1.20-1.30]" in rows[1]
    assert "| missed |" in rows[0] and "| missed |" in rows[1]  # lazy, twice as slow, in the same table
    assert lines[-1] == "Per load, eager: 1 met, 1 tie, 0 missed; lazy: 0 met, 0 tie, 2 missed."


def test_default_against_the_best_baseline_needs_slices():
    cells = [_cell("eager", 0.4, 10.0, 10, 10), _cell("triton_0us", 0.4, 10.0, 10, 10)]
    assert "kept no per-slice figures" in verdicts.default_vs_best(_res("batching pays", cells))[0]
    one = [_sliced("eager", 0.4, [10.0]), _sliced("triton_0us", 0.4, [10.0])]
    assert "One slice per cell" in verdicts.default_vs_best(_res("batching pays", one))[0]


def test_the_shared_table_is_found_when_lazy_is_left_out(tmp_path):
    """--policies without lazy (e.g. eager against Triton's configurations only) used to stop with "cannot read
    latency table" before serving anything: the run reads the table any scheduled policy's directory holds."""
    (tmp_path / "m_triton_0us" / "1").mkdir(parents=True)  # Triton's configurations have no table
    (tmp_path / "m_eager" / "1").mkdir(parents=True)
    (tmp_path / "m_eager" / "1" / "latency.json").write_text("{}")
    assert replay.lazy_table_path(tmp_path, "m") == tmp_path / "m_eager" / "1" / "latency.json"
    (tmp_path / "m_lazy" / "1").mkdir(parents=True)
    (tmp_path / "m_lazy" / "1" / "latency.json").write_text("{}")
    assert replay.lazy_table_path(tmp_path, "m") == tmp_path / "m_lazy" / "1" / "latency.json"
