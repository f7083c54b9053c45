"""Urgency preemption in the default policy (batcher/policies/eager/urgency.py, rule 5): a request of an outranking class
(priority level, then SLA) that would miss its deadline behind the running batch preempts it at the next stage
boundary, runs ahead or merges, and the set-aside work resumes where it stopped. Worked examples on a virtual clock."""

from __future__ import annotations

import random

import pytest

from lazybatch.batcher.decisions import MERGE, PREEMPT
from lazybatch.batcher.graph import ModelGraph, StageType
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.policies import EagerBatching, parse_policy
from lazybatch.batcher.policies.eager import class_key
from lazybatch.batcher.request import Request, Status
from lazybatch.simulator.engine import Simulation

MS = 1e-3
SIZES = [1, 2, 4, 8]
BULK, URGENT = 2, 1  # priority levels (Triton's: 1 is the most urgent)


def table(per_sample: float, n: int = 8) -> LatencyTable:
    """n stages of 1 ms at batch 1; a batch of b costs 1 + per_sample * (b - 1) ms per stage."""
    g = ModelGraph("t", [(f"s{i}", StageType.STATIC) for i in range(n)])
    return LatencyTable(g, SIZES, [[(1 + per_sample * (b - 1)) * MS for b in SIZES] for _ in range(n)])


def bulk(i: int, at_ms: float) -> Request:
    return Request(i, at_ms * MS, sla=1000 * MS, priority=BULK)


def urgent(i: int, at_ms: float, sla_ms: float = 16.0) -> Request:
    return Request(i, at_ms * MS, sla=sla_ms * MS, priority=URGENT)


def simulate(tab: LatencyTable, reqs: list[Request], policy: str = "eager:urgency=true"):
    jobs: list[tuple[float, int, int, list[int]]] = []
    pol = parse_policy(policy).build(max_batch_size=8)
    sim = Simulation(tab, pol, on_job=lambda t, job: jobs.append((round(t / MS, 6), job.stage, job.stop,
                                                                 sorted(r.id for r in job.requests))))
    sim.run(reqs)
    assert all(r.status is Status.OK for r in reqs)
    return sim, jobs


def late_urgent_workload() -> list[Request]:
    """An urgent request alone (so that both classes were seen lately), four bulk requests that queue behind it
    and start as one batch at 8 ms, and a second urgent request at 10 ms while the bulk batch runs."""
    return [urgent(0, 0.0), bulk(1, 7.9), bulk(2, 7.9), bulk(3, 7.9), bulk(4, 7.9), urgent(5, 10.0)]


def test_a_late_urgent_request_overtakes_a_running_bulk_batch_at_a_boundary():
    """A sample added to a batch costs a quarter of a run: the bulk batch of 4 takes 1.75 ms a stage, 14 ms in all.
    With an urgent class about (SLA 16 ms = 2 x the 8 ms pass), no job runs past 16 - 1.25 x 8 = 6 ms: three
    stages. Urgent request 5 arrives at 10 ms, during the bulk batch's first job. Behind the bulk pass it would
    leave at 30 ms, past its deadline (26 ms): it preempts at the boundary at 13.25 ms, runs the graph alone
    (merged, its stages would cost 2 ms each: 26.25 ms) and leaves at 21.25 ms; the bulk batch resumes at stage 3
    where it stopped and leaves at 30 ms, 8 ms later than it would have. Without the rule, 5 waits for the whole
    bulk pass and leaves at 30 ms, 20 ms after it came."""
    reqs = late_urgent_workload()
    sim, jobs = simulate(table(0.25), reqs)
    r5 = reqs[5]
    assert r5.finish == pytest.approx(21.25 * MS) and r5.latency <= r5.sla
    assert all(r.finish == pytest.approx(30 * MS) for r in reqs[1:5])
    assert sim.scheduler.log.counts[PREEMPT] == 1 and sim.scheduler.log.counts.get(MERGE, 0) == 0
    # the bulk batch ran stages 0-2, stood aside for the urgent pass, and went on from stage 3
    assert [(t, s) for t, s, _, ids in jobs if ids == [1, 2, 3, 4]] == [(8, 0), (21.25, 3), (26.5, 6)]
    assert [(t, s) for t, s, _, ids in jobs if ids == [5]][0] == (13.25, 0)

    reqs = late_urgent_workload()
    simulate(table(0.25), reqs, "eager")
    assert reqs[5].finish == pytest.approx(30 * MS) and reqs[5].latency > reqs[5].sla
    assert all(r.finish == pytest.approx(22 * MS) for r in reqs[1:5])


