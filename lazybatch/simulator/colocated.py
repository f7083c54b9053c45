"""Several models on one virtual device, each under its own scheduler core: one clock, one table executor per model.

How the device is shared (``ColocatedSimulation(..., sharing=)``):

- ``"device"``: lazybatch's ``SharedDevice`` (batcher/device.py) grants the device to one model's stage job at a
  time (or ``lanes``); the scheduling is the same code a server runs.
- ``"ps"``: **processor sharing**, how Triton's per-model backends share a device with nothing scheduling across
  them: every model runs its own batcher and submits its jobs when its own last job ends, and while k jobs are on
  the device each progresses at 1/k of its table speed (egalitarian PS: k processes' thread pools on one set of
  cores, or k CUDA streams, each slowed by the others; no preemption, no priorities, no switching cost).
- ``"wps"``: **weighted processor sharing**, the CPU share (backend/cpu_share.py) aimed perfectly: as ``"ps"``, but
  while jobs of k models are on the device each progresses at its model's fair-scheduler weight over the sum of
  theirs, the weight that of the nice the share's rank rule (batcher/cpu_rank.py) gives a model while the others
  with a job in service are active. The served share lowers a model while a peer had a request within a window and
  pays what the kernel does (a preempted thread stalling its sibling at a parallel op's barrier); this mode pays
  neither, so it is the lever's ceiling on a device that preempts at once.
- ``"token"``: **serialised whole executions**, Triton's rate limiter with one device resource
  (``--rate-limit=execution_count``): a model's whole execution (every job of one batch, one ``StageJob.token``)
  holds the one token; executions formed meanwhile wait in arrival order and run whole, at full speed.

Jobs on the device are timed by ``ProcessorSharing`` in every mode (under "device" with one lane, and under
"token", it never holds more than one job, so a job takes exactly its table time). Same-instant events run in the
engine's order: completions, then timers, then arrivals (arrivals of several models at one instant: in model
order), so one model on a one-lane ``SharedDevice`` replays ``engine.Simulation`` exactly.

Each model's core is driven by the engine's step loop. The shared device is the outer chooser over the cores: a
core it grants a lane to says so (``Scheduler.asks``), and the simulation steps every core that asks, in model
order, after each event.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from lazybatch.batcher.admission import QueuePolicy
from lazybatch.batcher.cpu_rank import ShareMember, cfs_weight, nice_for
from lazybatch.batcher.decisions import DecisionLog
from lazybatch.batcher.device import SharedDevice
from lazybatch.batcher.interfaces import StageJob, StageResult
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.policies.base import Policy
from lazybatch.batcher.request import Request
from lazybatch.batcher.scheduler import Scheduler
from lazybatch.batcher.errors import ConfigError

from .engine import _COMPLETION, _TIMER, Wake, job_seconds

SHARING = ("device", "ps", "wps", "token")
EPS = 1e-12  # seconds of work left that count as done (PS rounding)
_ARRIVAL = 2  # after the engine's completions (0) and timers (1) at the same instant

DoneCallback = Callable[[StageJob, "StageResult | None"], None]  # the device model's end of a job
JobObserver = Callable[[float, int, StageJob], None]  # (now, model index, job) as each job starts its work
ResultHook = Callable[[int, StageJob], "StageResult | None"]


@dataclass
class Tenant:
    """One co-located model: its table, a fresh policy, its requests (sorted by arrival, ids unique within it) and
    its parameters on the device."""

    name: str
    table: LatencyTable
    policy: Policy
    requests: list[Request]
    weight: float = 1.0
    priority: int = 0
    queue_policy: QueuePolicy | None = None
    share: ShareMember | None = None  # its place in the CPU share's rank rule ("wps"); None: no SLA, no role
    log: DecisionLog = field(default_factory=lambda: DecisionLog(capacity=1, enabled=False))


class _Job:
    __slots__ = ("left", "job", "done", "model")

    def __init__(self, left: float, job: StageJob, done: DoneCallback, model: int) -> None:
        self.left = left
        self.job = job
        self.done = done
        self.model = model


class ProcessorSharing:
    """Processor sharing on the simulation's clock: k jobs in service each progress at 1/k speed, or, with
    ``weight_of`` (model index, models in service -> weight), at its weight over the sum of theirs.

    Each job keeps the solo work it has left; every start or completion first charges the time since the last
    change to the jobs in service (O(k)), then one completion event is scheduled for the job that ends first
    (earlier ones go stale by version). Weights change only when the jobs in service do, so each interval between
    two events runs at fixed rates. A job alone finishes exactly ``work`` after it started."""

    def __init__(self, sim: "ColocatedSimulation",
                 weight_of: Callable[[int, frozenset[int]], float] | None = None) -> None:
        self.sim = sim
        self.weight_of = weight_of
        self.jobs: list[_Job] = []
        self.last = 0.0
        self.version = 0
        self.peak = 0  # most jobs in service at once
        self._rates: list[float] = []  # each job's share of the device since the last change

    def start(self, work: float, job: StageJob, done: DoneCallback, model: int) -> None:
        sim = self.sim
        if sim.on_job is not None:
            sim.on_job(sim.t, model, job)
        self._charge(sim.t)
        self.jobs.append(_Job(work, job, done, model))
        if len(self.jobs) > self.peak:
            self.peak = len(self.jobs)
        self._schedule()

    def _charge(self, now: float) -> None:
        jobs = self.jobs
        if jobs and now > self.last:
            dt = now - self.last
            for j, rate in zip(jobs, self._rates):
                j.left -= dt * rate
        self.last = now

    def _shares(self) -> list[float]:
        jobs = self.jobs
        if self.weight_of is None:
            return [1.0 / len(jobs)] * len(jobs)
        models = frozenset(j.model for j in jobs)
        w = [self.weight_of(j.model, models) for j in jobs]
        total = sum(w)
        return [x / total for x in w]

    def _schedule(self) -> None:
        self.version += 1
        jobs = self.jobs
        self._rates = self._shares() if jobs else []
        if jobs:
            first = min(range(len(jobs)), key=lambda i: jobs[i].left / self._rates[i])
            self.sim._push(self.last + max(jobs[first].left, 0.0) / self._rates[first], _COMPLETION, self,
                           self.version)

    def fire(self, version: int) -> None:
        if version != self.version:
            return  # stale: the jobs in service changed since it was scheduled
        self._charge(self.sim.t)
        jobs = self.jobs
        first = jobs[min(range(len(jobs)), key=lambda i: jobs[i].left / self._rates[i])]
        done = [j for j in jobs if j.left <= EPS or j is first]
        self.jobs = [j for j in jobs if not (j.left <= EPS or j is first)]
        self._schedule()
        for j in done:
            j.done(j.job, self.sim._result(j.model, j.job))


class _Token:
    """Triton's rate limiter with one device resource: whole executions (one ``StageJob.token``) one at a time."""

    def __init__(self, ps: ProcessorSharing) -> None:
        self.ps = ps
        self.model: int | None = None
        self.execution: Any = None
        self.ran = False  # the holder submitted its next job while its last one completed
        self.waiting: deque[tuple[float, StageJob, DoneCallback, int]] = deque()

    def submit(self, work: float, job: StageJob, done: DoneCallback, model: int) -> None:
        if self.model is None or (self.model == model and self.execution is job.token):
            self.model, self.execution, self.ran = model, job.token, True
            self.ps.start(work, job, self._done(done), model)
        else:
            self.waiting.append((work, job, done, model))

    def _done(self, done: DoneCallback) -> DoneCallback:
        def finished(job: StageJob, result: StageResult | None) -> None:
            self.ran = False
            done(job, result)  # the holder's next job of the same execution starts inside (ran = True)
            if not self.ran:  # its execution ended: the token goes to the oldest one waiting
                self.model = self.execution = None
                if self.waiting:
                    self.submit(*self.waiting.popleft())
        return finished


