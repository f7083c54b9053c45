"""The default policy, eager (batcher/policies/eager/): work-conserving like Triton's dynamic batcher, preempting
only where the latency table predicts a lower mean latency, with spans of stages where no boundary pays."""

from __future__ import annotations

import pytest

from lazybatch.batcher.decisions import DISPATCH, PREEMPT
from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.graph import ModelGraph, StageType
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.policies import EagerBatching, parse_policy
from lazybatch.batcher.request import Request, Status
from lazybatch.batcher.scheduler import Scheduler
from lazybatch.simulator.engine import Simulation
from lazybatch.simulator.loads_on_table import simulate_loads

MS = 1e-3
SIZES = [1, 2, 4, 8]


def table(per_sample: float, n: int = 8) -> LatencyTable:
    """n stages of 1 ms at batch 1; a batch of b costs 1 + per_sample * (b - 1) ms per stage (0: batching is free,
    1: no gain at all)."""
    g = ModelGraph("t", [(f"s{i}", StageType.STATIC) for i in range(n)])
    return LatencyTable(g, SIZES, [[(1 + per_sample * (b - 1)) * MS for b in SIZES] for _ in range(n)])


def run(tab: LatencyTable, arrivals_ms: list[float], policy: str = "eager", mbs: int = 8, sla_ms: float = 1000.0):
    pol = parse_policy(policy).build(max_batch_size=mbs)
    reqs = [Request(i, a * MS, sla=sla_ms * MS) for i, a in enumerate(arrivals_ms)]
    sim = Simulation(tab, pol)
    sim.run(reqs)
    return reqs, sim, pol


def test_preempts_early_in_a_pass_where_batching_is_free():
    """Worked example: 8 stages of 1 ms, a batch costs what one request costs. Request 1 arrives while request 0
    runs stage 0. Finishing 0 first: 0 leaves at 8 ms, 1 at 16 ms (mean ~11.5 from arrival). Preempting at the
    first boundary: 1 runs stage 0 (1 ms), merges, both leave at 9 ms. The table predicts the lower mean: preempt."""
    reqs, sim, _ = run(table(0.0), [0.0, 0.5], policy="eager:spans=false")  # the rule alone, at every boundary
    assert sim.scheduler.log.counts[PREEMPT] == 1
    assert [r.status for r in reqs] == [Status.OK, Status.OK]
    assert reqs[0].finish == pytest.approx(9 * MS) and reqs[1].finish == pytest.approx(9 * MS)


def test_does_not_preempt_late_in_a_pass():
    """The same model, request 1 arriving during the seventh stage of request 0: preempting would run 1's first
    seven stages before 0's last one (0 leaves at 15 ms instead of 8). The benefit test refuses; Triton's order."""
    reqs, sim, _ = run(table(0.0), [0.0, 6.5], policy="eager:spans=false")
    assert sim.scheduler.log.counts[PREEMPT] == 0
    assert reqs[0].finish == pytest.approx(8 * MS) and reqs[1].finish == pytest.approx(16 * MS)


def test_does_not_preempt_where_batching_buys_nothing():
    """A batch costs a run per sample: preempting only reorders the work and delays the running request."""
    reqs, sim, _ = run(table(1.0), [0.0, 0.5], policy="eager:spans=false")
    assert sim.scheduler.log.counts[PREEMPT] == 0
    assert reqs[0].finish == pytest.approx(8 * MS)


def test_paper_slack_rule_preempts_where_eager_does_not():
    """The contrast with the paper's rule (kept as ``lazy``): its slack test lets the late arrival preempt."""
    _, sim, _ = run(table(0.0), [0.0, 6.5], policy="lazy:min_batch_gain=0")
    assert sim.scheduler.log.counts[PREEMPT] == 1


def test_sla_guard_refuses_a_preemption_that_makes_the_running_request_late():
    """Request 0's deadline (8.5 ms) holds if it runs on (8 ms) and not if request 1 preempts at stage 1 (9 ms):
    refused, although the mean would be lower."""
    g = table(0.0)
    pol = EagerBatching(max_batch_size=8, spans=False)
    reqs = [Request(0, 0.0, sla=8.5 * MS), Request(1, 0.5 * MS, sla=1.0)]
    sim = Simulation(g, pol)
    sim.run(reqs)
    assert sim.scheduler.log.counts[PREEMPT] == 0
    assert reqs[0].finish <= reqs[0].deadline


