"""The real-server BatchMonitor benchmark (benchmarks/bench_monitor_server.py) and the pieces it adds.

The quick mode runs a tiny MLP on a real tritonserver under every policy, on the seed's rate trace compressed to a
few seconds; the test checks that the report is well formed and that every request got exactly one answer (client
side: no error, no timeout; server side: the first stage ran each request once). Timings are never asserted.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks import bench_monitor_server
from lazybatch.backend.stats_logs import BatchLog, read_log
from lazybatch.client.load import schedule_from_rates



def test_schedule_from_rates_follows_the_trace() -> None:
    trace = [(0.0, 200.0), (5.0, 0.0), (10.0, 20.0)]
    offs = schedule_from_rates(trace, 20.0, seed=3)
    assert offs == sorted(offs) and all(0 <= o < 20.0 for o in offs)
    assert not [o for o in offs if 5.0 <= o < 10.0], "a zero-rate step sends nothing"
    n_hi = sum(1 for o in offs if o < 5.0)
    n_lo = sum(1 for o in offs if o >= 10.0)
    assert abs(n_hi - 1000) < 5 * math.sqrt(1000)  # Poisson counts: mean rate x time, within 5 sigma
    assert abs(n_lo - 200) < 5 * math.sqrt(200)
    assert offs == schedule_from_rates(trace, 20.0, seed=3)  # seeded
    assert schedule_from_rates(trace, 4.0, seed=3) == [o for o in offs if o < 4.0]  # a shorter run: a prefix


def test_batch_log_appends_one_line_per_batch(tmp_path: Path) -> None:
    log = BatchLog(tmp_path / "sub" / "m.batches.csv")
    log.record(0, 3, 0.01)
    log.record(1, 2, 0.02)
    log.close()
    log.record(0, 1, 0.5)  # reopens in append mode
    log.close()
    rows = read_log(tmp_path / "sub" / "m.batches.csv")
    assert [(int(r[1]), int(r[2])) for r in rows] == [(0, 3), (1, 2), (0, 1)]
    assert all(float(r[0]) > 1e9 for r in rows)


def test_read_log_leaves_a_line_still_being_written(tmp_path: Path) -> None:
    """The backend appends while tests and benchmarks read (a CI run once read ``<t>,3,`` and failed on int(''))."""
    path = tmp_path / "m.batches.csv"
    path.write_text("1.5,0,3,0.01\n2.5,1,3,0.02\n3.5,2,")
    assert read_log(path) == [["1.5", "0", "3", "0.01"], ["2.5", "1", "3", "0.02"]]
    path.write_text("3.5,2,")
    assert read_log(path) == []
    assert read_log(tmp_path / "missing.csv") == []


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    bench = bench_monitor_server
    with pytest.raises(SystemExit) as e:
        bench.main(["--policies", "monitor,nope"])
    assert e.value.code == 2 and "unknown policy 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--durations", "vgg19"])
    assert "--durations takes MODEL=SECONDS" in capsys.readouterr().err


def test_quick_mode_on_a_real_server(tmp_path: Path) -> None:
    bench = bench_monitor_server
    out = tmp_path / "out"
    assert bench.main(["--quick", "--duration", "4", "--out", str(out), "--work", str(tmp_path / "work")]) == 0
    data = json.loads((out / "bench.json").read_text())
    assert data["meta"]["durations"] == {"tiny": 4.0}
    (res,) = data["results"]
    assert set(res["rows"]) == {"monitor", "adhoc", "deadline", "triton", "lazy"}
    assert res["requests"] > 20 and res["sla_ms"] > 0 and res["mu"] > 0
    assert res["time_compression"] == pytest.approx(300 / 4)
    # the trace's 240 requests/s map to 1.1x the measured batch-1 rate (seed 0's walk peaks a little below 240)
    assert res["rate_scale"] == pytest.approx(1.1 * res["mu"] / 240)
    peak = max(r for _, r in res["trace"])
    assert 0.9 * 1.1 * res["mu"] <= peak <= 1.1 * res["mu"] * (1 + 1e-9)
    for policy, row in res["rows"].items():
        assert row["sent"] == res["requests"], policy  # every policy saw the same arrivals
        assert row["ok"] == row["sent"] and row["errors"] == 0 and row["unanswered"] == 0, (policy, row)
        assert row["executed"] == row["sent"], (policy, row)  # the server ran each request once (first stage)
        assert 1.0 <= row["mean_batch"] <= 8.0, (policy, row)
        assert 0 < row["p50_ms"] <= row["p99_ms"] and row["avg_ms"] > 0, (policy, row)
        assert 0.0 <= row["sla_violation"] <= 1.0
        series = res["series"][policy]
        assert len(series["latency"]) == row["ok"]
        assert all(0 <= t <= 300.0 + 1e-6 for t, _ in series["latency"])
        assert sum(1 for _ in series["batch"]) == row["batches"] > 0
    g = res["goals"]
    assert g["monitor_over_adhoc"] == pytest.approx(res["rows"]["monitor"]["avg_ms"] / res["rows"]["adhoc"]["avg_ms"])
    assert g["deadline_over_monitor"] > 0 and np.isfinite(g["deadline_over_monitor"])
    md = (out / "bench.md").read_text()
    for label in ("BatchMonitor", "AdHoc", "MaxBatchDeadline", "Triton", "LazyB", "goal <= 1.1x", "goal >= 10x"):
        assert label in md
    assert (out / "monitor_server_tiny.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
