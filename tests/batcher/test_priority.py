"""Request priority levels (Triton's: a smaller level is more urgent; one level keeps arrival order)."""

from __future__ import annotations

from collections import deque

import pytest

from lazybatch.batcher import (BatchMonitor, CellularBatching, GraphBatching, LazyBatching, Request, Serial)
from lazybatch.batcher.policies.base import enqueue_by_priority
from lazybatch.simulator.engine import Simulation

from tests.simhelpers import flat_table


def order(reqs):
    q = deque()
    for r in reqs:
        enqueue_by_priority(q, r)
    return [r.id for r in q]


def test_queue_order_is_level_then_arrival():
    reqs = [Request(i, float(i), priority=p) for i, p in enumerate([2, 0, 2, 1, 0, 1])]
    assert order(reqs) == [1, 4, 3, 5, 0, 2]
    assert order([Request(i, float(i)) for i in range(5)]) == [0, 1, 2, 3, 4]  # one level: plain FIFO


def first_dispatched_after_busy(policy) -> list[int]:
    """Request 0 occupies the device; 1 (level 2), 2 (level 2) and 3 (level 1) arrive while it runs."""
    table = flat_table(3, max_batch=1)
    reqs = [Request(0, 0.0, sla=100), Request(1, 0.1, sla=100, priority=2), Request(2, 0.2, sla=100, priority=2),
            Request(3, 0.3, sla=100, priority=1)]
    jobs = []
    Simulation(table, policy, on_job=lambda t, job: jobs.append([r.id for r in job.requests])).run(reqs)
    assert all(r.status is not None and r.status.name == "OK" for r in reqs)
    firsts = []
    for ids in jobs:
        for i in ids:
            if i not in firsts:
                firsts.append(i)
    return firsts


@pytest.mark.parametrize("make", [Serial, lambda: GraphBatching(max_batch_size=1),
                                  lambda: LazyBatching(max_batch_size=1), lambda: CellularBatching(max_batch_size=1),
                                  lambda: BatchMonitor(max_batch_size=1)],
                         ids=["serial", "graph", "lazy", "cellular", "monitor"])
def test_the_more_urgent_level_starts_first(make):
    assert first_dispatched_after_busy(make()) == [0, 3, 1, 2]


def test_lazy_admits_the_urgent_request_into_a_limited_batch():
    """A cap of two samples per sub-batch: of three queued requests, the level-1 one must be in the first batch."""
    table = flat_table(2, max_batch=2)
    reqs = [Request(0, 0.0, sla=100), Request(1, 0.1, sla=100, priority=3), Request(2, 0.2, sla=100, priority=3),
            Request(3, 0.3, sla=100, priority=1)]
    jobs = []
    Simulation(table, LazyBatching(max_batch_size=2, min_batch_gain=0.0),
               on_job=lambda t, job: jobs.append((job.stage, sorted(r.id for r in job.requests)))).run(reqs)
    later = [ids for stage, ids in jobs if 0 not in ids and stage == 0]
    assert 3 in later[0]


def test_set_priority_timeouts_rewrites_every_level(tmp_path):
    """A rewrite replaces the timeouts a model had (a level left out loses its own; {} removes them all), so a
    repository kept from an earlier run does not carry stale timeouts into the next."""
    from lazybatch.backend.config_pbtxt import load_config
    from lazybatch.repo import set_priority_timeouts

    (tmp_path / "config.pbtxt").write_text('name: "m" backend: "python" max_batch_size: 4\n'
                                           'dynamic_batching { priority_levels: 2 default_priority_level: 2 }\n')

    def timeouts() -> dict[int, int]:
        db = load_config(tmp_path / "config.pbtxt").dynamic_batching
        return {k: v.default_timeout_microseconds for k, v in db.priority_queue_policy.items()}

    set_priority_timeouts(tmp_path, {1: 100, 2: 1000})
    assert timeouts() == {1: 100, 2: 1000}
    set_priority_timeouts(tmp_path, {2: 5})
    assert timeouts() == {2: 5}
    set_priority_timeouts(tmp_path, {})
    assert timeouts() == {}