def test_device_free_takes_every_queued_request_where_batching_pays():
    """Work-conserving: four requests queued behind a running one start together (no batch cap from a profile)."""
    reqs, sim, _ = run(table(0.05), [0.0, 7.6, 7.7, 7.8, 7.9])
    assert sim.batch_hist.get(4, 0) >= 1
    assert all(r.status is Status.OK for r in reqs)


def test_device_free_serves_a_queue_one_by_one_where_a_batch_costs_a_run_per_sample():
    """No batching gain, little load: a batch of 3 would make each wait for all three (mean 3 passes); one at a
    time gives a mean of 2. The same throughput, so eager takes one."""
    tab = table(1.0)
    reqs, sim, _ = run(tab, [0.0, 7.6, 7.7, 7.8])
    assert set(sim.batch_hist) == {1}
    finishes = sorted(r.finish for r in reqs)
    assert finishes == pytest.approx([8 * MS, 16 * MS, 24 * MS, 32 * MS])


def test_a_closed_loop_client_gets_whole_passes():
    """A client that sends the next request after the previous answer never arrives mid-pass: whatever its rate,
    no boundary could serve it, and every request runs as one job (busy_rate, not the arrival rate)."""
    pol = EagerBatching(max_batch_size=8, boundary_cost_us=50.0)
    sim = Simulation(table(0.0), pol)
    stops = []
    sim.on_job = lambda t, j: stops.append((j.stage, j.stop))
    t = 0.0
    for i in range(30):  # closed loop: each request arrives 0.1 ms after the previous answer
        r = Request(i, t, sla=1.0)
        sim.run([r])
        t = r.finish + 0.1 * MS
    assert set(stops) == {(0, 8)}
    assert pol.rate(t) > 50 and pol.busy_rate(t) == 0.0


def test_spans_skip_boundaries_no_preemption_could_use():
    """At low load a request runs as one job through every stage where nothing is queued and nothing is expected;
    a job stops at a boundary only where a preemption could pay more than the boundary costs."""
    pol = EagerBatching(max_batch_size=8, boundary_cost_us=50.0)
    reqs = [Request(i, i * 1.0, sla=1.0) for i in range(5)]  # 1 s apart: 8 ms passes, no overlap
    jobs = []
    sim = Simulation(table(0.0), pol, on_job=lambda t, j: jobs.append((j.stage, j.stop)))
    sim.run(reqs)
    assert all(r.status is Status.OK for r in reqs)
    assert (0, 8) in jobs  # a whole pass in one job
    assert len(jobs) < 5 * 8


def test_spans_keep_early_boundaries_under_load():
    """Under load (arrivals every 2 ms on 8 ms passes), early boundaries come back: jobs stop inside the pass."""
    pol = EagerBatching(max_batch_size=8)
    reqs = [Request(i, i * 2 * MS, sla=1.0) for i in range(40)]
    stops = []
    sim = Simulation(table(0.0), pol, on_job=lambda t, j: stops.append(j.stop))
    sim.run(reqs)
    assert all(r.status is Status.OK for r in reqs)
    assert any(s < 8 for s in stops)
    assert sim.scheduler.log.counts[PREEMPT] > 0


def test_spans_off_runs_stage_by_stage():
    pol = parse_policy("eager:spans=false").build(max_batch_size=8)
    stops = []
    sim = Simulation(table(0.0), pol, on_job=lambda t, j: stops.append(j.stop - j.stage))
    sim.run([Request(0, 0.0, sla=1.0)])
    assert stops == [1] * 8


def test_rate_estimate_follows_arrivals():
    pol = EagerBatching(max_batch_size=8)
    Simulation(table(0.0), pol)  # attaches
    for i in range(200):
        pol.enqueue(Request(i, i * 0.01), i * 0.01)
    assert pol.rate(2.0) == pytest.approx(100.0, rel=0.05)


@pytest.mark.parametrize("spec, field", [("eager:min_gain=1.5", "min_gain"), ("eager:boundary_cost_us=-1",
                                                                              "boundary_cost_us"),
                                         ("eager:spans=maybe", "spans"), ("eager:preempt=slack", "preempt")])