def test_boundaries_stay_only_while_outranking_traffic_arrives():
    """Bulk alone: the bulk batch runs as one span (no boundary could be used). With an urgent class seen lately,
    no job may run longer than the urgent SLA leaves room for: 16 ms - 1.25 x 8 ms = 6 ms, three 1.75 ms stages."""
    reqs = [bulk(0, 0.0)] + [bulk(i, 0.5) for i in range(1, 5)]
    _, jobs = simulate(table(0.25), reqs)
    assert [(s, stop) for _, s, stop, _ in jobs] == [(0, 8), (0, 8)]
    reqs = late_urgent_workload()[:5]
    _, jobs = simulate(table(0.25), reqs)
    assert [(s, stop) for _, s, stop, ids in jobs if ids == [1, 2, 3, 4]] == [(0, 3), (3, 6), (6, 8)]


def test_an_urgent_request_merges_where_the_merged_batch_keeps_its_deadline():
    """Batching free (a batch costs one run): merging at the boundary costs the urgent request nothing. It comes
    at 9.2 ms, runs stages 0-1 alone from the boundary at 10 ms and joins the bulk batch at stage 2, which is
    delayed by two stages only (18 ms instead of 16)."""
    reqs = [urgent(0, 0.0), bulk(1, 7.9), bulk(2, 7.9), bulk(3, 7.9), bulk(4, 7.9), urgent(5, 9.2, sla_ms=12.0)]
    sim, jobs = simulate(table(0.0), reqs, "eager:spans=false,urgency=true")
    assert sim.scheduler.log.counts.get(MERGE, 0) == 1
    assert reqs[5].finish == pytest.approx(reqs[1].finish) and reqs[5].latency <= reqs[5].sla
    assert reqs[1].finish == pytest.approx((8 + 10) * MS)


def test_an_idle_device_runs_outranking_requests_ahead_of_the_batch():
    """Three bulk requests and one urgent (SLA 12 ms) queue while request 0 runs; the device frees at 8 ms. As one
    batch of four all would leave at 22 ms, past the urgent deadline (19.9 ms). The urgent one runs ahead with as
    many bulk requests as its deadline allows (one: a batch of two takes 10 ms, of three 12 ms), the other two
    bulk requests after it."""
    def workload():
        return [urgent(0, 0.0)] + [bulk(i, 7.9) for i in (1, 2, 3)] + [urgent(4, 7.9, sla_ms=12.0)]

    reqs = workload()
    sim, jobs = simulate(table(0.25), reqs)
    assert reqs[4].finish == pytest.approx(18 * MS) and reqs[4].latency <= reqs[4].sla
    started = [ids for _, s, _, ids in jobs if s == 0]
    assert started == [[0], [1, 4], [2, 3]]
    assert reqs[2].finish == pytest.approx(reqs[3].finish) and reqs[2].finish > 18 * MS
    reqs = workload()
    simulate(table(0.25), reqs, "eager")
    assert reqs[4].finish == pytest.approx(reqs[1].finish) and reqs[4].latency > reqs[4].sla


def test_one_class_is_served_as_without_the_rule():
    """Requests of one class (the same priority and SLA) never preempt by urgency: on a random open-loop
    workload the schedule is exactly the one without the rule (the default, urgency off)."""
    rng = random.Random(7)
    t = 0.0
    arrivals = []
    for _ in range(300):
        t += rng.expovariate(1 / 5.0)
        arrivals.append(t)
    for per_sample in (0.0, 0.5, 1.0):
        runs = []
        for policy in ("eager:urgency=true", "eager"):
            reqs = [Request(i, a * MS, sla=40 * MS) for i, a in enumerate(arrivals)]
            _, jobs = simulate(table(per_sample), reqs, policy)
            runs.append(([r.finish for r in reqs], jobs))
        assert runs[0] == runs[1]


