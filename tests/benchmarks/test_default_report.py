"""The static-models benchmark's arithmetic (benchmarks/reports/default.py; its run schedule and routes,
benchmarks/bench_default.py): the best Triton configuration by its mean over repetitions against eager,
spread over repetitions, the A/A noise floor (Triton 0 ms against its twin), eager's routes, and a range that
straddles the goal called a tie (no server: synthetic cells)."""

from __future__ import annotations

import pytest

from benchmarks import bench_default as runner
from benchmarks.reports import default as bench_default


def cell(load, rep, policy, avg, p99, thr=10.0, viol=0.0):
    return {"driver": "load", "load": load, "rep": rep, "policy": policy, "avg_ms": avg, "p99_ms": p99,
            "throughput": thr, "violations": viol, "sent": 10, "ok": 10, "errors": 0}


@pytest.fixture(scope="module")
def bench():
    return bench_default


def test_best_triton_is_the_lowest_mean_configuration_and_ratios_spread(bench):
    cells = []
    # 5 ms is best in repetition 1 alone; 0 ms has the lowest mean (31 against 31.5): 0 ms is the one compared
    for rep, (t0, t5, twin, ours) in enumerate([(10.0, 12.0, 12.5, 8.0), (11.0, 9.0, 11.0, 10.0),
                                                (10.0, 10.5, 8.0, 10.0)]):
        cells += [cell(0.7, rep, "eager", ours, 20.0) | {"routes": {"inline": 9, "scheduler": 1}},
                  cell(0.7, rep, "triton_0us", t0, 25.0), cell(0.7, rep, "triton_5000us", t5, 30.0),
                  cell(0.7, rep, "triton_20000us", 50.0, 60.0), cell(0.7, rep, "triton_0us_twin", twin, 25.0)]
    res = {"model": "m", "t1_ms": 1.0, "sla_ms": 5.0, "cells": cells}
    row = bench.ratios(res, "load")[0]
    assert row["best"] == "triton_0us"
    assert row["avg"]["min"] == pytest.approx(1.0) and row["avg"]["max"] == pytest.approx(1.25)
    assert row["avg"]["mean"] == pytest.approx((1.25 + 1.1 + 1.0) / 3)
    assert row["p99"]["mean"] == pytest.approx(1.25)
    assert row["twin"]["min"] == pytest.approx(0.8) and row["twin"]["max"] == pytest.approx(1.25)
    assert row["inline"]["mean"] == pytest.approx(0.9)
    text = "\n".join(bench.report(res, "load"))
    # the copy strayed outside 0.90-1.10x in a repetition: the cell has no verdict of its own (counts as not met)
    assert ("| 70% | 0us | 1.12 [1.00-1.25] | no verdict: the noise floor read 0.80-1.25, outside 0.90-1.10 (run "
            "longer) | 1.02 [0.80-1.25] |") in text and "90% [90-90]" in text
    assert not row["settled"] and row["requests"] == {"eager": None, "triton_0us": None}


def test_a_settled_cell_is_judged_and_shows_its_requests_busy_time_and_client_bound_runs(bench):
    cells = []
    for rep, (t0, twin, ours) in enumerate([(10.0, 10.5, 8.0), (11.0, 10.5, 10.0), (10.0, 9.5, 9.0)]):
        extra = {"requests": 400, "busy": 0.5, "client_bound": rep == 2, "sustained": True}
        cells += [cell(0.9, rep, "eager", ours, 20.0) | extra, cell(0.9, rep, "triton_0us", t0, 25.0) | extra,
                  cell(0.9, rep, "triton_5000us", 30.0, 30.0) | extra,
                  cell(0.9, rep, "triton_20000us", 50.0, 60.0) | extra,
                  cell(0.9, rep, "triton_0us_twin", twin, 25.0) | extra]
    res = {"model": "m", "t1_ms": 1.0, "sla_ms": 5.0, "cells": cells}
    row = bench.ratios(res, "load")[0]
    assert row["settled"] and row["requests"] == {"eager": 1200, "triton_0us": 1200}
    text = "\n".join(bench.report(res, "load"))
    assert "| met; client-bound in a repetition |" in text and "| 1,200 / 1,200 | 50% |" in text
    cells[0]["requests"] = 100  # 900 for eager: its p99 is unresolved
    assert "900 (< 1,000: p99 unresolved) / 1,200" in "\n".join(bench.report(res, "load"))