def test_bad_parameters_are_refused_by_name(spec, field):
    with pytest.raises(ConfigError) as e:
        parse_policy(spec).build(max_batch_size=8)
    assert field in str(e.value)


def test_never_worse_than_work_conserving_batching_on_a_batchable_table():
    """The construction's promise, simulated: at every load from 10% to 300% of the batch-1 rate, eager's average
    latency is at most graph:0's (Triton's batcher with no queue delay) on a model where batching pays, one where
    it does not, and one in between (within 1%: three seeds)."""
    for per_sample in (0.05, 0.5, 1.0):
        tab = table(per_sample)
        res = simulate_loads(tab, [0.1, 0.7, 1.2, 3.0], max_batch_size=8,
                             policies={"eager": "eager", "graph_0ms": "graph:0"}, seeds=3, requests=400)
        for load in (0.1, 0.7, 1.2, 3.0):
            ours, triton = res.cell(load, "eager"), res.cell(load, "graph_0ms")
            assert ours["avg_ms"] <= triton["avg_ms"] * 1.01, (per_sample, load, ours["avg_ms"], triton["avg_ms"])


def test_dispatch_reason_is_logged():
    _, sim, _ = run(table(0.0), [0.0])
    assert any(d.kind == DISPATCH and "device idle" in d.reason for d in sim.scheduler.log)


def test_a_cheaper_whole_graph_pass_raises_the_price_of_cutting_it():
    """Where the whole graph runs in one call at 60% of the stages' summed time, a job from stage 0 keeps its
    boundaries only where a preemption would pay that loss too: the same arrivals that cut passes at
    fused_ratio 1 leave them whole."""
    def stops(ratio):
        pol = EagerBatching(max_batch_size=8, boundary_cost_us=10.0)
        pol.measured_costs(fused_ratio=ratio)
        out = []
        sim = Simulation(table(0.0), pol, on_job=lambda t, j: out.append((j.stage, j.stop)))
        sim.run([Request(i, i * 3 * MS, sla=1.0) for i in range(40)])
        return [s for s in out if s[0] == 0]

    assert any(stop < 8 for _, stop in stops(1.0))
    assert all(stop == 8 for _, stop in stops(0.6))


def test_inline_wait_where_newcomers_could_only_follow_the_work_held():
    """A group that finds the scheduler busy waits in execute (backend/inline.py) only where it could use no
    decision point of the work held: one sub-batch whose running job goes to the end of the graph, and a queue
    that starts when it ends. The answer is the predicted rest of that work; None where a boundary lies ahead,
    between jobs, or with sub-batches stacked."""
    from lazybatch.batcher.policies import inline_hooks

    from .test_scheduler_core import ManualClock

    clock = ManualClock()
    tab = table(0.0)  # 8 stages of 1 ms, batching free
    pol = EagerBatching(max_batch_size=4)
    sched = Scheduler(tab, pol, clock)
    assert pol.inline_wait(0.0, None, 0) == pytest.approx(0.0)  # nothing held
    assert pol.inline_wait(0.0, None, 2) == pytest.approx(8 * MS)  # handed over, not yet queued: one pass of 2
    sched.arrive((Request(0, 0.0, sla=1.0),))
    job = sched.schedule().job
    assert (job.stage, job.stop) == (0, 8)  # nothing queued, nothing arriving mid-pass: one span, no boundary
    clock.t = job.started + 3 * MS
    assert pol.inline_wait(clock.t, job, 0) == pytest.approx(5 * MS)  # the rest of the running pass
    assert pol.inline_wait(clock.t, job, 6) == pytest.approx(5 * MS + 2 * 8 * MS)  # and the queue: passes of 4, 2
    assert pol.inline_wait(clock.t, None, 0) is None  # between jobs: the next one's boundaries are not known
    job.stop = 4  # a job that stops at a boundary: the newcomers may preempt there
    assert pol.inline_wait(clock.t, job, 0) is None
    job.stop = 8
    pol.stack.append(pol.stack[-1])  # sub-batches stacked (a preemption happened): they may merge
    assert pol.inline_wait(clock.t, job, 0) is None
    pol.stack.pop()
    for other in (EagerBatching(max_batch_size=4, spans=False), parse_policy("lazy").build(max_batch_size=4)):
        Scheduler(tab, other, ManualClock())
        hooks = inline_hooks(other)  # the paper's rule offers no inline route at all
        assert hooks is None or hooks.inline_wait(0.0, None, 0) is None  # stage by stage, or the paper's rule: never


