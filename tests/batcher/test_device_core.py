"""The shared device (batcher/device.py) under the simulator: one model alone is unchanged, one job per lane, the
small model beside a large one, priorities, the global and per-model bounds, the decision log, unloading."""

from __future__ import annotations

import hashlib

import pytest

from lazybatch.batcher.admission import QueuePolicy
from lazybatch.batcher.decisions import DEVICE, KINDS
from lazybatch.batcher.device import DEVICE_QUEUE_FULL, SharedDevice
from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.policies.spec import parse_policy
from lazybatch.batcher.request import Status
from lazybatch.simulator import paper_tables, sweep, workload
from lazybatch.simulator.colocated import ColocatedSimulation, Tenant
from lazybatch.simulator.engine import Simulation

from tests.colocation_helpers import flat, linear_table, periodic, tenant


def _digest(reqs) -> str:
    h = hashlib.sha256()
    for r in reqs:
        h.update(repr((r.id, r.start, r.finish, r.status, r.error)).encode())
    return h.hexdigest()


@pytest.mark.parametrize("model", ["resnet50", "gnmt"])
@pytest.mark.parametrize("policy", ["eager", "graph:5", "lazy"])
def test_one_model_on_a_shared_device_runs_as_without_it(model, policy):
    """A one-model SharedDevice grants at once and keeps the policy's spans: every request starts and finishes at
    the same instant as under engine.Simulation (and under processor sharing with nothing beside it)."""
    table = paper_tables.shipped_table(model)
    hist = sweep.load_histogram(None)
    arrivals = workload.poisson(0.9 / (sum(table.single) * 8), 600, 3, graph=table.graph, lengths=hist)
    runs = []
    for how in ("engine", "device", "ps"):
        reqs = workload.requests(arrivals, 0.05)
        pol = parse_policy(policy).build(length_histogram=hist)
        if how == "engine":
            Simulation(table, pol).run(reqs)
        else:
            ColocatedSimulation([Tenant(model, table, pol, reqs)], sharing=how).run()
        runs.append(_digest(reqs))
    assert runs[0] == runs[1] == runs[2]


@pytest.mark.parametrize("lanes", [1, 2])
def test_at_most_one_job_per_lane(lanes):
    tables = [flat(4, 1e-3, "a"), linear_table(3, 2e-3, "b"), flat(6, 5e-4, "c")]
    tenants = [tenant(t.name, t, periodic(80, 1.5e-3 * (i + 1), 0.05)) for i, t in enumerate(tables)]
    sim = ColocatedSimulation(tenants, device=SharedDevice(lanes=lanes))
    sim.run()
    assert sim.ps.peak == lanes  # the PS executor never held more jobs than lanes (and the load used them all)
    for t in tenants:
        assert all(r.status is Status.OK for r in t.requests)


def test_a_small_model_beside_a_large_one_waits_at_most_one_stage():
    """The structural win: a small model's request runs between two stages of a large model's batch, so its
    latency is its own alone plus at most the large model's stage in flight. Under processor sharing it shares the
    device (slower); behind a rate-limiter token it waits for the large model's whole execution."""
    large = flat(20, 1e-3, "large")  # t1 20 ms, 1 ms stages at any batch size
    small = flat(2, 0.7e-3, "small")  # t1 1.4 ms
    worst = {}
    for sharing in ("device", "ps", "token"):
        pol = "eager" if sharing == "device" else "graph:0"
        big = tenant("large", large, periodic(60, 18e-3, 0.1), pol)  # 110% of its batch-1 rate
        tiny = tenant("small", small, periodic(40, 27.1e-3, 7e-3, start=1e-3), pol)
        ColocatedSimulation([big, tiny], sharing=sharing).run()
        worst[sharing] = max(r.latency for r in tiny.requests)
        assert all(r.status is Status.OK for r in big.requests + tiny.requests)
    assert worst["device"] <= 1.4e-3 + 1e-3 + 1e-9
    assert worst["ps"] >= 2 * 1.4e-3 - 1e-9 and worst["token"] > 10e-3


