"""The scheduler core's life cycle: the step loop, exactly-once answers, shutdown, cancellation, seq2seq."""

from __future__ import annotations

from lazybatch.batcher import (GraphBatching, LatencyTable, LazyBatching, ModelGraph, Request, Scheduler, Serial,
                               StageResult, StageType, Status)
from lazybatch.simulator.engine import Simulation

from tests.simhelpers import flat_table


class ManualClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


def drive(sched: Scheduler, clock: ManualClock, unit: float) -> tuple[int, list[Request]]:
    """The step loop a driver runs, with every job taking ``unit`` seconds: (jobs run, answers in order)."""
    jobs, answers = 0, []
    while True:
        step = sched.schedule()
        answers += step.answers
        if step.job is None:
            return jobs, answers
        jobs += 1
        clock.t += unit
        sched.update(step.job)
        assert not sched.busy and sched.running is None  # an update never picks the next job by itself


def test_the_step_loop_runs_every_request_to_one_answer():
    clock = ManualClock()
    sched = Scheduler(flat_table(50, unit=1e-3), LazyBatching(), clock)
    reqs = [Request(i, 0.0) for i in range(100)]
    answers: list[Request] = []
    for r in reqs:
        assert sched.arrive((r,)) is None
        jobs, out = drive(sched, clock, 1e-3)  # each request's 50 stages to the end before the next arrives
        answers += out
        assert jobs == 50
    assert [r.id for r in answers] == list(range(100)) and all(r.status is Status.OK for r in reqs)
    assert sched.idle


def test_close_answers_everything_held_once():
    clock = ManualClock()
    sched = Scheduler(flat_table(4), LazyBatching(), clock)
    reqs = [Request(i, 0.0) for i in range(5)]
    for r in reqs:
        sched.arrive((r,))
    step = sched.schedule()
    assert step.job is not None and not step.answers  # one job in flight, five held
    held = sched.close()
    assert sorted(r.id for r in held) == [0, 1, 2, 3, 4]
    assert [r.status for r in reqs] == [Status.UNAVAILABLE] * 5
    assert "unloaded" in reqs[0].error
    late = Request(9, 0.0)
    assert sched.arrive((late,)) is not None
    assert late.status is Status.UNAVAILABLE and [r.id for r in sched.schedule().answers] == [9]
    sched.update(step.job)  # the in-flight job completes after shutdown: nobody is answered twice
    assert sched.schedule().answers == ()


def test_arrivals_taken_before_a_decision_start_together():
    """Requests that reached the model together (one execute call) are one arrival: an idle device starts them as
    one batch; decided after each, the first starts alone and the rest wait for it."""
    sched = Scheduler(flat_table(4, unit=1e-3), GraphBatching(8, max_queue_delay=0.0), ManualClock())
    for i in range(3):
        sched.arrive((Request(i, 0.0),))
    assert len(sched.schedule().job.requests) == 3

    sched2 = Scheduler(flat_table(4, unit=1e-3), GraphBatching(8, max_queue_delay=0.0), ManualClock())
    first = None
    for i in range(3):
        sched2.arrive((Request(i, 0.0),))
        first = first or sched2.schedule().job
    assert len(first.requests) == 1


def test_arrivals_while_busy_leave_the_running_job_alone():
    sched = Scheduler(flat_table(4, unit=1e-3), GraphBatching(8, max_queue_delay=0.0), ManualClock())
    sched.arrive((Request(0, 0.0),))
    job = sched.schedule().job
    sched.arrive((Request(1, 0.0),))
    sched.arrive((Request(2, 0.0),))
    assert sched.schedule().job is None  # still the first request's job
    while [r.id for r in job.requests] == [0]:  # graph batching runs request 0's whole graph first
        sched.update(job)
        job = sched.schedule().job
    assert [r.id for r in job.requests] == [1, 2]  # the two that came together, as one batch


def test_a_batching_window_is_asked_for_once_and_asked_again_when_it_ends():
    clock = ManualClock()
    sched = Scheduler(flat_table(4, unit=1e-3), GraphBatching(8, max_queue_delay=0.005), clock)
    sched.arrive((Request(0, 0.0),))
    step = sched.schedule()
    assert step.job is None and step.wake_at == 0.005
    assert sched.schedule().wake_at is None  # the same window: nothing new to set
    clock.t = 0.005
    sched.woke()
    assert sched.schedule().job is not None


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


def test_streamed_parts_come_back_in_the_next_step_before_its_answers():
    """A job's streamed parts (StageResult.parts, opaque to the core) are the next step's ``parts``, once, in order,
    beside the answers the same update gave: the driver sends them first."""
    clock = ManualClock()
    sched = Scheduler(flat_table(2), Serial(), clock)
    r = Request(0, 0.0)
    sched.arrive((r,))
    step = sched.schedule()
    sched.update(step.job, StageResult(parts=["a", "b"]))
    step = sched.schedule()
    assert list(step.parts) == ["a", "b"] and not step.answers and step.job is not None
    sched.update(step.job, StageResult(parts=["c"]))
    step = sched.schedule()
    assert list(step.parts) == ["c"] and [a.id for a in step.answers] == [0] and step.job is None
    assert sched.schedule().parts == ()
