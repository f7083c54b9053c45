"""The served loads replayed on a virtual clock (lazybatch/simulator/loads_on_table.py): t1, loads as fractions
of 1/t1, and policies that must come out the same or different for a reason."""

from __future__ import annotations

import pytest

from lazybatch.batcher import LatencyTable, ModelGraph, StageType
from lazybatch.simulator import paper_tables
from lazybatch.simulator.loads_on_table import POLICIES, from_dict, simulate_loads, single_request_ms
from tests.simhelpers import flat_table


def _linear(n: int = 4, unit: float = 1e-3) -> LatencyTable:
    """No batching gain: a batch of b costs b single runs (lazy's batch cap is then 1)."""
    graph = ModelGraph("linear", [(f"s{i}", StageType.STATIC) for i in range(n)])
    return LatencyTable(graph, [1, 2, 4, 8], [[unit * b for b in (1, 2, 4, 8)] for _ in range(n)])


def test_t1_of_a_static_model_is_the_sum_of_its_stages():
    assert single_request_ms(flat_table(8, unit=1e-3, max_batch=8)) == pytest.approx(8.0)


def test_t1_of_a_seq2seq_model_is_the_mean_over_drawn_lengths():
    table = paper_tables.gnmt()
    t1 = single_request_ms(table)
    assert t1 == single_request_ms(table)  # seeded: the page re-renders identically
    assert t1 > 5 * sum(table.single[i] for i in range(table.graph.n)) * 1e3 / table.graph.n


def test_cells_cover_every_load_and_policy_with_violations_per_multiple():
    sim = simulate_loads(flat_table(4, unit=1e-3, max_batch=8), [0.3, 0.9], max_batch_size=8, seeds=2,
                         requests=200)
    assert sim.t1_ms == pytest.approx(4.0) and sim.mu == pytest.approx(250.0)
    assert len(sim.cells) == 2 * len(POLICIES)
    light = sim.cell(0.3, "serial")
    assert light["rate"] == pytest.approx(75.0)
    assert light["throughput"] == pytest.approx(75.0, rel=0.2)  # keeps up with what was offered
    assert set(light["violations"]) == {"2x", "5x", "10x"}
    # a batching window only delays a request when batching is free and the load is light
    assert sim.cell(0.3, "graph_20ms")["avg_ms"] > 3 * sim.cell(0.3, "graph_0ms")["avg_ms"]
    assert from_dict(sim.as_dict()).cells == sim.cells


def test_lazy_is_serial_where_batching_buys_nothing_and_beats_it_where_batching_is_free():
    lin = simulate_loads(_linear(), [0.5, 0.9], max_batch_size=8, seeds=2, requests=300)
    for f in (0.5, 0.9):  # batch cap 1: the same arrival-order schedule as serial
        assert lin.cell(f, "lazy")["avg_ms"] == pytest.approx(lin.cell(f, "serial")["avg_ms"])
    free = simulate_loads(flat_table(4, unit=1e-3, max_batch=8), [0.9, 2.0], max_batch_size=8, seeds=2,
                          requests=300)
    assert free.cell(0.9, "lazy")["avg_ms"] < free.cell(0.9, "serial")["avg_ms"]
    # past serial's capacity only batching keeps up
    assert free.cell(2.0, "lazy")["throughput"] > 1.5 * free.cell(2.0, "serial")["throughput"]