def test_a_small_model_just_late_goes_before_a_late_backlog():
    """Both late: the large model at 110% with no gain from batching (its backlog seconds past its deadlines), the
    small one's tight SLA missed by the large model's stage in flight. The least late goes first, so the small
    model still waits at most one stage; least slack first among the late (the rule before) kept it behind the
    backlog until the fairness bound let it in, a lag's worth of device time per request."""
    large = linear_table(20, 1e-3, "large")  # t1 20 ms, batching buys nothing: 110% load stays a growing backlog
    small = linear_table(2, 0.7e-3, "small")  # t1 1.4 ms
    # one request per job (as a batch of the large model would make its stage longer, not the pass cheaper)
    big = tenant("large", large, periodic(100, 18e-3, 20e-3), "eager:max_batch_size=1")
    # from 0.1 s (the backlog is late by then), mid-stage of the large model's job in flight
    tiny = tenant("small", small, periodic(50, 27.1e-3, 1.5e-3, start=0.1 + 0.3e-3), "eager")
    device = SharedDevice(lag=0.02)
    ColocatedSimulation([big, tiny], device=device).run()
    assert all(r.status is Status.OK for r in big.requests + tiny.requests)
    assert max(r.latency for r in big.requests) > 0.1  # the backlog is real: the large model is far past its SLA
    late = [r for r in tiny.requests if r.latency > 1.5e-3]
    assert late, "the small model's SLA must be missed by the stage in flight for the rule to matter"
    assert max(r.latency for r in tiny.requests) <= 1.4e-3 + 1e-3 + 1e-9


def test_spans_reach_as_far_as_the_waiting_models_can_afford():
    """Granted while the large model's late backlog waits, the small model's job spans its stages (the backlog's
    fair-share room allows it): one grant per pass instead of one per stage, each a round trip to the arbiter when
    served. The large model, granted while the small one waits with slack, spans no further than that slack; with
    nobody waiting, jobs stay one stage (a newcomer waits one stage)."""
    large = linear_table(20, 1e-3, "large")
    small = linear_table(8, 0.25e-3, "small")  # t1 2 ms in 8 stages
    big = tenant("large", large, periodic(100, 18e-3, 20e-3), "eager:max_batch_size=1")
    tiny = tenant("small", small, periodic(50, 27.1e-3, 2.1e-3, start=0.1 + 0.3e-3), "eager")
    spans: dict[str, list[int]] = {"large": [], "small": []}
    sim = ColocatedSimulation([big, tiny], device=SharedDevice(lag=0.02),
                              on_job=lambda now, model, job: spans[("large", "small")[model]].append(
                                  job.stop - job.stage))
    sim.run()
    assert all(r.status is Status.OK for r in big.requests + tiny.requests)
    assert max(spans["small"]) == 8  # a whole pass in one grant
    assert len(spans["small"]) < 2 * len(tiny.requests)
    assert max(r.latency for r in tiny.requests) <= 2e-3 + 1e-3 + 1e-9  # still at most one large stage of wait
    assert max(spans["large"]) * 1e-3 <= 0.02 + 1e-9  # never past the lag


def test_priority_levels_go_first():
    """B's requests are tighter (least slack) and B is backlogged, but A's priority level is more urgent: A waits
    for at most the stage in flight."""
    a_tab, b_tab = flat(3, 1e-3, "a"), flat(3, 1e-3, "b")  # B: a 3 ms pass at any batch, arrivals every 2 ms
    a = tenant("a", a_tab, periodic(30, 20e-3, 0.5, start=0.5e-3), priority=0)
    b = tenant("b", b_tab, periodic(300, 2e-3, 10e-3), priority=1)
    ColocatedSimulation([a, b], device=SharedDevice(lag=1.0)).run()
    assert max(r.latency for r in a.requests) <= 3e-3 + 1e-3 + 1e-9
    # without the priority, B's least slack wins while it is backlogged
    a2 = tenant("a", a_tab, periodic(30, 20e-3, 0.5, start=0.5e-3))
    b2 = tenant("b", b_tab, periodic(300, 2e-3, 10e-3))
    ColocatedSimulation([a2, b2], device=SharedDevice(lag=1.0)).run()
    assert max(r.latency for r in a2.requests) > 10e-3


