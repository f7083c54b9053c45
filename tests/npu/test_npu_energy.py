"""Modelled energy per request in the simulator (meta.energy_uj of NPU tables): hand-computed cases, bad meta."""

from __future__ import annotations

import csv
import json
import math

import pytest

from lazybatch.batcher import LatencyTable, ModelGraph, StageType, parse_policy
from lazybatch.batcher.errors import ConfigError
from lazybatch.simulator.energy import stage_energy
from lazybatch.simulator.engine import Simulation
from lazybatch.simulator.metrics import measure
from lazybatch.simulator.workload import Arrival, requests

# two stages; energy in microjoules at batch sizes 1, 2, 4
ENERGY = [[10.0, 12.0, 16.0], [100.0, 110.0, 130.0]]


def table(energy=ENERGY) -> LatencyTable:
    graph = ModelGraph("e", [("a", StageType.STATIC), ("b", StageType.STATIC)])
    return LatencyTable(graph, [1, 2, 4], [[1e-3, 1.5e-3, 2e-3], [1e-3, 1.5e-3, 2e-3]],
                        meta={"energy_uj": energy})


def run(policy: str, times: list[float]):
    reqs = requests([Arrival(t) for t in times], sla=1.0)
    sim = Simulation(table(), parse_policy(policy).build(max_batch_size=4))
    sim.run(reqs)
    return reqs, sim


def test_interpolated_like_latencies():
    dense = stage_energy(table())
    assert dense[0][1] == pytest.approx(10e-6) and dense[1][4] == pytest.approx(130e-6)
    assert dense[0][3] == pytest.approx(14e-6)  # halfway between batch 2 (12) and 4 (16)


def test_requests_far_apart_pay_the_single_input_energy():
    reqs, sim = run("serial", [0.0, 1.0, 2.0])
    assert sim.energy_j == pytest.approx(3 * (10 + 100) * 1e-6)
    m = measure(reqs, sla_targets=[1.0], batch_hist=sim.batch_hist, stage_execs=sim.stage_execs, decisions={},
                energy_j=sim.energy_j)
    assert m.energy_mj_per_req == pytest.approx(0.110)
    assert m.req_per_joule == pytest.approx(1 / 110e-6)


def test_a_batch_of_four_shares_its_runs():
    # four arrivals at once under a 10 ms graph-batching window: one batch of 4 through both stages
    reqs, sim = run("graph:10", [0.0, 0.0, 0.0, 0.0])
    assert sim.batch_hist == {4: 2}
    assert sim.energy_j == pytest.approx((16 + 130) * 1e-6)
    m = measure(reqs, sla_targets=[1.0], batch_hist=sim.batch_hist, stage_execs=sim.stage_execs, decisions={},
                energy_j=sim.energy_j)
    assert m.energy_mj_per_req == pytest.approx(146e-3 / 4)


def test_measured_tables_have_no_energy():
    graph = ModelGraph("m", [("a", StageType.STATIC)])
    sim = Simulation(LatencyTable(graph, [1], [[1e-3]]), parse_policy("serial").build())
    assert sim.energy_j is None
    m = measure(sim.run(requests([Arrival(0.0)], 1.0)), sla_targets=[1.0], batch_hist=sim.batch_hist,
                stage_execs=sim.stage_execs, decisions={}, energy_j=sim.energy_j)
    assert math.isnan(m.energy_mj_per_req) and math.isnan(m.req_per_joule)


@pytest.mark.parametrize("bad, says", [
    ([[1.0, 2.0, 3.0]], "one row per stage"),
    ([[1.0, 2.0], [1.0, 2.0]], "one value per batch size"),
    ([[1.0, -2.0, 3.0], [1.0, 2.0, 3.0]], ">= 0"),
    ("lots", "one row per stage"),
])
def test_malformed_energy_is_refused(bad, says):
    with pytest.raises(ConfigError, match=says) as e:
        stage_energy(table(bad))
    assert "energy_uj" in str(e.value)


def test_simulate_prints_and_writes_energy_for_npu_tables(cli, tmp_path):
    rc, out, err = cli("simulate", "--model", "npu_resnet50", "--model", "resnet50", "--policy", "lazy",
                       "--rate", "200", "--seeds", "1", "--requests", "100", "--jobs", "1", "--no-plots", "--quiet",
                       "--out", tmp_path)
    assert rc == 0, err
    # the NPU table's section has the energy rows, the measured-shape synthetic table's has none
    npu, synthetic = out.split("== resnet50")
    assert "modelled energy per request, mJ" in npu and "modelled energy" not in synthetic
    rows = {r["model"]: r for r in csv.DictReader((tmp_path / "summary.csv").open())}
    assert float(rows["npu_resnet50"]["energy_mj_per_req"]) > 0
    assert float(rows["npu_resnet50"]["req_per_joule"]) == pytest.approx(
        1e3 / float(rows["npu_resnet50"]["energy_mj_per_req"]), rel=0.05)  # per-seed ratio, 1 seed
    assert rows["resnet50"]["energy_mj_per_req"] == "nan"
    doc = json.loads((tmp_path / "results.json").read_text())
    assert any(s["model"] == "npu_resnet50" and s["energy_mj_per_req"] > 0 for s in doc["summary"])
