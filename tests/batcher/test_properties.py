"""Property tests over random graphs, latency tables, arrival streams and failures, for every policy."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lazybatch.batcher import (BatchMonitor, CellularBatching, GraphBatching, LatencyTable, LazyBatching, MaxBatchUnderDeadline,
                               ModelGraph, OracleLazyBatching, Request, Serial, StageResult, StageType, Status)
from lazybatch.simulator.engine import Simulation

TYPES = [StageType.STATIC, StageType.ENCODER, StageType.DECODER]


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 6))
    types = draw(st.lists(st.sampled_from(TYPES), min_size=n, max_size=n))
    graph = ModelGraph("g", [(f"s{i}", t) for i, t in enumerate(types)])
    extra = draw(st.lists(st.integers(2, 16), max_size=4, unique=True))
    sizes = sorted({1, *extra})
    lat = [[draw(st.floats(1e-4, 1e-2)) for _ in sizes] for _ in range(n)]
    table = LatencyTable(graph, sizes, lat)
    maxb = draw(st.integers(1, sizes[-1]))
    kind = draw(st.sampled_from(["serial", "graph", "lazy", "oracle", "monitor", "deadline", "cellular"]))
    if kind == "serial":
        policy = Serial()
    elif kind == "monitor":
        policy = BatchMonitor(maxb, window=draw(st.sampled_from([1e-3, 1e-2, 1.0])))
    elif kind == "deadline":
        policy = MaxBatchUnderDeadline(maxb)
    elif kind == "cellular":
        policy = CellularBatching(maxb)
    elif kind == "graph":
        pref = draw(st.lists(st.integers(1, maxb), max_size=2, unique=True))
        policy = GraphBatching(maxb, draw(st.sampled_from([0.0, 1e-3, 5e-3])), pref)
    else:
        cls = LazyBatching if kind == "lazy" else OracleLazyBatching
        policy = cls(maxb, dec_timesteps=draw(st.integers(1, 5)))
    k = draw(st.integers(1, 25))
    gaps = draw(st.lists(st.floats(0, 5e-3), min_size=k, max_size=k))
    reqs, t = [], 0.0
    for i, gap in enumerate(gaps):
        t += gap
        reqs.append(Request(i, t, sla=draw(st.floats(1e-3, 0.2)), enc_steps=draw(st.integers(1, 4)),
                            dec_steps=draw(st.integers(1, 4)), priority=draw(st.integers(0, 2))))
    fail = draw(st.sets(st.tuples(st.integers(0, k - 1), st.integers(0, n - 1)), max_size=3))
    cancel = draw(st.sets(st.integers(0, k - 1), max_size=2))
    return table, policy, reqs, fail, cancel


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_policy_keeps_the_invariants(scenario):
    table, policy, reqs, fail, cancel = scenario
    g = table.graph
    visits: dict[int, list[int]] = {r.id: [] for r in reqs}
    last_end = [0.0]
    failed: set[int] = set()

    def on_job(now, job):
        assert now >= last_end[0] - 1e-12, "the device ran two jobs at once or the clock went backwards"
        assert 1 <= len(job.requests) <= job.batch_size <= policy.max_batch_size
        last_end[0] = now + table.dense[job.stage][job.batch_size]
        for r in job.requests:
            assert r.arrival <= now
            visits[r.id].append(job.stage)
            if r.id in cancel and len(visits[r.id]) == 1:
                r.cancelled = True  # the client goes away while its first stage runs

    def result_for(job):
        errs = {r.id: "injected" for r in job.requests if (r.id, job.stage) in fail and r.id not in failed}
        failed.update(errs)
        return StageResult(errors=errs) if errs else None

    sim = Simulation(table, policy, on_job=on_job, result_for=result_for)
    sim.run(reqs, max_stage_execs=sum(len(g.stage_visits(r.enc_steps, r.dec_steps)) for r in reqs))
    answered = [r.id for r in sim.answers]

    assert sorted(answered) == [r.id for r in reqs], "every request is answered exactly once"
    for r in reqs:
        program = g.stage_visits(r.enc_steps, r.dec_steps)
        seen = visits[r.id]
        assert r.finish is not None and r.finish >= r.arrival
        if r.id in failed:
            assert r.status is Status.ERROR and "injected" in r.error
            assert seen == program[:len(seen)]
        elif r.id in cancel:
            assert r.status is Status.CANCELLED and seen == program[:len(seen)] and len(seen) >= 1
        else:
            assert r.status is Status.OK, r.error
            # each stage of its program exactly once per visit, in order; so only same-stage sub-batches merged
            assert seen == program
    for d in sim.scheduler.log:
        assert d.batch_size <= policy.max_batch_size
