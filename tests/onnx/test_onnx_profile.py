"""lazybatch profile: real onnxruntime timings written in the scheduler's LatencyTable format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.lengths import LengthHistogram
from lazybatch.onnx_tools.profile import parse_batch_sizes


@pytest.fixture
def resnet_dir(tmp_path: Path, cli) -> Path:
    assert cli("export", "resnet50", "--small", "--out", tmp_path / "r.onnx")[0] == 0
    assert cli("split", tmp_path / "r.onnx", "--out", tmp_path / "r")[0] == 0
    return tmp_path / "r"


def test_profile_writes_latency_table_and_plot(resnet_dir: Path, cli) -> None:
    rc, out, err = cli("profile", resnet_dir, "--batch-sizes", "1,2,4", "--warmup", "1", "--repeat", "3")
    assert rc == 0, err
    table = LatencyTable.load(resnet_dir / "latency.json")
    man = json.loads((resnet_dir / "manifest.json").read_text())
    assert [s.name for s in table.graph.stages] == [s["name"] for s in man["stages"]]
    assert table.batch_sizes == (1, 2, 4) and table.name == "resnet50_small"
    assert all(v > 0 for row in table.measured for v in row)
    assert table.latency(0, 3) == pytest.approx((table.latency(0, 2) + table.latency(0, 4)) / 2)  # interpolated
    assert len(table.meta["whole_graph_latency_s"]) == 3 and len(table.meta["overhead_ratio"]) == 3
    assert table.meta["provider"] == "CPUExecutionProvider"
    assert (resnet_dir / "latency.png").stat().st_size > 1000
    assert "sum of stages / whole graph" in out


def test_profile_csv_output(resnet_dir: Path, tmp_path: Path, cli) -> None:
    rc, _, err = cli("profile", resnet_dir, "--batch-sizes", "1,2", "--repeat", "1", "--warmup", "0",
                     "--out", tmp_path / "t.csv", "--no-plot", "--no-whole")
    assert rc == 0, err
    t = LatencyTable.load(tmp_path / "t.csv")
    assert t.batch_sizes == (1, 2) and not (tmp_path / "t.png").exists()


def test_profile_seq2seq_with_length_histogram(tmp_path: Path, cli) -> None:
    assert cli("export", "gnmt", "--small", "--out", tmp_path / "g.onnx")[0] == 0
    assert cli("split", tmp_path / "g.onnx", "--out", tmp_path / "g")[0] == 0
    LengthHistogram([5, 10, 20], [7, 2, 1], provenance="test").save(tmp_path / "h.json")
    rc, _, err = cli("profile", tmp_path / "g", "--batch-sizes", "1,4", "--repeat", "2", "--no-plot",
                     "--length-histogram", tmp_path / "h.json")
    assert rc == 0, err
    t = LatencyTable.load(tmp_path / "g" / "latency.json")
    assert {s.type.value for s in t.graph.stages} == {"ENCODER", "DECODER"} and t.graph.is_seq2seq
    assert t.meta["dec_timesteps_90"] == 10


def test_profile_bad_provider_and_sizes(resnet_dir: Path, cli) -> None:
    rc, _, err = cli("profile", resnet_dir, "--provider", "NopeExecutionProvider", "--batch-sizes", "1")
    assert rc == 2 and "not available" in err and "CPUExecutionProvider" in err
    rc, _, err = cli("profile", resnet_dir, "--batch-sizes", "2,4")
    assert rc == 2 and "must start at 1" in err
    rc, _, err = cli("profile", resnet_dir.parent, "--batch-sizes", "1")
    assert rc == 2 and "no manifest.json" in err
    assert not (resnet_dir / "latency.json").exists()


def test_parse_batch_sizes() -> None:
    assert parse_batch_sizes("1,2,4,...,64") == [1, 2, 4, 8, 16, 32, 64]
    assert parse_batch_sizes("1-4") == [1, 2, 3, 4]
    assert parse_batch_sizes("1,8,32") == [1, 8, 32]
