"""The joined report of both load drivers (client/report.py), on files shaped like the drivers write them."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict

from lazybatch.client.load import LoadResult
from lazybatch.client.report import combined_rows, write_combined
from lazybatch.perf import PerfRow


def test_rows_of_both_drivers_side_by_side(tmp_path):
    load = LoadResult("m_lazy", 10.0, 5.0, 100.0, 1, sent=50, ok=49, errors=1, throughput=9.8, avg_ms=12.5,
                      p50_ms=11.0, p90_ms=15.0, p99_ms=30.0, sla_violation_rate=0.02)
    (tmp_path / "load.json").write_text(json.dumps([load.row() | {"error_kinds": {}}]))
    assert write_combined(tmp_path) is not None
    assert [r["driver"] for r in combined_rows(tmp_path)] == ["lazybatch load"]

    perf = [PerfRow("m_lazy", 10.0, 9.9, 13.0, 12.0, 16.0, 28.0, 0.5, 1.5, 10.0),
            PerfRow("a_serial", 20.0, 19.0, 50.0, 40.0, 60.0, 90.0, 0.5, 30.0, 10.0)]
    (tmp_path / "perf.json").write_text(json.dumps([asdict(r) for r in perf]))
    md = write_combined(tmp_path)
    rows = combined_rows(tmp_path)
    assert [(r["model"], r["rate"], r["driver"]) for r in rows] == [
        ("a_serial", 20.0, "perf_analyzer"), ("m_lazy", 10.0, "lazybatch load"), ("m_lazy", 10.0, "perf_analyzer")]
    loadrow = rows[1]
    assert loadrow["avg_ms"] == 12.5 and loadrow["sla_violation_rate"] == 0.02 and loadrow["errors"] == 1
    assert math.isnan(loadrow["server_queue_ms"])
    assert (rows[2]["server_queue_ms"], rows[2]["server_compute_ms"]) == (1.5, 10.0)
    assert math.isnan(rows[2]["sla_violation_rate"])
    with open(tmp_path / "report.csv") as f:
        assert len(list(csv.DictReader(f))) == 3
    text = md.read_text()
    assert "| m_lazy | 10 | lazybatch load | 9.80 | 12.50 |" in text
    assert "| m_lazy | 10 | perf_analyzer |" in text and "2.0%" in text


def test_nothing_to_join_writes_nothing(tmp_path):
    (tmp_path / "perf.json").write_text("not json")
    assert write_combined(tmp_path) is None
    assert not (tmp_path / "report.md").exists()


def test_streamed_rows_carry_time_to_first_token_from_both_drivers(tmp_path):
    load = LoadResult("lm", 4.0, 5.0, 100.0, 1, sent=20, ok=20, throughput=4.0, avg_ms=250.0, p50_ms=240.0,
                      p90_ms=400.0, p99_ms=600.0, ttft_avg_ms=20.0, ttft_p99_ms=45.0, tpot_avg_ms=6.0)
    (tmp_path / "load.json").write_text(json.dumps([load.row()]))
    perf = PerfRow("lm", 4.0, 3.9, 260.0, 250.0, 410.0, 620.0, 0.5, 0.1, 1.0, ttft_avg_ms=22.0, ttft_p99_ms=50.0,
                   tpot_avg_ms=6.5, streamed_requests=30)
    (tmp_path / "perf.json").write_text(json.dumps([asdict(perf)]))
    text = write_combined(tmp_path).read_text()
    assert "TTFT avg ms | TTFT p99 ms | TPOT avg ms |" in text
    assert text.splitlines()[2].endswith("| 20.00 | 45.00 | 6.00 |")  # lazybatch load's row first
    assert text.splitlines()[3].endswith("| 22.00 | 50.00 | 6.50 |")


def test_unstreamed_reports_keep_their_columns(tmp_path):
    perf = PerfRow("m", 10.0, 9.9, 13.0, 12.0, 16.0, 28.0, 0.5, 1.5, 10.0)
    (tmp_path / "perf.json").write_text(json.dumps([asdict(perf)]))
    assert "TTFT" not in write_combined(tmp_path).read_text()


def test_the_table_names_the_windows_that_were_not_sustained():
    """Past capacity an average measures the run's length: the table says which rows were not sustained, and why
    (client/capacity.py ``steady``), and leaves the sustained ones alone."""
    from lazybatch.client.report import format_table

    def result(model: str, growth_ms_per_s: float) -> LoadResult:
        r = LoadResult(model=model, offered_rate=100.0, duration_s=4.0, sla_ms=50.0, batch=1, sent=400, ok=400,
                       send_rate=100.0, throughput=100.0, avg_ms=10.0, p50_ms=10.0, p90_ms=10.0, p99_ms=10.0,
                       sla_violation_rate=0.0)
        r.records = [((i + 1) / 100, 10.0 + growth_ms_per_s * (i + 1) / 100, True) for i in range(400)]
        return r

    text = format_table([result("calm", 0.0), result("queued", 50.0)])
    assert "Not sustained" in text
    assert "queued @ 100/s: not sustained: the second half's median was" in text
    assert "calm @" not in text
    assert "Not sustained" not in format_table([result("calm", 0.0)])