class _TableExecutor:
    """One model's executor: a job's work is its table time (a span: its stages' times summed)."""

    def __init__(self, sim: "ColocatedSimulation", index: int, table: LatencyTable) -> None:
        self.sim = sim
        self.index = index
        self.dense = table.dense
        self.stage_execs = 0
        self.busy_time = 0.0  # solo work submitted
        self.batch_hist: dict[int, int] = {}

    def submit(self, job: StageJob) -> None:
        b = job.batch_size
        work = job_seconds(self.dense, job)
        self.stage_execs += 1
        self.busy_time += work
        self.batch_hist[b] = self.batch_hist.get(b, 0) + 1
        self.sim._run(work, job, self.done, self.index)

    def done(self, job: StageJob, result: StageResult | None) -> None:
        """The device model ended ``job``: its core advances, then every core that may go now is stepped."""
        self.sim.schedulers[self.index].update(job, result)
        self.sim._settle(self.index)


class ColocatedSimulation:
    """Virtual clock + a table executor per model + the sharing of one device (module docstring)."""

    def __init__(self, tenants: Sequence[Tenant], *, sharing: str = "device", device: SharedDevice | None = None,
                 on_job: JobObserver | None = None, result_for: ResultHook | None = None) -> None:
        if sharing not in SHARING:
            raise ConfigError(f"sharing must be one of {', '.join(SHARING)}, got {sharing!r}", field="sharing")
        if not tenants:
            raise ConfigError("at least one model is needed", field="model")
        self.t = 0.0
        self._heap: list[tuple] = []
        self._seq = 0
        self.sharing = sharing
        self.tenants = list(tenants)
        self.on_job = on_job
        self.result_for = result_for
        self.ps = ProcessorSharing(self, self._share_weight if sharing == "wps" else None)
        self._token = _Token(self.ps) if sharing == "token" else None
        self.device = (device if device is not None else SharedDevice()) if sharing == "device" else None
        self.executors = [_TableExecutor(self, i, t.table) for i, t in enumerate(self.tenants)]
        self.schedulers: list[Scheduler] = []
        self._wakes: list[Wake | None] = [None] * len(self.tenants)
        self.answers: list[list[Request]] = [[] for _ in self.tenants]  # per model, in the order the cores gave them
        for i, t in enumerate(self.tenants):
            s = Scheduler(t.table, t.policy, self, log=t.log, queue_policy=t.queue_policy)
            if self.device is not None:
                self.device.join(s, t.name, weight=t.weight, priority=t.priority)
            self.schedulers.append(s)

    # Clock
    def now(self) -> float:
        return self.t

    def call_at(self, when: float, fn: Callable[[], None]) -> Wake:
        """Have the simulation call ``fn`` at ``when`` (a test's unload, an experiment's event)."""
        call = Wake(fn)
        self._push(max(when, self.t), _TIMER, call, None)
        return call

    # The step loop
    def _step(self, i: int) -> None:
        step = self.schedulers[i].schedule()
        if step.answers:
            self.answers[i] += step.answers
        if step.wake_at is not None:
            old = self._wakes[i]
            if old is not None:
                old.cancelled = True
            self._wakes[i] = wake = Wake()
            self._push(max(step.wake_at, self.t), _TIMER, wake, i)
        if step.job is not None:
            self.executors[i].submit(step.job)

    def _settle(self, i: int | None) -> None:
        """Step core ``i`` after its input (None: an outside call), then every core the shared device granted a
        lane meanwhile, in model order."""
        if i is not None:
            self._step(i)
        schedulers = self.schedulers
        while True:
            asking = [k for k, s in enumerate(schedulers) if s.asks]
            if not asking:
                return
            for k in asking:
                if schedulers[k].asks:
                    self._step(k)

    def _push(self, when: float, kind: int, obj: Any, arg: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, kind, self._seq, obj, arg))

    def _run(self, work: float, job: StageJob, done: DoneCallback, model: int) -> None:
        if self._token is not None:
            self._token.submit(work, job, done, model)
        else:
            self.ps.start(work, job, done, model)

    def _share_weight(self, model: int, in_service: frozenset[int]) -> float:
        """``model``'s fair-scheduler weight while the models ``in_service`` have jobs on the device ("wps")."""
        members = [t.share or ShareMember(t.name) for t in self.tenants]
        return float(cfs_weight(nice_for(members[model], (members[m] for m in in_service if m != model))))

    def _result(self, model: int, job: StageJob) -> StageResult | None:
        return None if self.result_for is None else self.result_for(model, job)

    def run(self, *, max_stage_execs: int | None = None) -> list[list[Request]]:
        """Feed every tenant's requests and run until each is answered; returns them per tenant.

        Arrivals wait in the event heap too, as the last kind of event at their instant (the engine's order)."""
        for arrival, m, k in sorted((r.arrival, m, k) for m, t in enumerate(self.tenants)
                                    for k, r in enumerate(t.requests)):
            self._push(arrival, _ARRIVAL, m, self.tenants[m].requests[k])
        heap = self._heap
        pop = heapq.heappop
        while heap:
            when, kind, _, obj, arg = pop(heap)
            if when < self.t:
                raise RuntimeError(f"virtual clock would run backwards: {when} < {self.t}")
            self.t = when
            if kind == _ARRIVAL:
                self.schedulers[obj].arrive((arg,))
                self._settle(obj)
            elif kind == _TIMER:
                if not obj.cancelled:
                    if obj.fn is None:  # a core's batching window (arg: its index): it decides again
                        self.schedulers[arg].woke()
                    else:
                        obj.fn()
                    self._settle(arg)
            else:
                obj.fire(arg)
                if max_stage_execs is not None and self.stage_execs > max_stage_execs:
                    raise RuntimeError(f"more than {max_stage_execs} stage executions: no progress")
        return [t.requests for t in self.tenants]

    @property
    def stage_execs(self) -> int:
        return sum(e.stage_execs for e in self.executors)
