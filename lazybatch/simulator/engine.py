"""A discrete-event simulator that runs the real scheduler core on a virtual clock.

The simulation is the core's clock and its driver: it hands the core each event as an input (an arrival, a job's
completion, a batching window's end), asks it what to do (``Scheduler.schedule``), and completes a job after the
latency the table gives for its stage and batch size. Events at the same instant run in a fixed order: stage
completions, then timers, then arrivals (a request that arrives exactly when a batch is dispatched is not part of
it).
"""

from __future__ import annotations

import heapq
from typing import Callable, Iterable

from lazybatch.batcher.admission import QueuePolicy
from lazybatch.batcher.decisions import DecisionLog
from lazybatch.batcher.interfaces import StageJob, StageResult
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.policies.base import Policy
from lazybatch.batcher.request import Request
from lazybatch.batcher.scheduler import Scheduler

from .energy import stage_energy

_COMPLETION, _TIMER = 0, 1

JobObserver = Callable[[float, StageJob], None]
ResultHook = Callable[[StageJob], "StageResult | None"]


class Wake:
    """A timed event on the heap: a core's batching window (``fn`` None; replaced by a later ``Step.wake_at``, it is
    skipped), or a call the simulation makes at an instant (``call_at``: a test's revoke or unload)."""

    __slots__ = ("fn", "cancelled")

    def __init__(self, fn: Callable[[], None] | None = None) -> None:
        self.fn = fn
        self.cancelled = False


def job_seconds(dense: list[list[float]], job: StageJob) -> float:
    """A job's table time: its stage's, or for a span of stages (``StageJob.stop``) their times one after the other."""
    b = job.batch_size
    return dense[job.stage][b] if job.stop == job.stage + 1 else sum(dense[s][b] for s in job.span)


class Simulation:
    """Virtual clock + latency-table executor + the scheduler, driven by a list of arrivals."""

    def __init__(self, table: LatencyTable, policy: Policy, *, log: DecisionLog | None = None,
                 on_job: JobObserver | None = None, result_for: ResultHook | None = None,
                 queue_policy: QueuePolicy | None = None) -> None:
        """``on_job`` sees every stage job as it starts; ``result_for`` may return a StageResult for a job (to inject
        failures or decide loop exits), evaluated when the job completes; ``queue_policy`` bounds the queue and
        rejects requests whose deadline cannot be met (batcher/admission.py)."""
        self.t = 0.0
        self._heap: list[tuple] = []
        self._seq = 0
        self._dense = table.dense
        self.on_job = on_job
        self.result_for = result_for
        self.stage_execs = 0
        self.batch_hist: dict[int, int] = {}
        self.busy_time = 0.0
        self._energy = stage_energy(table)  # joules per stage run; None for tables without meta.energy_uj
        self.energy_j: float | None = None if self._energy is None else 0.0  # modelled, see energy.py
        self.answers: list[Request] = []  # every answer, in the order the core gave them
        self._wake: Wake | None = None  # the core's batching window on the heap
        self.scheduler = Scheduler(table, policy, self, log=log, queue_policy=queue_policy)

    # Clock
    def now(self) -> float:
        return self.t

    def call_at(self, when: float, fn: Callable[[], None]) -> Wake:
        """Have the simulation call ``fn`` at ``when``, among the timers of that instant; the core is stepped after
        it where it asks (a grant it was told of)."""
        call = Wake(fn)
        self._seq += 1
        heapq.heappush(self._heap, (max(when, self.t), _TIMER, self._seq, call))
        return call

    def step(self) -> None:
        """Ask the core what to do now, and do it: keep its answers, set its window, start its job."""
        step = self.scheduler.schedule()
        if step.answers:
            self.answers += step.answers
        if step.wake_at is not None:
            if self._wake is not None:
                self._wake.cancelled = True
            self._wake = Wake()
            self._seq += 1
            heapq.heappush(self._heap, (max(self.wake_time(step.wake_at), self.t), _TIMER, self._seq, self._wake))
        job = step.job
        if job is not None:
            b = job.batch_size
            lat = job_seconds(self._dense, job)
            self.stage_execs += 1
            self.busy_time += lat
            if self._energy is not None:
                self.energy_j += sum(self._energy[s][b] for s in job.span)
            hist = self.batch_hist
            hist[b] = hist.get(b, 0) + 1
            if self.on_job is not None:
                self.on_job(self.t, job)
            self._seq += 1
            heapq.heappush(self._heap, (self.t + self.run_time(job, lat), _COMPLETION, self._seq, job))

    def wake_time(self, when: float) -> float:
        """When a batching window asked to end at ``when`` ends on this device (a subclass may fire it late)."""
        return when

    def run_time(self, job: StageJob, table_s: float) -> float:
        """How long ``job`` runs on this device: its table time (a subclass may make it slower)."""
        return table_s

    def run(self, requests: Iterable[Request], *, max_stage_execs: int | None = None) -> list[Request]:
        """Feed ``requests`` (sorted by arrival) and run until every one is answered.

        ``max_stage_execs`` guards tests against a policy that never finishes: exceeding it raises RuntimeError.
        """
        reqs = list(requests)
        heap = self._heap
        pop = heapq.heappop
        core = self.scheduler
        step = self.step
        i, n = 0, len(reqs)
        inf = float("inf")
        while True:
            ta = reqs[i].arrival if i < n else inf
            if heap and heap[0][0] <= ta:
                when, kind, _, obj = pop(heap)
                if when < self.t:
                    raise RuntimeError(f"virtual clock would run backwards: {when} < {self.t}")
                self.t = when
                if kind == _COMPLETION:
                    core.update(obj, None if self.result_for is None else self.result_for(obj))
                    step()
                    if max_stage_execs is not None and self.stage_execs > max_stage_execs:
                        raise RuntimeError(f"more than {max_stage_execs} stage executions: the policy does not "
                                           "make progress")
                elif obj.cancelled:
                    continue
                elif obj.fn is None:
                    core.woke()
                    step()
                else:
                    obj.fn()
                    if core.asks:
                        step()
            elif i < n:
                if ta < self.t:
                    raise RuntimeError(f"arrivals must be sorted: request {reqs[i].id} arrives at {ta} < {self.t}")
                self.t = ta
                core.arrive((reqs[i],))
                step()
                i += 1
            else:
                break
        return reqs
