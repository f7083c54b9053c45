"""Cellular batching (BatchMaker, seed 003): the paper's Fig. 5 timeline and the LazyBatching paper's claims about it."""

from __future__ import annotations

import random

import pytest

from lazybatch.batcher import CellularBatching, GraphBatching, Request, StageType, parse_policy
from lazybatch.batcher.errors import ConfigError
from lazybatch.simulator.engine import Simulation

from tests.simhelpers import flat_table


def run(table, policy, reqs):
    jobs = []
    sim = Simulation(table, policy, on_job=lambda t, job: jobs.append((t, job.stage, [r.id for r in job.requests])))
    sim.run(reqs)
    return sim, jobs


def test_fig5_requests_join_and_leave_the_ongoing_batch():
    """BatchMaker Fig. 5: a chain RNN (one cell type, one time unit per cell), batch size 4.

    req1-4 (lengths 2, 3, 3, 5) arrive at t=0; here the device starts at the first arrival, so req1 runs its first
    cell alone and req2-4 join it at t=1. Every later arrival joins at the next cell boundary where there is room,
    every request leaves as soon as its own last cell is done; graph batching (window 0) instead pads each batch to
    its longest sequence and holds later arrivals until the whole batch ends.
    """
    table = flat_table(1, names=["cell"], types=[StageType.DECODER], max_batch=4)
    lengths = {1: 2, 2: 3, 3: 3, 4: 5, 5: 4, 6: 3, 7: 3, 8: 7}
    arrivals = {1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0, 5: 1.5, 6: 2.5, 7: 2.5, 8: 2.6}
    reqs = [Request(i, arrivals[i], sla=100, dec_steps=lengths[i]) for i in lengths]
    _, jobs = run(table, CellularBatching(max_batch_size=4), reqs)
    jobs = [(t, stage, sorted(ids)) for t, stage, ids in jobs]
    assert jobs[:8] == [(0.0, 0, [1]), (1.0, 0, [1, 2, 3, 4]), (2.0, 0, [2, 3, 4, 5]), (3.0, 0, [2, 3, 4, 5]),
                        (4.0, 0, [4, 5, 6, 7]), (5.0, 0, [4, 5, 6, 7]), (6.0, 0, [6, 7, 8]), (7.0, 0, [8])]
    assert {r.id: r.finish for r in reqs} == {1: 2, 2: 4, 3: 4, 4: 6, 5: 6, 6: 7, 7: 7, 8: 13}
    assert all(r.status is not None and r.status.name == "OK" for r in reqs)

    graph_reqs = [Request(i, arrivals[i], sla=100, dec_steps=lengths[i]) for i in lengths]
    run(table, GraphBatching(max_batch_size=4), graph_reqs)
    assert {r.id: r.finish for r in graph_reqs} == {1: 2, 2: 7, 3: 7, 4: 7, 5: 7, 6: 14, 7: 14, 8: 14}


def poisson(rate: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def test_on_a_graph_without_loops_it_is_graph_batching_without_a_window():
    """The LazyBatching paper (section VI) omits cellular batching: with non-RNN layers it performs like GraphB.

    That holds while fewer than max_batch_size requests wait; a full batch of new requests goes first (rule 1).
    """
    table = flat_table(6, unit=1e-3, max_batch=8)
    arrivals = poisson(400.0, 300, seed=7)
    cell = [Request(i, a, sla=1.0) for i, a in enumerate(arrivals)]
    graph = [Request(i, a, sla=1.0) for i, a in enumerate(arrivals)]
    run(table, CellularBatching(max_batch_size=8), cell)
    run(table, GraphBatching(max_batch_size=8, max_queue_delay=0.0), graph)
    assert [r.finish for r in cell] == pytest.approx([r.finish for r in graph])

    burst = [Request(0, 0.0, sla=1.0)] + [Request(i, 1e-4 * i, sla=1.0) for i in range(1, 9)]
    _, jobs = run(table, CellularBatching(max_batch_size=8), burst)
    assert jobs[1][1:] == (0, [1, 2, 3, 4, 5, 6, 7, 8])  # eight waiting at stage 0 overtake request 0


def test_decoder_cells_go_before_encoder_cells():
    """Cells later in the graph have priority, so a new request's encoder waits while others decode."""
    table = flat_table(2, names=["enc", "dec"], types=[StageType.ENCODER, StageType.DECODER], max_batch=4)
    reqs = [Request(1, 0.0, sla=100, enc_steps=1, dec_steps=3), Request(2, 0.5, sla=100, enc_steps=1, dec_steps=1)]
    _, jobs = run(table, CellularBatching(max_batch_size=4), reqs)
    assert jobs == [(0.0, 0, [1]), (1.0, 1, [1]), (2.0, 1, [1]), (3.0, 1, [1]), (4.0, 0, [2]), (5.0, 1, [2])]


def test_batches_are_capped_and_the_oldest_cells_go_first():
    table = flat_table(2, types=[StageType.STATIC, StageType.STATIC], max_batch=2)
    reqs = [Request(0, 0.0, sla=100)] + [Request(i, 0.1 * i, sla=100) for i in range(1, 5)]
    _, jobs = run(table, CellularBatching(max_batch_size=2), reqs)
    # t=1: requests 1-4 wait at stage 0 (full: >= 2) and go before request 0 at stage 1; t=2: both stages are
    # full and the later one wins; t=3: only stage 0 is full
    assert jobs == [(0.0, 0, [0]), (1.0, 0, [1, 2]), (2.0, 1, [0, 1]), (3.0, 0, [3, 4]), (4.0, 1, [2, 3]),
                    (5.0, 1, [4])]
    assert [r.finish for r in reqs] == [3.0, 3.0, 5.0, 5.0, 6.0]


def test_cellular_spec_parses_and_rejects_unknown_keys():
    spec = parse_policy("cellular:max_batch_size=8")
    policy = spec.build()
    assert isinstance(policy, CellularBatching) and policy.max_batch_size == 8
    assert spec.label == "Cellular(b8)"
    assert isinstance(parse_policy("batchmaker").build(), CellularBatching)
    with pytest.raises(ConfigError, match="window_ms"):
        parse_policy("cellular:window_ms=3")
