"""The scheduler core's life cycle: exactly-once answers, shutdown, cancellation, synchronous executors, seq2seq."""

from __future__ import annotations

from lazybatch.batcher import (GraphBatching, LatencyTable, LazyBatching, ModelGraph, Request, Scheduler, Serial,
                               StageResult, StageType, Status)
from lazybatch.simulator.engine import Simulation

from tests.simhelpers import flat_table


class ManualClock:
    def __init__(self) -> None:
        self.t = 0.0
        self.timers = []

    def now(self) -> float:
        return self.t

    def call_at(self, when, callback):
        class H:
            cancelled = False

            def cancel(self):
                self.cancelled = True
        h = H()
        self.timers.append((when, callback, h))
        return h


class SyncExecutor:
    """Finishes every job inside submit(), as an executor that runs onnxruntime on the scheduler thread does."""

    def __init__(self, clock: ManualClock, unit: float = 1.0) -> None:
        self.clock = clock
        self.unit = unit
        self.jobs = 0

    def submit(self, job, done) -> None:
        self.jobs += 1
        self.clock.t += self.unit
        done(job, None)


def test_synchronous_executor_runs_without_recursion():
    clock = ManualClock()
    ex = SyncExecutor(clock, 1e-3)
    answered = []
    sched = Scheduler(flat_table(50, unit=1e-3), LazyBatching(), ex, clock, on_response=answered.append)
    reqs = [Request(i, 0.0) for i in range(100)]
    for r in reqs:
        sched.submit(r)
    # each submit() ran its request's 50 stages to the end before returning: 5000 nested completions, no recursion
    assert len(answered) == 100 and all(r.status is Status.OK for r in reqs)
    assert ex.jobs == 50 * 100 and sched.idle


def test_close_answers_everything_held_once():
    clock = ManualClock()

    class Parked:
        def __init__(self):
            self.pending = []

        def submit(self, job, done):
            self.pending.append((job, done))

    ex = Parked()
    answered = []
    sched = Scheduler(flat_table(4), LazyBatching(), ex, clock, on_response=answered.append)
    reqs = [Request(i, 0.0) for i in range(5)]
    for r in reqs:
        sched.submit(r)
    assert len(ex.pending) == 1 and not answered  # one job in flight, four queued
    held = sched.close()
    assert sorted(r.id for r in held) == [0, 1, 2, 3, 4]
    assert [r.status for r in reqs] == [Status.UNAVAILABLE] * 5
    assert "unloaded" in reqs[0].error
    late = Request(9, 0.0)
    sched.submit(late)
    assert late.status is Status.UNAVAILABLE and len(answered) == 6
    job, done = ex.pending[0]
    done(job, None)  # the in-flight job completes after shutdown: nobody is answered twice
    assert len(answered) == 6


def test_cancelled_while_queued_never_runs():
    for policy in (LazyBatching(), GraphBatching(8, 0.0), Serial()):
        reqs = [Request(0, 0.0), Request(1, 0.1), Request(2, 0.2)]
        ran = []
        sim = Simulation(flat_table(3), policy, on_job=lambda t, job: ran.extend(r.id for r in job.requests))
        reqs[1].cancelled = True
        sim.run(reqs)
        assert reqs[1].status is Status.CANCELLED and 1 not in ran
        assert reqs[0].status is Status.OK and reqs[2].status is Status.OK


def _seq2seq_table() -> LatencyTable:
    g = ModelGraph("s2s", [("embed", StageType.STATIC), ("enc", StageType.ENCODER), ("dec", StageType.DECODER),
                           ("out", StageType.STATIC)])
    return LatencyTable(g, [1, 64], [[1, 1]] * 4)


def test_lazy_answers_a_finished_sequence_without_waiting_for_longer_ones():
    jobs = []
    reqs = [Request(0, 0.0, enc_steps=2, dec_steps=1), Request(1, 0.0, enc_steps=1, dec_steps=3)]
    sim = Simulation(_seq2seq_table(), LazyBatching(dec_timesteps=3),
                     on_job=lambda t, job: jobs.append((t, job.stage, [r.id for r in job.requests])))
    sim.run(reqs)
    # Req0 arrives first and starts alone (device idle); Req1 is lazily batched and catches up in the encoder
    assert jobs[:4] == [(0.0, 0, [0]), (1.0, 0, [1]), (2.0, 1, [0, 1]), (3.0, 1, [0])]
    # Req1 left the encoder after one step and waits below Req0's second encoder step; they merge at the decoder
    assert jobs[4] == (4.0, 2, [1, 0])
    # Req0 decoded its one step: it goes on top, runs 'out' and is answered; Req1 decodes on
    assert jobs[5] == (5.0, 3, [0]) and reqs[0].finish == 6.0
    assert [j[1] for j in jobs[6:]] == [2, 2, 3] and reqs[1].finish == 9.0