def test_the_running_batch_keeps_every_deadline_it_would_meet():
    """A preemption spends slack only. Request 0 (SLA 9 ms) starts its 8 ms pass at 20 ms; request 1 (SLA 8.6 ms)
    arrives at 21.5 ms. At the boundary at 22 ms, 1 would meet its deadline (30.1 ms) only by going now, and 0
    would then leave at 36 ms instead of 28 ms, past its 29 ms: 1 waits, at its own level (a tighter SLA) as at a
    more urgent one. With 20 ms of SLA, 0 has the slack: 1 preempts and both meet their deadlines."""
    for level in (0, -1):
        for sla0, preempts in ((9.0, False), (20.0, True)):
            reqs = [Request(0, 20.0 * MS, sla=sla0 * MS), Request(1, 21.5 * MS, sla=8.6 * MS, priority=level)]
            sim, _ = simulate(table(1.0), reqs, "eager:spans=false,urgency=true")
            assert (sim.scheduler.log.counts.get(PREEMPT, 0) > 0) is preempts, (level, sla0)
            assert reqs[0].finish <= reqs[0].deadline
            assert (reqs[1].finish <= reqs[1].deadline) is preempts


def test_a_lost_deadline_is_not_chased():
    """An urgent request whose SLA is shorter than its own pass cannot be saved by a preemption: it waits, and
    the bulk batch is not set aside for nothing."""
    reqs = [urgent(0, 0.0, sla_ms=6.0), bulk(1, 8.5), bulk(2, 8.5), urgent(3, 10.0, sla_ms=6.0)]
    sim, _ = simulate(table(1.0), reqs, "eager:spans=false,urgency=true")
    assert sim.scheduler.log.counts.get(PREEMPT, 0) == 0


def test_inline_passes_refuse_a_group_whose_urgent_member_would_miss_in_it():
    """A batch costs a run per sample: four bulk and one urgent request (SLA 20 ms) as one pass would take 40 ms;
    the group goes to the scheduler, which runs the urgent one ahead. Batching free, the same group's pass takes
    8 ms, within the urgent SLA and within the room it leaves a job (20 - 1.25 x 8 = 10 ms): it runs inline."""
    pol = EagerBatching(max_batch_size=8, urgency=True)
    Simulation(table(1.0), pol)  # attaches the table
    t = 1.0
    assert pol.inline_batch(t, 4, [(1.0, BULK)] * 4) == 4
    assert pol.inline_batch(t, 5, [(1.0, BULK)] * 4 + [(0.020, URGENT)]) == 0
    pol = EagerBatching(max_batch_size=8, urgency=True)
    Simulation(table(0.0), pol)
    assert pol.inline_batch(t, 5, [(1.0, BULK)] * 4 + [(0.020, URGENT)]) == 5


def test_class_key_orders_level_then_sla():
    assert class_key(Request(0, 0.0, sla=1.0, priority=1)) < class_key(Request(1, 0.0, sla=0.1, priority=2))
    assert class_key(Request(0, 0.0, sla=0.1)) < class_key(Request(1, 0.0, sla=1.0))
    assert class_key(Request(0, 0.0, sla=0.1)) == class_key(Request(1, 5.0, sla=0.1 + 1e-7))


def test_an_urgent_request_joins_a_running_decode_at_the_next_step():
    """Decoder loop (embed, enc, dec, out; 1 unit a stage, batching free). Bulk request 0 decodes 20 steps
    (t=2..22), well within its SLA of 100; Eq. 2 (dec_timesteps 30, ``admission=eq2``) holds every newcomer whose
    deadline the work in flight would pass. Urgent request 1 (SLA 10, one step) arrives at 5.5: under the paper's rule it waits for 0 to
    end and leaves at 27. With urgency it is admitted at the next boundary (t=6): embed and enc (6-8), it shares
    0's decoder step (8-9), its out runs on top (9-10): it leaves at 10, 4.5 after it came; 0 leaves 3 units later (the two stages and the out that 1 ran)."""
    from .test_scheduler_core import _seq2seq_table

    finish = {}
    for policy in ("eager:admission=eq2", "eager:admission=eq2,urgency=true"):
        pol = parse_policy(policy).build(max_batch_size=8)
        pol.dec_timesteps = 30
        reqs = [Request(0, 0.0, sla=100.0, enc_steps=1, dec_steps=20, priority=BULK),
                Request(1, 5.5, sla=10.0, enc_steps=1, dec_steps=1, priority=URGENT)]
        Simulation(_seq2seq_table(), pol).run(reqs)
        assert [r.status for r in reqs] == [Status.OK, Status.OK]
        finish[policy] = (reqs[0].finish, reqs[1].finish)
    assert finish["eager:admission=eq2"] == (23.0, 27.0)
    assert finish["eager:admission=eq2,urgency=true"] == (26.0, 10.0)