def test_cells_without_twin_or_routes_still_render(bench):
    """The raw data of earlier rounds (no twin, no route counts) re-renders: those columns show "-"."""
    cells = [cell(0.4, 0, "eager", 10.0, 20.0), cell(0.4, 0, "triton_0us", 9.0, 18.0),
             cell(0.4, 0, "triton_5000us", 12.0, 18.0), cell(0.4, 0, "triton_20000us", 25.0, 30.0)]
    res = {"model": "m", "t1_ms": 1.0, "sla_ms": 5.0, "cells": cells}
    row = bench.ratios(res, "load")[0]
    assert row["twin"] is None and row["inline"] is None
    assert "| 40% | 0us | 0.90 [0.90-0.90] | missed | - |" in "\n".join(bench.report(res, "load"))


def test_route_counts_are_per_cell_differences(bench, tmp_path):
    import json

    path = tmp_path / "m_eager.json"
    path.write_text(json.dumps({"requests": 10, "inline_requests": 8, "inline_groups": 4, "span_runs": 1,
                                "inline_refused": {"scheduler busy": 2}}))
    first, seen = runner.routes(path, {})
    assert first == {"inline": 8, "scheduler": 2, "inline_groups": 4, "span_runs": 1, "refused": {"scheduler busy": 2}}
    path.write_text(json.dumps({"requests": 25, "inline_requests": 23, "inline_groups": 9, "span_runs": 1,
                                "inline_refused": {"scheduler busy": 2}}))
    second, _ = runner.routes(path, seen)
    assert second == {"inline": 15, "scheduler": 0, "inline_groups": 5, "span_runs": 0, "refused": {}}
    assert runner.routes(tmp_path / "missing.json", seen) == ({}, seen)


def test_verdicts(bench):
    from benchmarks.harness import verdict

    assert verdict({"min": 1.01, "max": 1.2}, 1.0) == "met"
    assert verdict({"min": 0.95, "max": 1.2}, 1.0).startswith("tie")
    assert verdict({"min": 0.8, "max": 0.9}, 1.0) == "missed"


def _cells(load, eager_factor, twin_factor):
    """One load's 3 repetitions: Triton 0 ms best at 10 ms (+/- per repetition), eager and the twin scaled from it
    (a factor, or one per repetition)."""
    def per_rep(f):
        return f if isinstance(f, (list, tuple)) else [f] * 3

    out = []
    for rep, (t0, e, t) in enumerate(zip([10.0, 11.0, 9.0], per_rep(eager_factor), per_rep(twin_factor))):
        out += [cell(load, rep, "triton_0us", t0, 20.0), cell(load, rep, "triton_5000us", t0 * 1.5, 30.0),
                cell(load, rep, "triton_20000us", t0 * 3, 60.0), cell(load, rep, "eager", t0 * e, 20.0),
                cell(load, rep, "triton_0us_twin", t0 * t, 20.0)]
    return out


def test_pooled_eager_like_the_twin_is_level(bench):
    """Eager 5% slower than Triton 0 ms in some cells, the twin 5% slower in as many: no systematic difference.
    (The twin's 70% cell jitters by repetition, so that the three session draws differ.)"""
    res = {"model": "m", "t1_ms": 1.0, "sla_ms": 5.0,
           "cells": _cells(0.1, 1.05, 1.0) + _cells(0.4, 1.0, 1.05) + _cells(0.7, 0.95, [1.0, 1.02, 0.98])
           + _cells(0.9, 1.0, 0.95)}
    p = bench.pooled([res], "load", restart=True)  # a fresh server per repetition: 3 session draws
    assert p["cells"] == 4 and p["models"] == ["m"] and p["draws"] == 3
    assert p["ratio"] == pytest.approx(1.0, abs=1e-3) and p["lo"] < 1.0 < p["hi"]
    assert p["verdict"].startswith("level")
    # the per-cell rule: eager missed at 10% (1/1.05 in every repetition), met elsewhere (a ratio of exactly 1.00
    # meets the goal); the twin missed at 40%, straddled at 70%, met elsewhere
    assert p["counts"]["eager"] == {"met": 3, "tie": 0, "missed": 1}
    assert p["counts"]["twin"] == {"met": 2, "tie": 1, "missed": 1}


