"""``lazybatch simulate`` end to end, as a user runs it."""

from __future__ import annotations

import csv
import json

import pytest

from lazybatch.batcher.lengths import LengthHistogram
from lazybatch.cli import main
from lazybatch.formats.histograms import shipped_histogram
from lazybatch.simulator import paper_tables


def test_sweep_writes_tables_files_and_plots(tmp_path, capsys):
    out = tmp_path / "res"
    rc = main(["simulate", "--model", "resnet50", "--model", "gnmt", "--policy", "serial", "--policy", "graph:5",
               "--policy", "lazy", "--policy", "oracle", "--rate", "100,800", "--sla-ms", "20,100", "--seeds", "2",
               "--requests", "200", "--jobs", "2", "--out", str(out), "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "== resnet50" in text and "== gnmt" in text and "LazyB vs the best GraphB(N)" in text
    for f in ("runs.csv", "summary.csv", "lazyb_vs_graphb.csv", "results.json", "fig12_latency_vs_rate.png",
              "fig13_throughput_vs_rate.png", "fig14_latency_cdf.png", "fig15_sla_violation.png"):
        assert (out / f).stat().st_size > 0, f
    rows = list(csv.DictReader((out / "summary.csv").open()))
    # 2 models x 2 rates x 2 SLA targets x 4 policies, averaged over 2 seeds
    assert len(rows) == 32 and {r["seeds"] for r in rows} == {"2"}
    doc = json.loads((out / "results.json").read_text())
    assert doc["config"]["runs"] == 2 * (2 * 2 * 2 + 2 * 2 * 2 * 2)  # SLA-aware policies run once per target
    assert all(sum(h["hist"].values()) > 0 for h in doc["batch_size_histograms"])


def test_user_table_and_trace(tmp_path, capsys):
    table = paper_tables.resnet50()
    path = table.save(tmp_path / "mine.csv")
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s\n" + "".join(f"{i * 0.001}\n" for i in range(50)))
    rc = main(["simulate", "--model", str(path), "--policy", "lazy", "--policy", "graph:5", "--trace", str(trace),
               "--seeds", "1", "--out", str(tmp_path / "o"), "--no-plots", "--jobs", "1"])
    assert rc == 0
    assert "== mine" in capsys.readouterr().out


def test_explain_prints_decisions(capsys):
    assert main(["simulate", "--model", "resnet50", "--policy", "lazy", "--rate", "2000", "--requests", "50",
                 "--explain", "5"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("resnet50 under lazy(max_batch_size=64)")
    assert len(lines) == 6 and all(" stage=" in ln for ln in lines[1:])


@pytest.mark.parametrize("args, message", [
    (["--rate", "0"], "arrival rates must be positive"),
    (["--model", "alexnet"], "unknown model 'alexnet'"),
    (["--policy", "fifo"], "unknown policy 'fifo'"),
    (["--sla-ms", "abc"], "expected comma-separated numbers"),
    (["--max-batch-size", "128"], "covers batch sizes up to 64, but max_batch_size is 128"),
    (["--length-histogram", "/nonexistent.json", "--model", "gnmt"], "cannot read length histogram"),
])
def test_bad_input_exits_2_with_a_clear_message(tmp_path, capsys, args, message):
    rc = main(["simulate", "--requests", "10", "--seeds", "1", "--out", str(tmp_path), "--no-plots", *args])
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs.csv").exists()


def test_shipped_tables_match_their_generator_and_table_ii():
    for name, builder in paper_tables.BUILDERS.items():
        assert paper_tables.shipped_table(name).to_dict() == builder().to_dict(), name
    assert LengthHistogram.load(shipped_histogram()).to_dict() == paper_tables.length_histogram().to_dict()
    mean = paper_tables.length_histogram().mean()
    # Table II single-input latencies (seq2seq at the histogram's mean lengths)
    assert paper_tables.shipped_table("resnet50").whole_graph_latency() == pytest.approx(1.1e-3)
    for name, ms in (("gnmt", 7.2), ("transformer", 2.4)):
        t = paper_tables.shipped_table(name)
        single = sum(t.single[s] * (1 if t.graph.loop_type[s] is None else mean) for s in range(t.graph.n))
        assert single == pytest.approx(ms * 1e-3), name
