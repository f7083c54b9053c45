"""Latency tables, length histograms, traces and policy specs: round trips and clear errors on bad input."""

from __future__ import annotations

import json

import pytest

from lazybatch.batcher import ConfigError, LatencyTable, LengthHistogram, ModelGraph, Request, StageType, parse_policy
from lazybatch.simulator import workload


def table() -> LatencyTable:
    g = ModelGraph("m", [("a", StageType.STATIC), ("e", StageType.ENCODER), ("d", "decoder")])
    return LatencyTable(g, [1, 4, 8], [[1e-3, 2e-3, 4e-3], [1e-4, 1e-4, 2e-4], [3e-4, 3e-4, 5e-4]],
                        provenance="test")


def test_json_and_csv_round_trip(tmp_path):
    t = table()
    for name in ("t.json", "t.csv"):
        p = t.save(tmp_path / name)
        back = LatencyTable.load(p)
        assert [s.type for s in back.graph.stages] == [StageType.STATIC, StageType.ENCODER, StageType.DECODER]
        assert back.batch_sizes == (1, 4, 8)
        assert back.measured == t.measured
    data = json.loads((tmp_path / "t.json").read_text())
    assert data["format"] == "lazybatch.latency_table/1" and data["unit"] == "s"


def test_interpolates_between_measured_batch_sizes():
    t = table()
    assert t.latency(0, 2) == pytest.approx(1e-3 + (2e-3 - 1e-3) / 3)
    assert t.latency(0, 6) == pytest.approx(3e-3)
    with pytest.raises(ValueError, match="outside the table's range 1..8"):
        t.latency(0, 9)


def test_unit_ms_is_converted(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"unit": "ms", "batch_sizes": [1, 2],
                             "stages": [{"name": "x", "latency": [1.5, 2.0]}]}))
    assert LatencyTable.load(p).latency(0, 1) == pytest.approx(1.5e-3)


@pytest.mark.parametrize("doc, match", [
    ({"batch_sizes": [1], "stages": []}, "field 'stages'"),
    ({"batch_sizes": [2, 4], "stages": [{"name": "x", "latency": [1, 2]}]}, "batch size 1 is missing"),
    ({"batch_sizes": [1, 2], "stages": [{"name": "x", "latency": [1]}]}, "has 1 latencies for 2 batch sizes"),
    ({"batch_sizes": [1, 2], "stages": [{"name": "x", "latency": {"1": 1}}]}, r"no latency for batch sizes \[2\]"),
    ({"batch_sizes": [1], "stages": [{"name": "x", "type": "RECURRENT", "latency": [1]}]},
     "unknown stage type 'RECURRENT'"),
    ({"batch_sizes": [1], "stages": [{"name": "x", "latency": [-1]}]}, "must be a positive number"),
    ({"batch_sizes": [1], "stages": [{"latency": [1]}]}, r"stages\[0\].name"),
    ({"batch_sizes": [1], "stages": [{"name": "x", "latency": [1]}, {"name": "x", "latency": [1]}]},
     "repeated: x"),
    ({"format": "other/2", "batch_sizes": [1], "stages": [{"name": "x", "latency": [1]}]}, "unsupported format"),
    ({"unit": "minutes", "batch_sizes": [1], "stages": [{"name": "x", "latency": [1]}]}, "unknown unit"),
])
def test_bad_tables_name_the_field(tmp_path, doc, match):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=match) as e:
        LatencyTable.load(p)
    assert str(p) in str(e.value)


def test_malformed_files(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        LatencyTable.load(p)
    c = tmp_path / "bad.csv"
    c.write_text("stage,batch_size,latency_s\nx,1,0.1\nx,2,0.2\ny,1,0.1\n")
    with pytest.raises(ConfigError, match=r"stage 'y' has no latency for batch sizes \[2\]"):
        LatencyTable.load(c)
    c.write_text("name,size\nx,1\n")
    with pytest.raises(ConfigError, match="CSV header"):
        LatencyTable.load(c)
    with pytest.raises(ConfigError, match="cannot read latency table"):
        LatencyTable.load(tmp_path / "missing.json")


def test_empty_graph_and_bad_requests():
    with pytest.raises(ConfigError, match="at least one stage"):
        ModelGraph("m", [])
    with pytest.raises(ConfigError, match="field 'sla'"):
        Request(0, 0.0, sla=0)
    with pytest.raises(ConfigError, match="field 'sla'"):
        Request(0, 0.0, sla=-5)
    with pytest.raises(ConfigError, match="field 'deadline'"):
        Request(0, 1.0, deadline=0.5)
    with pytest.raises(ConfigError, match="field 'dec_steps'"):
        Request(0, 0.0, dec_steps=0)


def test_table_must_cover_max_batch_size():
    from lazybatch.batcher import LazyBatching
    from lazybatch.simulator.engine import Simulation
    with pytest.raises(ConfigError, match="covers batch sizes up to 8, but max_batch_size is 64"):
        Simulation(table(), LazyBatching(64))


def test_length_histogram(tmp_path):
    h = LengthHistogram([1, 2, 3, 4], [10, 20, 30, 40])
    assert h.coverage_length(0.3) == 2 and h.coverage_length(0.9) == 4 and h.coverage_length(0.31) == 3
    for name in ("h.json", "h.csv"):
        assert LengthHistogram.load(h.save(tmp_path / name)).counts == h.counts
    with pytest.raises(ConfigError, match="field 'lengths'"):
        LengthHistogram([0, 1], [1, 1])
    with pytest.raises(ConfigError, match="all counts are zero"):
        LengthHistogram([1], [0])
    with pytest.raises(ConfigError, match="coverage"):
        h.coverage_length(1.5)


def test_trace_files(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("arrival_s,enc_steps,dec_steps,sla_ms\n0.5,3,4,\n0.1,1,2,50\n")
    arr = workload.load_trace(p)
    assert [(a.time, a.enc_steps, a.dec_steps, a.sla) for a in arr] == [(0.1, 1, 2, 0.05), (0.5, 3, 4, None)]
    reqs = workload.requests(arr, 0.2)
    assert [r.deadline for r in reqs] == [pytest.approx(0.15), pytest.approx(0.7)]
    p.write_text("time\n1\n")
    with pytest.raises(ConfigError, match="arrival_s"):
        workload.load_trace(p)
    p.write_text("arrival_s,sla_ms\n0.1,-3\n")
    with pytest.raises(ConfigError, match="line 2: sla_ms must be positive"):
        workload.load_trace(p)


def test_policy_specs():
    assert parse_policy("graph:5").params == {"max_queue_delay_microseconds": 5000}
    assert parse_policy("graph:5").label == "GraphB(5)"
    p = parse_policy("graph:max_queue_delay_microseconds=100,preferred_batch_size=4/8,max_batch_size=16").build()
    assert p.max_queue_delay == pytest.approx(1e-4) and p.preferred == [4, 8] and p.max_batch_size == 16
    assert parse_policy("lazy:max_batch_size=32,dec_timesteps=10").build().dec_timesteps == 10
    assert parse_policy("serial").build().max_batch_size == 1
    with pytest.raises(ConfigError, match="unknown policy 'fifo'"):
        parse_policy("fifo")
    with pytest.raises(ConfigError, match="has no parameter 'window'"):
        parse_policy("lazy:window=3")
    with pytest.raises(ConfigError, match="not a valid number"):
        parse_policy("graph:max_batch_size=big")
    with pytest.raises(ConfigError, match="max_batch_size must be a positive integer"):
        parse_policy("lazy:max_batch_size=0").build()
