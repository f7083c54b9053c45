"""A discrete-event simulator that runs the real scheduler core on a virtual clock.

The simulation is its own clock and its own executor: a stage job completes after the latency the table gives for
its stage and batch size. Events at the same instant run in a fixed order: stage completions, then timers, then
arrivals (a request that arrives exactly when a batch is dispatched is not part of it).
"""

from __future__ import annotations

import heapq
from typing import Callable, Iterable

from lazybatch.batcher.admission import QueuePolicy
from lazybatch.batcher.decisions import DecisionLog
from lazybatch.batcher.interfaces import DoneCallback, StageJob, StageResult
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.policies.base import Policy
from lazybatch.batcher.request import Request
from lazybatch.batcher.scheduler import Scheduler

from .energy import stage_energy

_COMPLETION, _TIMER = 0, 1

JobObserver = Callable[[float, StageJob], None]
ResultHook = Callable[[StageJob], "StageResult | None"]


class _Timer:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


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
        self.scheduler = Scheduler(table, policy, self, self, log=log, queue_policy=queue_policy)

    # Clock
    def now(self) -> float:
        return self.t

    def call_at(self, when: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer(callback)
        self._seq += 1
        heapq.heappush(self._heap, (when if when > self.t else self.t, _TIMER, self._seq, timer, None))
        return timer

    # Executor
    def submit(self, job: StageJob, done: DoneCallback) -> None:
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
        heapq.heappush(self._heap, (self.t + lat, _COMPLETION, self._seq, job, done))

    def run(self, requests: Iterable[Request], *, max_stage_execs: int | None = None) -> list[Request]:
        """Feed ``requests`` (sorted by arrival) and run until every one is answered.

        ``max_stage_execs`` guards tests against a policy that never finishes: exceeding it raises RuntimeError.
        """
        reqs = list(requests)
        heap = self._heap
        pop = heapq.heappop
        submit = self.scheduler.submit
        i, n = 0, len(reqs)
        inf = float("inf")
        while True:
            ta = reqs[i].arrival if i < n else inf
            if heap and heap[0][0] <= ta:
                when, kind, _, obj, done = pop(heap)
                if when < self.t:
                    raise RuntimeError(f"virtual clock would run backwards: {when} < {self.t}")
                self.t = when
                if kind == _COMPLETION:
                    done(obj, None if self.result_for is None else self.result_for(obj))
                    if max_stage_execs is not None and self.stage_execs > max_stage_execs:
                        raise RuntimeError(f"more than {max_stage_execs} stage executions: the policy does not "
                                           "make progress")
                elif not obj.cancelled:
                    obj.callback()
            elif i < n:
                if ta < self.t:
                    raise RuntimeError(f"arrivals must be sorted: request {reqs[i].id} arrives at {ta} < {self.t}")
                self.t = ta
                submit(reqs[i])
                i += 1
            else:
                break
        return reqs