def test_global_and_per_model_bounds_refuse_with_the_bound_hit():
    t = flat(2, 1e-3, "a")
    burst_a = [r for r in periodic(5, 0.0, 1.0)]
    burst_b = [r for r in periodic(5, 0.0, 1.0)]
    a = tenant("a", t, burst_a, queue_policy=QueuePolicy(max_queue_size=2))
    b = tenant("b", t, burst_b)
    ColocatedSimulation([a, b], device=SharedDevice(max_queue_size=6)).run()
    a_refused = [r for r in a.requests if r.status is Status.REJECTED]
    b_refused = [r for r in b.requests if r.status is Status.REJECTED]
    assert len(a_refused) == 3 and all("max_queue_size 2" in r.error and "shared device" not in r.error
                                       for r in a_refused)
    assert len(b_refused) == 1 and "shared device's queue is full" in b_refused[0].error
    assert "6" in b_refused[0].error and "each model's own max_queue_size is not the bound hit" in b_refused[0].error
    sim_b = b  # the per-reason counters a backend exports
    assert sum(1 for r in sim_b.requests if r.status is Status.OK) == 4


def test_rejection_reason_counted_per_bound():
    t = flat(2, 1e-3, "a")
    a = tenant("a", t, periodic(4, 0.0, 1.0))
    b = tenant("b", t, periodic(4, 0.0, 1.0))
    sim = ColocatedSimulation([a, b], device=SharedDevice(max_queue_size=5))
    sim.run()
    assert sim.schedulers[0].rejected == {} and sim.schedulers[1].rejected == {DEVICE_QUEUE_FULL: 3}


def test_device_decisions_are_logged_with_the_reason():
    a = tenant("small", flat(2, 1e-3, "small"), periodic(20, 5e-3, 10e-3, start=0.5e-3), log=True)
    b = tenant("large", flat(6, 2e-3, "large"), periodic(20, 5e-3, 0.5), log=True)
    sim = ColocatedSimulation([a, b])
    sim.run()
    for t in (a, b):
        recs = t.log.of(DEVICE)
        assert recs and t.log.counts[DEVICE] == len(recs)
    texts = [d.explain() for d in a.log.of(DEVICE)]
    assert any("device to small: least slack" in x and "waiting: large" in x for x in texts)
    # a model alone reports exactly the kinds it reported before
    alone = Simulation(flat(2, 1e-3), parse_policy("eager").build())
    assert tuple(alone.scheduler.log.counts) == KINDS
    stats = {s["model"]: s for s in sim.device.stats()}
    assert abs(stats["small"]["share"] + stats["large"]["share"] - 1.0) < 1e-9
    assert stats["large"]["grants"] > 0 and stats["small"]["wait_max_s"] <= 2e-3 + 1e-9


def test_an_unloaded_model_frees_the_device_for_the_others():
    a = tenant("a", linear_table(4, 1e-3, "a"), periodic(50, 1e-3, 1.0))
    b = tenant("b", flat(2, 1e-3, "b"), periodic(20, 3e-3, 1.0))
    sim = ColocatedSimulation([a, b])
    sim.call_at(0.02, lambda: sim.schedulers[0].close())
    sim.run()
    assert all(r.status is not None for r in a.requests)
    assert any(r.status is Status.UNAVAILABLE for r in a.requests)
    assert all(r.status is Status.OK for r in b.requests)


def test_configuration_errors_are_clear():
    with pytest.raises(ConfigError, match="lanes"):
        SharedDevice(lanes=0)
    with pytest.raises(ConfigError, match="max_queue_size"):
        SharedDevice(max_queue_size=-1)
    t = flat(2, 1e-3)
    sim = ColocatedSimulation([tenant("a", t, periodic(1, 0.0, 1.0))])
    with pytest.raises(ConfigError, match="already shares"):
        sim.device.join(sim.schedulers[0])
    with pytest.raises(ConfigError, match="weight"):
        ColocatedSimulation([tenant("a", t, periodic(1, 0.0, 1.0), weight=0.0)])


def test_the_seat_given_at_construction_is_where_the_device_member_sits():
    """The scheduler reads its gate through the seat it was built with; the device seats its member there, and a
    gate that is gone leaves only its own seat (a rejoin's new gate stays)."""
    from lazybatch.batcher.scheduler import Scheduler
    from lazybatch.batcher.seat import DeviceSeat
    from lazybatch.simulator.engine import Simulation

    seat = DeviceSeat()
    table = flat(2, 1e-3, "m")
    sched = Scheduler(table, parse_policy("eager").build(), Simulation(table, parse_policy("eager").build()),
                      seat=seat)
    assert sched.seat is seat and sched.gate is None
    member = SharedDevice().join(sched, "m")
    assert seat.gate is member and sched.gate is member
    other = object()
    seat.leave(other)  # type: ignore[arg-type]
    assert sched.gate is member
    seat.leave(member)
    assert sched.gate is None