def test_pooled_finds_a_cost_in_every_cell_that_no_cell_resolves(bench):
    """Eager 3% slower than an identical copy in every cell, under per-cell noise of +/-8% (each cell a tie, each
    noise floor within its 0.90-1.10 band): the pooled ratio says behind, about 0.97."""
    cells = []
    for i, load in enumerate([0.1, 0.4, 0.7, 0.9, 1.2, 2.0, 3.0]):
        noise = [1.08, 0.92, 1.0] if i % 2 else [0.92, 1.08, 1.0]
        cells += _cells(load, [1.03 * x for x in noise], noise[1:] + noise[:1])
    res = {"model": "m", "t1_ms": 1.0, "sla_ms": 5.0, "cells": cells}
    assert all(bench.verdict(r["avg"], 1.0).startswith("tie") for r in bench.ratios(res, "load"))
    p = bench.pooled([res], "load", restart=True)
    assert p["ratio"] == pytest.approx(1 / 1.03, rel=1e-3) and p["hi"] < 1.0 and p["verdict"] == "behind"
    assert "eager / an identical copy of Triton 0 ms 0.971 [90% interval" in "\n".join(
        bench.pooled_line([res], "load", restart=True))


def test_one_servers_cells_are_one_session_draw_and_give_no_interval(bench):
    """Without --restart every cell of a model ran on one server, with one pair of sessions: however many cells,
    that is one draw, and one draw resolves nothing (the same data with a server per repetition does)."""
    cells = []
    for load in (0.1, 0.4, 0.7):
        cells += _cells(load, 1.05, 1.0)
    res = {"model": "m", "t1_ms": 1.0, "sla_ms": 5.0, "cells": cells}
    p = bench.pooled([res], "load")
    assert p["draws"] == 1 and p["lo"] != p["lo"] and p["verdict"].startswith("unresolved")
    assert "no interval, 1 session draws" in "\n".join(bench.pooled_line([res], "load"))
    assert bench.pooled([res], "load", restart=True)["verdict"] == "behind"


def test_unsettled_cells_stay_out_of_the_pool(bench):
    """A cell whose identical copy strayed outside 0.90-1.10x in a repetition has no verdict and does not vote in
    the pooled figure; with none settled there is no figure at all."""
    settled = _cells(0.4, 1.05, 1.0)
    stray = _cells(0.9, 0.5, [1.0, 1.3, 1.0])  # eager 2x faster, but the copy read 0.77 in one repetition
    p = bench.pooled([{"model": "m", "t1_ms": 1.0, "sla_ms": 5.0, "cells": settled + stray}], "load", restart=True)
    assert p["cells"] == 2 and p["unsettled"] == 1 and p["ratio"] == pytest.approx(1 / 1.05, rel=1e-3)
    none = bench.pooled([{"model": "m", "t1_ms": 1.0, "sla_ms": 5.0, "cells": stray}], "load", restart=True)
    assert none["ratio"] != none["ratio"] and none["verdict"].startswith("unresolved (no sustained cell whose noise floor")
    assert "no figure [no settled cell]" in "\n".join(
        bench.pooled_line([{"model": "m", "t1_ms": 1.0, "sla_ms": 5.0, "cells": stray}], "load", restart=True))


def test_the_interval_resamples_session_draws_not_cells(bench):
    """Four models, one server each: eager's session is 12% slower on one of them, identical on the others. Seven
    cells of that one model are one unlucky draw, not seven pieces of evidence: resampling cells would call eager
    behind (its interval below 1.00); resampling the four draws calls it level."""
    results = []
    for i, name in enumerate(("a", "b", "c", "d")):
        cells = []
        for load in (0.1, 0.4, 0.7, 0.9, 1.2, 2.0, 3.0):
            cells += _cells(load, 1.12 if i == 0 else 1.0, 1.0)
        results.append({"model": name, "t1_ms": 1.0, "sla_ms": 5.0, "cells": cells})
    p = bench.pooled(results, "load")
    assert p["draws"] == 4 and p["ratio"] == pytest.approx(1.12 ** -0.25, rel=1e-3)
    assert p["lo"] < 1.0 <= p["hi"] and p["verdict"].startswith("level")
    import math
    import random
    diffs = [d for res in results for r in bench.ratios(res, "load") for _, d in r["log_diffs"]]
    rng = random.Random(0)
    cell_boot = sorted(sum(rng.choices(diffs, k=len(diffs))) / len(diffs) for _ in range(2000))
    assert math.exp(cell_boot[int(0.95 * 2000)]) < 1.0  # what resampling cells would have said: behind


def test_pooled_skips_rounds_without_a_twin(bench):
    res = {"model": "m", "t1_ms": 1.0, "sla_ms": 5.0,
           "cells": [c for c in _cells(0.4, 1.0, 1.0) if c["policy"] != "triton_0us_twin"]}
    assert bench.pooled([res], "load") is None and bench.pooled_line([res], "load") == []