def test_graph_batching_pads_seq2seq_until_the_longest_sequence_ends():
    jobs = []
    reqs = [Request(0, 0.0, enc_steps=1, dec_steps=1), Request(1, 0.0, enc_steps=1, dec_steps=3)]
    sim = Simulation(_seq2seq_table(), GraphBatching(8, 0.5),
                     on_job=lambda t, job: jobs.append((job.stage, job.batch_size, [r.id for r in job.requests])))
    sim.run(reqs)
    assert jobs == [(0, 2, [0, 1]), (1, 2, [0, 1]), (2, 2, [0, 1]), (2, 2, [1]), (2, 2, [1]), (3, 2, [0, 1])]
    assert reqs[0].finish == reqs[1].finish == 6.5


def test_executor_reported_loop_exit_overrides_dec_steps():
    """A live backend does not know output lengths in advance: its executor says when decoding ended."""
    reqs = [Request(0, 0.0, enc_steps=1, dec_steps=None)]

    def result_for(job):
        if job.stage == 2:  # the fourth decoder step produces the end token
            return StageResult(loop_exits={0} if reqs[0].loop_iter == 3 else ())
        return None

    visits = []
    sim = Simulation(_seq2seq_table(), LazyBatching(dec_timesteps=2), result_for=result_for,
                     on_job=lambda t, job: visits.append(job.stage))
    sim.run(reqs)
    assert visits == [0, 1, 2, 2, 2, 2, 3] and reqs[0].status is Status.OK


def test_decisions_explain_themselves():
    sim = Simulation(flat_table(8), LazyBatching())
    sim.run([Request(1, 2.0, sla=100), Request(2, 3.5, sla=100)])
    text = [d.explain() for d in sim.scheduler.log]
    assert any("preempt" in t and "slack predictor allows lazy batching" in t and "ms" in t for t in text)
    assert sim.scheduler.log.counts["merge"] == 1


def test_missing_loop_report_fails_only_that_request():
    reqs = [Request(0, 0.0, dec_steps=None), Request(1, 0.0, dec_steps=2)]
    sim = Simulation(_seq2seq_table(), LazyBatching(dec_timesteps=2))
    sim.run(reqs)
    assert reqs[0].status is Status.ERROR and "did not report whether decoding ended" in reqs[0].error
    assert reqs[1].status is Status.OK


class RecordingExecutor:
    """Holds the job it was given (the device stays busy until the test completes it)."""

    def __init__(self) -> None:
        self.jobs = []

    def submit(self, job, done) -> None:
        self.jobs.append((job, done))


def test_deferred_dispatch_starts_arrivals_of_one_moment_together():
    """Requests that reached the model together (one execute call) are one arrival: an idle device starts them as
    one batch; submitted one by one, the first starts alone and the rest wait for it."""
    clock = ManualClock()
    ex = RecordingExecutor()
    sched = Scheduler(flat_table(4, unit=1e-3), GraphBatching(8, max_queue_delay=0.0), ex, clock)
    with sched.deferred_dispatch():
        for i in range(3):
            sched.submit(Request(i, 0.0))
        assert ex.jobs == []  # the policy is asked once, at the end
    assert [len(j.requests) for j, _ in ex.jobs] == [3]

    clock2 = ManualClock()
    ex2 = RecordingExecutor()
    sched2 = Scheduler(flat_table(4, unit=1e-3), GraphBatching(8, max_queue_delay=0.0), ex2, clock2)
    for i in range(3):
        sched2.submit(Request(i, 0.0))
    assert [len(j.requests) for j, _ in ex2.jobs] == [1]


def test_deferred_dispatch_while_busy_leaves_the_running_job_alone():
    clock = ManualClock()
    ex = RecordingExecutor()
    sched = Scheduler(flat_table(4, unit=1e-3), GraphBatching(8, max_queue_delay=0.0), ex, clock)
    sched.submit(Request(0, 0.0))
    with sched.deferred_dispatch():
        sched.submit(Request(1, 0.0))
        sched.submit(Request(2, 0.0))
    assert len(ex.jobs) == 1  # still the first request's job
    while [r.id for r in ex.jobs[-1][0].requests] == [0]:  # graph batching runs request 0's whole graph first
        job, done = ex.jobs[-1]
        done(job, None)
    assert [r.id for r in ex.jobs[-1][0].requests] == [1, 2]  # the two that came together, as one batch
