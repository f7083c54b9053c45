"""What benchmarks/bench_decoder.py prints, on synthetic cells (no server), and its simulated replay on a shipped table.

The served table's verdicts are computed from the cells; these check that a verdict can come out either way, that the
goal changes with the load band and the model, and that the replay runs the served policies' counterparts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lazybatch.batcher.lengths import LengthHistogram
from lazybatch.formats.histograms import shipped_histogram
from lazybatch.simulator import paper_tables
from benchmarks.reports import decoder as bench_decoder


@pytest.fixture(scope="module")
def bench():
    return bench_decoder


def _cells(load: float, eager: float, triton: dict[str, float], reps: int = 2) -> list[dict]:
    """Cells of one load; a Triton value per policy, the same in every repetition; p99 = 2 x avg."""
    out = []
    for k in range(reps):
        for pol, avg in {"eager": eager, **triton}.items():
            out.append({"load": load, "rep": k, "policy": pol, "sent": 10, "ok": 10, "errors": 0, "avg_ms": avg,
                        "p99_ms": 2 * avg, "throughput": 10.0 if pol == "eager" else 4.0, "violations": {}})
    return out


def _row(lines: list[str], load: str) -> str:
    return next(ln for ln in lines if ln.startswith(f"| {load} |"))


def test_the_goal_depends_on_the_load_band_and_the_model(bench):
    tri = {"triton_0us": 130.0, "triton_5000us": 120.0, "triton_20000us": 500.0}
    cells = _cells(0.1, 100.0, tri) + _cells(1.0, 100.0, tri)
    lines = bench.report({"model": "transformer", "t1_ms": 100.0, "cells": cells})
    row_10, row_100 = _row(lines, "10%"), _row(lines, "100%")
    assert "| 5000us | 1.20 [1.20-1.20] | >= 1: met |" in row_10  # outside 70-150%: never worse
    assert "| 5000us | 1.20 [1.20-1.20] | >= 1.5: missed |" in row_100  # in the band: 1.5x on seq2seq models
    lm = bench.report({"model": "lm", "t1_ms": 100.0, "cells": _cells(1.0, 100.0, tri)})
    assert ">= 3: missed" in _row(lm, "100%")  # the LM's goal is 3x, on p99 as well
    lm = bench.report({"model": "lm", "t1_ms": 100.0,
                       "cells": _cells(1.0, 100.0, {"triton_0us": 350.0, "triton_5000us": 310.0,
                                                    "triton_20000us": 500.0})})
    assert "| 5000us | 3.10 [3.10-3.10] | >= 3: met | 3.10 [3.10-3.10] | met |" in _row(lm, "100%")
    # peak throughput 10/s against 4/s, judged per repetition
    assert "(2.50x on the means; per repetition 2.50-2.50x; goal >= 2x: met)" in "\n".join(lm)


def test_a_spread_that_straddles_the_goal_is_a_tie(bench):
    cells = _cells(1.0, 100.0, {"triton_0us": 140.0, "triton_5000us": 900.0, "triton_20000us": 900.0}, reps=1)
    cells += [{**c, "rep": 1, "avg_ms": c["avg_ms"] * (1.2 if c["policy"] == "triton_0us" else 1.0)}
              for c in cells]
    row = _row(bench.report({"model": "gnmt", "t1_ms": 100.0, "cells": cells}), "100%")
    assert "| 0us | 1.54 [1.40-1.68] | >= 1.5: tie (the spread straddles the goal) |" in row


def test_perf_analyzer_cells_have_no_request_counts_and_say_where_the_load_came_from(bench):
    """perf_analyzer counts no requests for the benchmark (a failed request fails its run): the table says whose
    load it was and reports no error count it does not have."""
    tri = {"triton_0us": 150.0, "triton_5000us": 160.0, "triton_20000us": 170.0}
    cells = [{**c, "sent": None, "ok": None, "errors": None, "violations": None, "records": None}
             for c in _cells(0.7, 100.0, tri)]
    lines = bench.report({"model": "gnmt", "t1_ms": 100.0, "driver": "perf_analyzer", "cells": cells})
    assert lines[0].endswith(", load from perf_analyzer")
    assert "| 0us | 1.50 [1.50-1.50] | >= 1.5: met |" in _row(lines, "70%")
    assert any(ln.startswith("Errors: none (perf_analyzer stops at the first failed request") for ln in lines)
    assert not bench.report({"model": "gnmt", "t1_ms": 100.0, "cells": _cells(0.7, 100.0, tri)})[0].endswith(
        "perf_analyzer")


def test_a_configuration_perf_analyzer_measured_nothing_of_is_named_and_not_chosen_as_best(bench):
    """perf_analyzer exits with "No valid requests recorded" where no request ends inside its windows (Triton's
    batcher on the LM at 70%). The cell holds no figures; that configuration cannot be the best Triton at that load
    (it was the fastest in the other repetition: chosen, the ratio would be made of one repetition of the fastest),
    and the table names the cell."""
    tri = {"triton_0us": 130.0, "triton_5000us": 150.0, "triton_20000us": 900.0}
    cells = [{**c, "sent": None, "ok": None, "errors": None, "violations": None, "records": None}
             for c in _cells(0.7, 100.0, tri)]
    nothing = {"avg_ms": None, "p99_ms": None, "throughput": None, "measured_nothing": "no request ended"}
    cells = [c | nothing if (c["policy"], c["rep"]) == ("triton_0us", 1) else c for c in cells]
    lines = bench.report({"model": "gnmt", "t1_ms": 100.0, "driver": "perf_analyzer", "cells": cells})
    assert "| 70% | 5000us | 1.50 [1.50-1.50] | >= 1.5: met |" in _row(lines, "70%")
    assert "Measured nothing (no request ended inside perf_analyzer's windows; not a candidate for best Triton at " \
           "that load): triton_0us at 70%, repetition 2." in lines
    # eager measured nothing in one repetition: that repetition has no ratio; in none: the load has no verdict
    one = [c | nothing if (c["policy"], c["rep"]) == ("eager", 0) else c for c in cells]
    assert "| 70% | 5000us | 1.50 [1.50-1.50] |" in _row(bench.report({"model": "gnmt", "t1_ms": 100.0,
                                                                        "driver": "perf_analyzer", "cells": one}), "70%")
    none = [c | nothing if c["policy"] == "eager" else c for c in cells]
    assert "none measured in every repetition" in _row(bench.report(
        {"model": "gnmt", "t1_ms": 100.0, "driver": "perf_analyzer", "cells": none}), "70%")
    from benchmarks import decoder_page
    rows = decoder_page.decoder_goals({"model": "gnmt", "cells": none}, "perf_analyzer")
    assert rows[0][5].startswith("not measured") and "1 not measured." in decoder_page.goals_table(rows)[-1]


def test_perf_row_tells_measured_nothing_from_a_failed_run(tmp_path, monkeypatch):
    """Only perf_analyzer's "no valid requests" exit becomes PerfMeasuredNothing; any other failure stops a sweep."""
    from benchmarks.harness import measure
    import lazybatch.cli

    def fake_cli(text):
        def run(cmd):
            folder = Path(cmd[cmd.index("--out") + 1])
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "perf_m.log").write_text(text)
            return 3
        return run
    monkeypatch.setattr(lazybatch.cli, "main", fake_cli(measure.NOTHING_IN_WINDOW + ". Please use a larger window."))
    with pytest.raises(measure.PerfMeasuredNothing, match="no request ended inside perf_analyzer's 10000 ms windows"):
        measure.perf_row("u", "m", 1.0, 30.0, 0, tmp_path)
    monkeypatch.setattr(lazybatch.cli, "main", fake_cli("Failed to maintain requested inference load."))
    with pytest.raises(SystemExit, match="perf_analyzer failed on m"):
        measure.perf_row("u", "m", 1.0, 30.0, 0, tmp_path)