def test_restart_schedule_runs_each_repetition_as_one_block(bench):
    """With --restart a server is started per (driver, repetition): that block's cells must be contiguous, or the
    run would restart at every cell (and lose the pairing of a repetition's policies on one server)."""
    plain = runner.schedule(["load"], [0.1, 0.7], 3, restart=False)
    assert plain[:3] == [("load", 0.1, 0), ("load", 0.1, 1), ("load", 0.1, 2)]
    steps = runner.schedule(["load", "perf"], [0.1, 0.7, 2.0], 2, restart=True)
    assert sorted(steps) == sorted(runner.schedule(["load", "perf"], [0.1, 0.7, 2.0], 2, restart=False))
    blocks = [(d, k) for d, _, k in steps]
    starts = [b for i, b in enumerate(blocks) if i == 0 or blocks[i - 1] != b]
    assert starts == [("load", 0), ("load", 1), ("perf", 0), ("perf", 1)]  # each block once: one server start each
    assert [f for d, f, k in steps if (d, k) == ("load", 1)] == [0.1, 0.7, 2.0]


def test_a_model_behind_on_its_own_is_named_though_the_pool_of_all_is_level():
    """"Never slower" holds per model: eager 12% behind on one model and 4% ahead on three pools level, and the
    page and README line still name the one model behind (default_page.behind_models)."""
    from benchmarks import default_page

    results = []
    for name, factor in (("slow", 1.12), ("a", 0.96), ("b", 0.96), ("c", 0.96)):
        cells = []
        for load in (0.1, 0.7, 2.0):
            cells += _cells(load, [factor * j for j in (1.0, 1.01, 0.99)], 1.0)
        results.append({"model": name, "t1_ms": 1.0, "sla_ms": 5.0, "cells": cells})
    assert bench_default.pooled(results, "load", restart=True)["verdict"].startswith("level")
    assert default_page.behind_models(results, "load", restart=True) == ["slow"]
    assert default_page.behind_models(results, "load", restart=False) == []  # one draw each: unresolved
    assert "slow 0.893 [90% interval" in "; ".join(default_page.model_lines(results, "load", True))
    line = default_page.readme_line({"meta": {"commit": "abc1234", "restart": True}, "results": results})
    assert line.startswith("| [Static models](docs/results/default.md) | eager vs Triton 0 ms: tie ")
    assert line.endswith("(lazybatch load); behind slow; abc1234 |")


def test_a_cell_where_a_queue_grew_is_judged_on_throughput_and_left_out_of_the_pool(bench):
    """Latency only at loads the configurations sustain: where eager's queue grew over the cell's runs, its average
    measures that growth, so the cell is judged on throughput (eager's / the best's) and does not vote in the pooled
    latency figure; a twin whose queue grew leaves it out of the pool too."""
    steady = _cells(0.4, 1.05, 1.0)
    over = _cells(0.9, 1.5, 1.0)  # eager 50% slower on average: its queue grew, at the same throughput
    for c in steady + over:
        c["drift"] = 1.6 if c["policy"] == "eager" and c["load"] == 0.9 else 1.0
    res = {"model": "m", "t1_ms": 1.0, "sla_ms": 5.0, "cells": steady + over}
    rows = {r["load"]: r for r in bench.ratios(res, "load")}
    assert rows[0.4]["sustained"] and not rows[0.9]["sustained"]
    assert rows[0.9]["unsustained"] == {"eager": pytest.approx(1.6)}
    assert rows[0.9]["throughput"]["mean"] == pytest.approx(1.0)
    said = bench.cell_verdict(rows[0.9])
    assert said.startswith("throughput eager / best Triton 1.00 [1.00-1.00]: met; not sustained (eager drift 1.60x")
    assert "no latency verdict" in said and bench.cell_verdict(rows[0.4]) == "missed"
    p = bench.pooled([res], "load", restart=True)
    assert p["cells"] == 2 and p["unsustained"] == 1 and p["ratio"] == pytest.approx(1 / 1.05, rel=1e-3)
    for c in over:  # the twin's queue grew instead: its ratio is no floor either
        c["drift"] = 1.6 if c["policy"] == "triton_0us_twin" else 1.0
    assert bench.pooled([res], "load", restart=True)["unsustained"] == 1
    assert "1 are left out too because a queue grew" in "\n".join(bench.pooled_line([res], "load", restart=True))
    assert bench.cell_verdict(bench.ratios(res, "load")[1]) == "missed; the copy's queue grew (drift 1.60x): no floor"
    for c in over:  # eager lost answers and its throughput is 10% lower: missed
        c["drift"] = 1.0
        if c["policy"] == "eager":
            c["throughput"], c["ok"] = 9.0, 9
    said = bench.cell_verdict(bench.ratios(res, "load")[1])
    assert ": missed; not sustained (eager lost answers" in said