def test_a_saturated_device_never_serves_its_queue_in_smaller_batches():
    """No batching gain: a queue of 4 that finds the device idle after a quiet spell is served one by one (a mean of
    2.5 passes instead of 4, the same throughput). One that comes while passes run back to back is served whole:
    smaller batches would give up throughput the load needs, even where the table (never exact) makes the rate test
    alone find room. A group handed to execute is never split (inline_batch): the whole group or the scheduler."""
    from .test_scheduler_core import ManualClock

    tab = table(1.0, n=4)  # 4 ms a pass at batch 1, 4 ms per sample at any batch size
    pol = EagerBatching(max_batch_size=8)
    Scheduler(tab, pol, ManualClock())
    whole = 4 * MS
    pol.inline_done(0.0, whole, 1)
    t = 10.0  # a quiet spell: the last pass long gone
    assert pol.busy_fraction(t) == 0.0 and pol.idle.batch_size(t, 4) == 1
    assert pol.inline_batch(t, 4) == 4
    # then passes of 4 back to back, 4 handed to each: the device always busy. The passes take 25% longer than
    # the table says, so the rate served looks like room to split: 4 per 20 ms, and one by one the table predicts
    # 16 ms for 4, 80% of the time
    for _ in range(200):
        pol.inline_done(t, t + 5 * whole, 4)
        t += 5 * whole
    assert pol.rate(t) * 4 * whole < 0.85 * 4  # the rate test alone would split (4 one by one: 16 ms busy)
    assert pol.busy_fraction(t) > 0.95
    assert pol.idle.batch_size(t, 4) == 4
    assert pol.inline_batch(t, 4) == 4


def test_a_lost_deadline_in_flight_does_not_hold_newcomers_of_a_decoder_model():
    """Worked example on a decoder loop (embed, enc, dec, out; 1 time unit a stage, batching free; SLA 10; one
    decoder step assumed, as the served eager has with no histogram): request 0 decodes 20 steps (t=2..22), so its
    deadline is lost at t=10 whatever happens. Request 1 arrives at t=12.5 with one step to decode. The paper's rule
    (lazy) refuses it while 0 runs (Eq. 2: the work in flight already misses 0's deadline): it starts when 0 has
    ended (t=23) and leaves at 27, 14.5 after it came. Eager admits it at the next boundary (t=13): its embed and
    enc run (13-15), it merges with 0's decode (15-16), its out runs on top (16-17: a finished sequence does not wait
    for longer ones) and it leaves at 17, within its SLA; 0 leaves 3 units later (the shared step cost nothing)."""
    from lazybatch.batcher.policies import LazyBatching

    from .test_scheduler_core import _seq2seq_table

    finish = {}
    for name, pol in (("lazy", LazyBatching(dec_timesteps=1)), ("eager", EagerBatching(dec_timesteps=1))):
        reqs = [Request(0, 0.0, sla=10.0, enc_steps=1, dec_steps=20),
                Request(1, 12.5, sla=10.0, enc_steps=1, dec_steps=1)]
        sim = Simulation(_seq2seq_table(), pol)
        sim.run(reqs)
        assert [r.status for r in reqs] == [Status.OK, Status.OK]
        finish[name] = (reqs[0].finish, reqs[1].finish)
    assert finish["lazy"] == (23.0, 27.0)
    assert finish["eager"] == (26.0, 17.0)


