"""benchmarks/bench_regimes.py end to end in its quickest form: a tiny model on a real tritonserver, both drivers.

Checks what the results page claims can be trusted for: every cell was measured, the client's counts agree with
the server's, the backend's statistics add up, and the page's tables are well formed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import bench_regimes

POLICIES = ["lazy", "serial", "triton_0us", "monitor"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    out = tmp_path_factory.mktemp("regimes")
    bench = bench_regimes
    rc = bench.main(["--quick", "--models", "tiny", "--loads", "0.3", "--perf-loads", "0.3", "--duration", "1.5",
                     "--perf-measurement-ms", "500", "--policies", ",".join(POLICIES), "--out", str(out),
                     "--page", str(out / "page.md"), "--img-dir", str(out / "img")])
    assert rc == 0
    return json.loads((out / "results.json").read_text()), (out / "page.md").read_text(), out


def test_every_cell_measured_and_counts_agree_with_the_server(quick_run):
    data, _, _ = quick_run
    (res,) = data["results"]
    assert res["model"] == "tiny" and res["t1_ms"] > 0 and res["mu"] == pytest.approx(1e3 / res["t1_ms"])
    assert sorted(c["policy"] for c in res["cells"]) == sorted(POLICIES)
    for c in res["cells"]:
        assert c["sent"] > 0, c
        assert c["ok"] + c["errors"] == c["sent"], c
        # Triton counted exactly the requests the client sent (its warm-up request excluded)
        assert c["server_requests"] == c["sent"], c
        assert c["mean_batch"] >= 1.0, c
        v = list(c["violation"].values())
        assert all(0.0 <= x <= 1.0 for x in v) and v == sorted(v, reverse=True), c  # looser SLA, fewer late
        assert c["p50_ms"] <= c["p99_ms"]
        if c["policy"] == "serial":
            assert c["mean_batch"] == 1.0 and c["preemptions"] == 0 and c["merges"] == 0
        if c["policy"] == "lazy":
            assert c["preemptions"] is not None and 0 <= c["merges"] <= c["preemptions"]
        if c["policy"].startswith("triton"):
            assert c["preemptions"] is None  # Triton's batcher: no lazybatch scheduler, no decisions
    perf = {p["policy"]: p for p in res["perf"]}
    assert sorted(perf) == sorted(POLICIES)
    for p in perf.values():
        assert p["error"] is None, p
        assert p["server_requests"] > 0 and p["throughput"] > 0 and not math.isnan(p["avg_ms"]), p


def test_scaling_curve_is_from_the_profiled_table(quick_run):
    data, _, out = quick_run
    sc = data["results"][0]["scaling"]
    assert sc["batch_sizes"][0] == 1 and len(sc["batch_sizes"]) == len(sc["per_sample_ms"]) == len(sc["whole_ms"])
    assert sc["per_sample_ms"][0] == pytest.approx(sc["whole_ms"][0])
    assert sc["gain"] >= 1.0 and sc["regime"]
    assert (out / "img" / "regimes_scaling.png").stat().st_size > 0
    assert (out / "img" / "regimes_tiny.png").stat().st_size > 0


def test_page_tables_are_well_formed(quick_run):
    data, page, _ = quick_run
    meta = data["meta"]
    assert meta["command"].startswith("python -m benchmarks.bench_regimes --quick")
    assert meta["command"] in page and meta["onnxruntime"] in page and "tritonserver 2." in page
    assert "shared with other jobs" in page
    tables: list[list[str]] = []
    cur: list[str] = []
    for line in page.splitlines() + [""]:
        if line.startswith("|"):
            cur.append(line)
        elif cur:
            tables.append(cur)
            cur = []
    assert len(tables) == 4  # scaling, simulated on the table, lazybatch load, perf_analyzer
    for t in tables:
        widths = {row.count("|") for row in t}
        assert len(widths) == 1, t  # every row has the header's number of columns
        assert set(t[1].replace("|", "").split()) == {"---"}
    load_rows = [r for r in tables[2][2:]]
    assert len(load_rows) == len(POLICIES)
    for row, cell in zip(load_rows, sorted(data["results"][0]["cells"], key=lambda c: POLICIES.index(c["policy"]))):
        cols = [c.strip() for c in row.strip("|").split("|")]
        assert cols[1] == cell["policy"] and int(cols[-1]) == cell["errors"]
    assert len(tables[3]) - 2 == len(POLICIES)
    assert "## tiny:" in page and "### Goals" in page
    sim = data["results"][0]["simulated"]  # the same load on a virtual clock, from the table the run profiled
    assert len(tables[1]) - 2 == len({c["load"] for c in sim["cells"]}) == 1
    assert {c["policy"] for c in sim["cells"]} == {"lazy", "lazy_benefit", "oracle", "serial", "graph_0ms", "graph_5ms",
                                                 "graph_20ms"}
    assert sim["t1_ms"] == pytest.approx(sum(data["results"][0]["scaling"]["whole_ms"][:1]), rel=1e-6)
