"""`lazybatch npu ...`: tables the simulator reads, single-layer queries, clear errors with exit code 2."""

from __future__ import annotations

import json

import pytest

from lazybatch.batcher.latency_table import LatencyTable

from .npuhelpers import conv_mlp


def test_latency_writes_a_table_the_simulator_runs(cli, small_split, tmp_path):
    d = small_split("gnmt")
    out = tmp_path / "npu_gnmt.json"
    rc, stdout, _ = cli("npu", "latency", d, "--batch", "1,2,4,8", "--out", out, "--quiet", "--dataflow", "os")
    assert rc == 0, stdout
    table = LatencyTable.load(out)
    assert table.batch_sizes == (1, 2, 4, 8)
    assert table.meta["npu"]["dataflow"] == "os"
    assert "systolic-array" in table.provenance
    assert "stage_000" in stdout and "energy (uJ)" in stdout
    rc, stdout, stderr = cli("simulate", "--model", out, "--policy", "lazy", "--policy", "graph:5", "--rate", "50",
                             "--seeds", "1", "--requests", "40", "--max-batch-size", "8", "--no-plots", "--quiet",
                             "--jobs", "1", "--out", tmp_path / "sim")
    assert rc == 0, stderr


def test_latency_on_one_onnx_file_and_flags(cli, tmp_path):
    m = conv_mlp(tmp_path / "m.onnx")
    out = tmp_path / "t.csv"
    rc, stdout, _ = cli("npu", "latency", m, "--batch", "1,4", "--out", out, "--quiet", "--array", "32x32",
                        "--nodes", "3", "--dtype-bytes", "2")
    assert rc == 0
    assert "32x32" in stdout and "conv" in stdout
    t = LatencyTable.load(out)
    assert t.graph.n == 1 and t.latency(0, 4) >= t.latency(0, 1)


def test_layer_query(cli):
    rc, stdout, _ = cli("npu", "layer", "--conv", "10,10,4,3,3,12,1", "--array", "8x8", "--dataflow", "os")
    assert rc == 0
    assert json.loads(stdout)["array_cycles"] == 800  # see test_npu_systolic
    rc, stdout, _ = cli("npu", "layer", "--gemm", "1,4096,4096", "--batch", "2")
    assert rc == 0 and json.loads(stdout)["macs"] == 2 * 4096 * 4096


def test_config_file(cli, tmp_path):
    conf = tmp_path / "npu.json"
    conf.write_text(json.dumps({"rows": 64, "cols": 32}))
    rc, stdout, _ = cli("npu", "config", "--config", conf, "--freq-mhz", "1000")
    assert rc == 0
    got = json.loads(stdout)
    assert (got["rows"], got["cols"], got["freq_hz"]) == (64, 32, 1e9)


def test_errors_exit_2_with_a_message(cli, tmp_path):
    m = conv_mlp(tmp_path / "m.onnx")
    bad_conf = tmp_path / "bad.json"
    bad_conf.write_text(json.dumps({"dataflow": "rs"}))
    cases = [
        (("npu", "latency", tmp_path / "nothing_here", "--batch", "1"), "neither a file"),
        (("npu", "latency", m, "--batch", "2,4"), "batch size 1"),
        (("npu", "latency", m, "--batch", "1,x"), "integers"),
        (("npu", "latency", m, "--batch", "1", "--array", "12"), "128x128"),
        (("npu", "latency", m, "--batch", "1", "--config", bad_conf), "dataflow"),
        (("npu", "latency", m, "--batch", "1", "--dtype-bytes", "3"), "data width"),
        (("npu", "layer", "--conv", "3,3,1,5,5,1,1"), "kernel is larger"),
        (("npu", "layer", "--gemm", "1,2"), "M,K,N"),
    ]
    for argv, msg in cases:
        rc, _, stderr = cli(*argv)
        assert rc == 2, argv
        assert stderr.startswith("lazybatch npu: error:") and msg in stderr, (argv, stderr)


def test_shipped_paper_tables_load_by_name(cli, tmp_path):
    from lazybatch.npu_model.paper import MODELS, table_path
    from lazybatch.simulator.sweep import load_table

    for model in MODELS:
        t = LatencyTable.load(table_path(model))
        assert t.max_batch_size == 64 and t.meta["npu"]["rows"] == 128
        assert load_table(f"npu_{model}").name == t.name
        for row in t.measured:
            assert row == sorted(row)
    rc, _, stderr = cli("simulate", "--model", "npu_resnet50", "--policy", "serial", "--rate", "100", "--seeds", "1",
                        "--requests", "20", "--no-plots", "--quiet", "--jobs", "1", "--out", tmp_path / "s")
    assert rc == 0, stderr


def test_paper_scaled_tables_hit_table_ii():
    from lazybatch.npu_model.paper import MODELS, PAPER_SINGLE_MS, scaled_to_paper, table_path

    for model in MODELS:
        t = scaled_to_paper(model)
        assert t.whole_graph_latency(1, 17, 17) * 1e3 == pytest.approx(PAPER_SINGLE_MS[model])
        base = LatencyTable.load(table_path(model))
        k = t.meta["scaled_by"]
        assert t.latency(0, 64) == pytest.approx(base.latency(0, 64) * k)


def test_validate_without_scalesim_says_how_to_install(cli, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "scalesim", None)
    monkeypatch.setitem(sys.modules, "scalesim.scale_sim", None)
    rc, _, stderr = cli("npu", "validate", "--limit", "1")
    assert rc == 2 and "npu-validate" in stderr