def test_a_burst_in_one_repetition_is_not_a_queue_that_grew(bench):
    """A slow model's run holds too few requests to judge alone, and a repetition's arrivals are the same for every
    configuration: one burst in a second half reads over DRIFT in that repetition for all of them. Pooled over the
    repetitions it is no queue growth; a queue that grows in every repetition is."""
    cells = _cells(0.4, 1.0, 1.0)
    for c in cells:
        c["drift"] = [0.9, 1.0, 1.35][c["rep"]]
    row = bench.ratios({"model": "m", "t1_ms": 1.0, "sla_ms": 5.0, "cells": cells}, "load")[0]
    assert row["sustained"] and row["unsustained"] == {}
    for c in cells:
        c["drift"] = [1.3, 1.25, 1.35][c["rep"]]
    row = bench.ratios({"model": "m", "t1_ms": 1.0, "sla_ms": 5.0, "cells": cells}, "load")[0]
    assert not row["sustained"] and set(row["unsustained"]) == {"eager", "triton_0us"}


def test_before_against_after_is_reported_beside_the_twins_floor(bench):
    """``--before REV``: eager served from an earlier revision takes turns with the rest; the page gives before /
    after per load (above 1.00: the change made the default faster) beside Triton 0 ms / its twin."""
    cells = []
    for rep, (before, after) in enumerate([(11.0, 10.0), (9.9, 9.0)]):
        extra = {"requests": 500}
        cells += [cell(0.4, rep, "eager", after, 20.0) | extra, cell(0.4, rep, "eager_before", before, 22.0) | extra,
                  cell(0.4, rep, "triton_0us", 10.0, 25.0), cell(0.4, rep, "triton_0us_twin", 10.0, 25.0)]
    res = {"model": "m", "t1_ms": 1.0, "sla_ms": 5.0, "cells": cells}
    text = "\n".join(runner.before_lines(res, "load"))
    assert ("| 40% | 1.10 [1.10-1.10]: the change made it faster: above the floor | 1.10 [1.10-1.10] | "
            "1.00 [1.00-1.00] | 1,000 / 1,000 |") in text, text
    cells[-1]["avg_ms"] = 9.0  # the copy read 1.11 in a repetition: no verdict
    assert "no verdict" in "\n".join(runner.before_lines(res, "load"))
    cells[-1]["avg_ms"] = 9.5  # a floor of 1.00-1.05 that the change's 1.10 does not reach ... and one it does
    assert "above the floor" in "\n".join(runner.before_lines(res, "load"))
    for c in cells:
        if c["policy"] == "eager_before":
            c["avg_ms"] = c["avg_ms"] * 0.95  # 1.045 against a floor of 1.00-1.05
    assert "level: within the floor" in "\n".join(runner.before_lines(res, "load"))
    assert runner.before_lines({**res, "cells": [c for c in cells if c["policy"] != "eager_before"]}, "load") == []


def test_the_tree_before_a_change_is_laid_out_as_one_package(tmp_path):
    """``before_tree`` lays the packages of a git revision out as pyproject.toml maps them (batcher/ as
    lazybatch/batcher, ...), so a stub that puts it first on its path imports that revision whole."""
    tree = runner.before_tree("HEAD", tmp_path / "tree")
    for part in ("lazybatch/__init__.py", "lazybatch/batcher/scheduler.py", "lazybatch/backend/model.py",
                 "lazybatch/sessions/__init__.py", "lazybatch/client/load.py"):
        assert (tree / part).is_file(), part
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    runner.serve_before(model, tree)
    text = (model / "1" / "model.py").read_text()
    assert f"sys.path.insert(0, {str(tree)!r})" in text and "raise ImportError" in text


def test_a_met_or_missed_cell_the_copy_reaches_has_no_verdict(bench):
    """Eager 4-6% behind Triton 0 ms in every repetition is "missed" where the identical copy stayed level, and no
    result where the copy strayed as far (harness/method.py, floor_reaches)."""
    row = bench.ratios({"model": "m", "t1_ms": 1.0, "sla_ms": 5.0,
                        "cells": _cells(0.4, [1.04, 1.05, 1.06], [1.0, 1.01, 0.99])}, "load")[0]
    assert bench.cell_verdict(row) == "missed"
    row = bench.ratios({"model": "m", "t1_ms": 1.0, "sla_ms": 5.0,
                        "cells": _cells(0.4, [1.04, 1.05, 1.06], [1.0, 1.05, 0.99])}, "load")[0]
    assert bench.cell_verdict(row).startswith("no verdict: the noise floor read 0.95-1.01, reaching the figure's")