def test_inline_answers_are_the_benefit_rules_at_every_rate():
    """inline_batch keeps its answers per group size and busy rate (5% steps; with nothing held or queued nothing
    else enters the rule): over a sweep of loads from idle to saturated, every answer is the one the uncached rule
    gives at that moment's rate or at a rate one step away (the kept answer was computed within the step), nearly
    all are exactly the uncached answer, and the sweep sees both answers (whole passes at light load, the
    scheduler's boundaries under load, where batching is free). A table change (recalibration) drops them."""
    from .test_scheduler_core import ManualClock

    tab = table(0.0)  # 8 stages of 1 ms, batching free: boundaries pay once requests arrive mid-pass
    pol = EagerBatching(max_batch_size=8)
    Scheduler(tab, pol, ManualClock())
    whole = 8 * MS
    t = 0.0
    seen = set()
    exact = total = 0
    for gap_passes in (40.0, 10.0, 4.0, 2.0, 1.5, 1.0, 0.7, 0.5, 0.3, 0.2, 0.1):
        for _ in range(150):  # passes of one request; newcomers every gap_passes passes, some mid-pass
            start = t
            pol.inline_done(start, start + whole, 1)
            if gap_passes <= 1.0:
                for k in range(int(round(1 / gap_passes))):
                    pol.rates.busy_arrivals.append(start + whole * (k + 0.5) / round(1 / gap_passes))
            t = start + whole + (gap_passes - 1.0) * whole if gap_passes > 1.0 else start + whole
            for n in (1, 2, 4):
                pol._forget_inline()  # the rate-bucket answers on their own (the per-size recheck: the next test)
                got = pol.inline_batch(t, n)
                lam = pol.busy_rate(t)
                near = {n if pol.preemption.stop_benefit(t, 0, n, lam=lam * f) >= pol.graph.n else 0 for f in (1 / 1.05, 1.05)}
                want = n if pol.preemption.stop_benefit(t, 0, n, lam=lam) >= pol.graph.n else 0
                assert got == want or got in near, (gap_passes, n, lam)
                exact += got == want
                total += 1
                seen.add(got > 0)
    assert seen == {True, False}, "the sweep should reach both answers"
    assert exact >= 0.98 * total, f"{total - exact} of {total} answers differ from the uncached rule's"
    assert pol.inline_answers
    pol.table_changed()
    assert not pol.inline_answers


def test_an_inline_answer_stands_for_its_recheck_interval_then_the_rule_is_asked_again():
    """Groups of one size within their recheck interval (an eighth of the rate's window, INLINE_RECHECK_WINDOW) of an
    answer get that answer without the rate being read (it is a window of dozens of passes), each size its own;
    past it, the rule reads the rate again, so that a load that rose is followed."""
    from lazybatch.batcher.policies.eager.policy import INLINE_RECHECK_S, INLINE_RECHECK_WINDOW

    from .test_scheduler_core import ManualClock

    pol = EagerBatching(max_batch_size=8)
    Scheduler(table(0.0), pol, ManualClock())  # 8 stages of 1 ms, batching free
    whole = 8 * MS
    t = 1.0
    assert pol.inline_batch(t, 1) == 1  # nothing arrives mid-pass: whole passes
    for k in range(200):  # then many arrivals mid-pass: boundaries pay
        pol.inline_done(t, t + whole, 1)
        pol.rates.busy_arrivals.extend([t + whole / 2] * 4)
        t += whole
    assert pol.preemption.stop_benefit(t, 0, 1, lam=pol.busy_rate(t)) < pol.graph.n
    recheck = max(INLINE_RECHECK_S, INLINE_RECHECK_WINDOW * pol.rates.window)
    assert recheck < pol.rates.window
    pol._forget_inline()
    pol._inline_until[1], pol._inline_kept[1] = t + recheck, 1  # as if answered just now, before the load rose
    assert pol.inline_batch(t + recheck / 2, 1) == 1  # within the interval: the answer stands
    assert pol.inline_batch(t + recheck / 2, 2) == 0  # another size: asked at once ...
    assert pol.inline_batch(t + recheck / 2, 1) == 1  # ... and the first size's answer still stands
    assert pol.inline_batch(t + recheck, 1) == 0  # past it: the rule again


def test_inline_hooks_are_offered_by_eager_only():
    """The backend asks the inline route's questions only of a policy that has them (batcher/policies/backend_hooks):
    Policy itself no longer carries them, so the simulator's policies owe nothing to the backend."""
    from lazybatch.batcher.policies import Policy, inline_hooks, parse_policy

    assert not hasattr(Policy, "inline_batch")
    assert inline_hooks(parse_policy("eager").build()) is not None
    for other in ("lazy", "graph:0", "serial", "cellular", "oracle", "monitor"):
        assert inline_hooks(parse_policy(other).build()) is None, other