def test_simulated_replay_runs_the_served_policies_counterparts(bench):
    table = paper_tables.shipped_table("transformer")
    hist = LengthHistogram.load(shipped_histogram("wmt"))
    sim = bench.simulated(table, hist, [0.7, 1.5], sla_ms=5000.0)
    assert {c["policy"] for c in sim["cells"]} == set(bench.SIM_POLICIES)
    assert sim["seeds"] == bench.SIM_SEEDS and sim["requests"] == bench.SIM_REQUESTS
    by = {(c["load"], c["policy"]): c for c in sim["cells"]}
    # Past the batch-1 rate a batcher that holds each batch to its longest member falls behind step-level batching
    assert by[1.5, "eager"]["avg_ms"] < min(by[1.5, p]["avg_ms"] for p in bench.TRITON)
    lines = bench.simulated_report(sim)
    assert lines[0].startswith(f"Simulated on this run's latency table (no serving cost; t1 {sim['t1_ms']:.1f} ms")
    assert _row(lines, "70%") and _row(lines, "150%")


def test_a_variant_is_reported_against_the_best_triton_and_against_eager_in_the_same_repetition(bench):
    cells = _cells(1.2, 100.0, {"triton_0us": 150.0, "triton_5000us": 180.0, "triton_20000us": 900.0,
                                "eager_join": 80.0}, reps=1)
    cells += [{**c, "rep": 1, "avg_ms": c["avg_ms"] * (1.25 if c["policy"] == "eager" else 1.0)} for c in cells]
    lines = bench.report({"model": "gnmt", "t1_ms": 100.0, "cells": cells})
    assert "Variant `eager_join` (eager:join=benefit), same turns as the table above:" in lines
    # best Triton (0us) 150 / 80; eager 100 and 125 over 80 repetition by repetition
    assert "| 120% | 1.88 [1.88-1.88] | 1.41 [1.25-1.56] |" in _row(lines[lines.index(
        "Variant `eager_join` (eager:join=benefit), same turns as the table above:"):], "120%")
    assert not any(ln.startswith("Variant") for ln in bench.report(
        {"model": "gnmt", "t1_ms": 100.0, "cells": _cells(1.2, 100.0, {"triton_0us": 150.0, "triton_5000us": 180.0,
                                                                         "triton_20000us": 900.0})}))


def test_the_replay_runs_a_variant_beside_the_served_policies(bench):
    table = paper_tables.shipped_table("transformer")
    hist = LengthHistogram.load(shipped_histogram("wmt"))
    sim = bench.simulated(table, hist, [1.5], sla_ms=5000.0, variants=["eager_join"])
    assert {c["policy"] for c in sim["cells"]} == set(bench.SIM_POLICIES) | {"eager_join"}