def test_a_group_never_waits_in_execute_behind_work_it_may_outrank():
    """inline_wait holds a group in Triton's execute until the scheduler has nothing left, where the group could only
    follow that work. With outranking classes about, the group may hold an urgent request that the scheduler would
    put first (on the real server it waited behind a whole bulk batch served in small passes): it goes to the
    scheduler instead."""
    from lazybatch.batcher.interfaces import StageJob

    for urgency, waits in ((False, True), (True, False)):
        pol = EagerBatching(max_batch_size=8, urgency=urgency)
        Simulation(table(1.0), pol)
        pol.inline_batch(0.0, 1, [(0.016, URGENT)])  # both classes seen lately
        pol.inline_batch(0.001, 1, [(1.0, BULK)])
        pol.enqueue(bulk(0, 10.0), 0.01)
        pol.next_job(0.01)  # the bulk request starts: one sub-batch, its job runs to the end
        job = StageJob(0, list(pol.stack[0].reqs), 1, pol.stack[0], stop=8)
        assert (pol.inline_wait(0.011, job, 1) is not None) is waits


def test_bulk_batches_stay_small_enough_for_a_boundary_to_come_in_time():
    """A sample added to a batch costs half a run (a stage at batch b: 1 + 0.5 (b - 1) ms) and the urgent SLA is
    12 ms = 1.5 x the 8 ms pass: an urgent request may wait at most 12 - 1.25 x 8 = 2 ms for a boundary, so while
    urgent traffic arrives no sub-batch grows past 3 (a stage at batch 3 takes 2 ms), however short the jobs are
    cut. The eight bulk requests queued behind urgent request 0 start in batches of at most 3; urgent request 9,
    0.2 ms after them, finds a boundary at 10 ms and leaves at 18 ms, within its SLA. Without the rule the bulk
    starts as one batch, whose stages take 3 ms each, and request 9 waits for the whole pass."""
    def workload() -> list[Request]:
        return [urgent(0, 0.0, 12.0)] + [bulk(i, 7.9) for i in range(1, 9)] + [urgent(9, 8.1, 12.0)]

    reqs = workload()
    sim, jobs = simulate(table(0.5), reqs)
    assert max(len(ids) for _, _, _, ids in jobs) <= 3
    assert reqs[-1].finish == pytest.approx(18 * MS) and all(r.latency <= r.sla for r in reqs)

    reqs = workload()
    sim, jobs = simulate(table(0.5), reqs, "eager")
    assert max(len(ids) for _, _, _, ids in jobs) >= 5
    assert reqs[-1].latency > reqs[-1].sla


def test_the_urgent_batch_cap_gives_way_to_the_arrival_rate_only_where_batching_gains():
    """Where a sample costs half a run more per added sample, batches of 3 would lose throughput that arrivals at
    2 per ms need: the cap gives way (``MAX_UTILISATION``). Where batching gains nothing (a batch of b costs b
    runs), past capacity the queue grows whatever the batch, and the cap stays. With one class: the maximum."""
    def cap_after(per_sample: float, rate_per_ms: float) -> list[int]:
        pol = parse_policy("eager:urgency=true").build(max_batch_size=8)
        Simulation(table(per_sample), pol)  # attaches the policy to the table
        caps = [pol.urgent.batch(0.0)]  # no class seen
        pol.enqueue(urgent(0, 0.0, 12.0), 0.0)
        pol.enqueue(bulk(1, 0.0), 0.0)
        caps.append(pol.urgent.batch(0.0))
        t = 0.0
        for i in range(2, 20):  # within the rate window (0.51 s): the urgent class is still seen
            t += MS / rate_per_ms
            pol.enqueue(bulk(i, t / MS), t)
        caps.append(pol.urgent.batch(t))
        return caps

    caps = cap_after(0.5, 2.0)  # 7: a sample costs 4.57 ms there, within min_gain of batch 8's 4.5 ms
    assert caps[:2] == [8, 3] and caps[2] >= 7
    assert cap_after(0.5, 0.05) == [8, 3, 3]
    assert cap_after(1.0, 2.0) == [8, 2, 2]
