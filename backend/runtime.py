"""The backend runtime: the single-threaded ``Scheduler`` core served on a thread of its own, with onnxruntime stages.

Nothing here imports Triton. The Triton model (``model.py``) hands requests in through ``submit`` from Triton's
``execute`` thread and gets answers back through the ``respond`` callback, so a plain test can drive it without a
server. ``submit`` only puts requests on the runtime's inbox, which its scheduler thread empties. Its parts:
``scheduler_loop.py`` (when the thread sleeps), ``runtime_hooks.py`` (its bookkeeping at idle and quiet moments),
``clock.py`` (wall time, the core's window), ``rows.py`` (a Triton request of batch b is b scheduler requests, one
per sample, as the table, the slack predictor and max_batch_size count samples; answered once all are done, or at
once when one fails, its siblings then leaving at the next stage boundary), ``inline.py`` (whole-graph passes run in
``execute``), ``stage_runs.py`` (a job's stages on its requests). Here: the inbox, admission, calibration,
cancellation, answers and shutdown. The thread drives the core by its step loop (batcher/scheduler.py): it takes
every input that came, has the core decide (``_decide``: answers, a window, a job), runs the job, drains the inbox,
and only then hands the result back (``Scheduler.update``), so the policy sees every request that arrived during a
stage at its boundary.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
import traceback
from typing import Any, Callable, Sequence

import numpy as np

from lazybatch.batcher.admission import QueuePolicy
from lazybatch.batcher.decisions import DecisionLog
from lazybatch.batcher.interfaces import StageJob
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.policies.base import Policy
from lazybatch.batcher.request import Request, Status
from lazybatch.batcher.scheduler import Scheduler
from lazybatch.batcher.seat import DeviceSeat

from . import metrics as M
from .cancel_watch import CancelWatcher, typical_stage_s
from .clock import WallClock
from .request_parsing import RequestOptions, check_deadline
from .faults import FaultInjector
from .inline import InlineRoute
from .pool_park import PoolPark
from .rows import WAKE, Call, Group, Parent, Sample
from .runtime_hooks import QuietHooks
from .runtime_stats import RuntimeStats
from .scheduler_loop import MEMORY_RELEASE_INTERVAL_S, SchedulerLoop
from .stage_runs import StageRuns
from .stages import StageRunner
from .table_keeper import TableKeeper

# respond(handle, outputs or None, status, error message or None) -- called from the scheduler thread.
Respond = Callable[[Any, "dict[str, np.ndarray] | None", Status, "str | None"], None]
IsCancelled = Callable[[Any], bool]
DECISION_LOG_CAPACITY = 4096


class BackendRuntime(StageRuns, QuietHooks):
    """Owns the scheduler thread of one model instance (its stage runs: ``stage_runs.py``)."""

    stats_class: Callable[[], RuntimeStats] = RuntimeStats  # a subclass may count more (backend/seq2seq.py)

    def __init__(self, runner: StageRunner, table: LatencyTable, policy: Policy, respond: Respond, *,
                 is_cancelled: IsCancelled | None = None, cancel_poll_s: float = 0.002,
                 on_idle: "Callable[[BackendRuntime], Callable[[], None] | None] | None" = None,
                 on_batch: "Callable[[int, int, float], None] | None" = None,
                 name: str = "lazybatch", queue_policy: QueuePolicy | None = None,
                 metrics: "M.ModelMetrics | None" = None, fault: FaultInjector | None = None,
                 whole_runner: StageRunner | None = None, whole_wide: bool = False,
                 alone: Callable[[], bool] | None = None, inline: bool = False,
                 measure_boundary_cost: bool = True,
                 memory_release_s: float = MEMORY_RELEASE_INTERVAL_S, park: "PoolPark | None" = None) -> None:
        """Built whole from what ``backend/model_kinds.py`` made of the model (``ModelParts``); the thread starts
        here. ``whole_runner``: the verified whole graph (backend/fusion.py) for jobs that span every stage (None:
        chain the stages). ``whole_wide``: that graph is wider than the stages (arbiter/sizing.py solo_threads), so
        it runs only while ``alone`` says no other member of the device group is active (arbiter/join.py), and its
        passes leave the table alone, which describes the stages at the lane's width. ``inline``: whole passes may
        run in ``execute`` (``InlineRoute.run``; a device group's gate switches it with its lease). ``park``: the
        process's onnxruntime workers, parked while nothing is held (backend/pool_park.py; None: never parked)."""
        if table.graph.n != runner.n_stages:
            raise ValueError(f"latency table has {table.graph.n} stages, the stage directory {runner.n_stages}")
        self.runner = runner
        self.whole_runner = whole_runner
        self.whole_wide = whole_wide
        self.alone = alone or (lambda: True)  # None: no device group, always alone
        self.park = park
        self.policy = policy
        self.respond = respond
        self.is_cancelled = is_cancelled
        self.cancel_poll_s = cancel_poll_s
        self.on_idle = on_idle  # statistics: called on the scheduler thread at quiet moments (write_statistics)
        self.on_batch = on_batch  # (stage, batch size, onnxruntime seconds) after every stage run (batch logs)
        self.clock = WallClock()
        self.stats = self.stats_class()
        self.keeper = TableKeeper(table, policy, self.stats, measure_boundary_cost=measure_boundary_cost,
                                  on_refresh=self._table_refreshed)
        self.calibrator = self.keeper.calibrator
        # production (docs/operations.md): admission control, metrics, fault injection; and a server keeps only the
        # newest decisions (the metrics read them as they come): the simulator's default of 100,000 records held
        # about 15 MB per model once full, which a soak run showed as memory growth. The seat is where a device
        # group's gate sits once the model joins one (backend/arbiter/join.py); none at load.
        self.scheduler = Scheduler(table, policy, self.clock, log=DecisionLog(DECISION_LOG_CAPACITY),
                                   queue_policy=queue_policy, seat=DeviceSeat())
        self.metrics = metrics  # Prometheus bookkeeping (backend/metrics.py), updated on this thread
        self.fault = fault  # fault injection for tests (backend/faults.py), None unless configured
        self.arrived = False  # requests were admitted since the core last decided (``decide``)
        self.job: StageJob | None = None  # the job the core gave, not yet run
        self.running: StageJob | None = None  # the job onnxruntime runs now (scheduler thread)
        self.live: dict[int, Parent] = {}  # requests the scheduler holds, by id()
        self._ids = itertools.count()
        self._answer_lock = threading.Lock()  # a request is asked for cancellation only while unanswered
        self.busy = threading.Lock()  # the scheduler thread's whenever it is awake; an inline pass's throughout
        self.tally_lock = threading.Lock()  # ... but the passes' tally (settle; settled_stats from elsewhere)
        # the inbox: what execute's threads (and the watcher, the arbiter's connection) hand the scheduler thread
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()  # Group, Call, a cancelled Parent, WAKE, None
        self.inbox_lock = threading.Lock()  # guards ``closed`` and ``pending``; plain attributes, read without it
        self.closed = False  # by the inline route (a property call per read cost its every pass)
        self.pending = 0  # requests put on the inbox, not yet admitted
        self.idle = threading.Event()  # set while nothing is held or pending (an inline pass may wait for it)
        self.loop = SchedulerLoop(self, name, self.busy, memory_release_s=memory_release_s)
        self.route = InlineRoute(self, policy, self.loop, self.busy, on=inline)
        # cancel_poll_s 0: paced by the stage times (cancel_poll_ms: auto, backend/cancel_watch.py)
        self.watcher = (CancelWatcher(lambda: self.live.values(), is_cancelled, self._on_cancel, cancel_poll_s,
                                      name, lock=self._answer_lock, stage_s=typical_stage_s(table.dense))
                        if is_cancelled is not None else None)
        self.loop.thread.start()

    # ------------------------------------------------------------------ any thread
    @property
    def inline(self) -> bool:
        """Whether ``route.run`` may run passes: built on where Triton's dynamic batcher hands execute its groups
        (backend/model.py); a device group's gate switches it with its lease."""
        return self.route.on

    @inline.setter
    def inline(self, on: bool) -> None:
        self.route.switch(on)

    def submit(self, handle: Any, inputs: dict[str, np.ndarray], batch: int, opts: RequestOptions) -> str | None:
        """Queue a validated request; returns an error message instead when it cannot be accepted."""
        return self.submit_group([(handle, inputs, batch, opts)])[0]

    def submit_group(self, group: "Sequence[tuple[Any, dict[str, np.ndarray], int, RequestOptions]]"
                     ) -> list[str | None]:
        """Queue requests that reached the model together (one ``execute`` call) as one arrival: the scheduler
        admits them in one go and asks its policy once, so an idle device does not start the first alone. Returns
        per request None (queued) or why it cannot be accepted (it is then not queued)."""
        arrival = time.monotonic()
        errors: list[str | None] = [check_deadline(opts) for *_, opts in group]
        items = [(Parent(h, inputs, batch), opts, arrival)
                 for (h, inputs, batch, opts), err in zip(group, errors) if err is None]
        with self.inbox_lock:
            if self.closed:
                return [err or "the model is shutting down; retry on another instance" for err in errors]
            if items:
                self.idle.clear()
                self.inbox.put(Group(items))
                self.pending += len(items)
        return errors

    def post(self, fn: Callable[[], None]) -> None:
        """Have the scheduler thread call ``fn`` at its next turn (backend/arbiter/client.py: grants)."""
        self.inbox.put(Call(fn))

    def wake(self) -> None:
        self.inbox.put(WAKE)

    def close(self, timeout: float = 30.0) -> None:
        """Answer everything still held with UNAVAILABLE and stop the thread."""
        with self.inbox_lock:
            self.closed = True
            self.inbox.put(None)
        if self.watcher is not None:
            self.watcher.close()
        self.loop.thread.join(timeout)

    def _on_cancel(self, parent: Parent) -> None:
        """The watcher saw ``parent`` cancelled (watcher thread): the scheduler thread answers it at its next turn."""
        self.inbox.put(parent)

    # ------------------------------------------------------------------ scheduler thread (scheduler_loop.Worker)
    def has_job(self) -> bool:
        return self.job is not None

    def holds(self) -> bool:
        return bool(self.live)

    def next_due(self) -> float | None:
        return self.clock.wake_at

    def take_inputs(self, timeout: float | None) -> bool:
        """No job to run: sleep until an input comes or ``timeout`` passes (a window, a hook), take every input
        there is, and have the core decide once (timed as the scheduler's work); False once closed."""
        with self.inbox_lock:
            if not self.live and not self.pending:
                self.idle.set()  # a group waiting in execute runs inline now
        try:
            item = self.inbox.get(timeout=timeout) if timeout is None or timeout > 0 else self.inbox.get_nowait()
        except queue.Empty:
            item = WAKE  # a window's end, or a hook due
        with self.busy:
            if item is None or not self._drain(item):
                return False
            t0 = time.perf_counter()
            self._decide(False)
            self.stats.sched_s += time.perf_counter() - t0
        return True

    def _drain(self, item: Any = WAKE) -> bool:
        """Take ``item`` (one off the inbox already) and every input behind it: arrivals admitted, requests the
        watcher saw cancelled answered, posted calls made; False once close() was called."""
        inbox = self.inbox
        while True:
            if type(item) is Group:
                with self.inbox_lock:
                    self.pending -= len(item.items)
                for one in item.items:  # the core decides once every arrival taken is in (``_decide``)
                    self.admit(*one)
            elif type(item) is Call:
                item.fn()
            elif item is not WAKE:
                self.answer_cancelled(item)
            try:
                item = inbox.get_nowait()
            except queue.Empty:
                return True
            if item is None:
                return False

    def _decide(self, moved: bool) -> None:
        """The core decides where something may have changed its mind (``moved``: a job ended; arrivals, a grant,
        or its window's end): what it answered is answered, its next window kept, its job kept for ``run_next``."""
        core = self.scheduler
        if self.clock.due():
            core.woke()
            moved = True
        if not (moved or self.arrived or core.asks):
            return
        self.arrived = False
        step = core.schedule()
        for handle, outputs in step.parts:  # a decoder's streamed tokens (backend/seq2seq.py), before any answer
            self.respond(handle, outputs, Status.OK, None, False)
        for r in step.answers:
            self._on_sample_done(r)
        if step.wake_at is not None:
            self.clock.wake_at = step.wake_at
        if step.job is not None:
            self.job = step.job

    def run_next(self) -> bool:
        """Run the job the scheduler gave, then report it done; False once close() was called."""
        stats = self.stats
        job = self.job
        assert job is not None
        self.job = None
        self.running = job
        t_job = time.perf_counter()
        ort_before = stats.ort_s
        watcher = self.watcher
        if watcher is not None:  # it asks these requests just before the job should end
            watcher.job_started(job.requests, self.keeper.expected_s(job))
        if self.park is not None:
            self.park.unpark()
        result = self._run(job)
        if watcher is not None:
            watcher.job_ended()
        if self.metrics is not None:  # here, not in _run_batch: subclasses replace that (seq2seq)
            ran = sum(1 for r in job.requests if not r.cancelled)
            if ran:
                for stage in job.span:
                    self.metrics.stage_run(stage, ran)
        t_drain = time.perf_counter()
        if not self._drain():
            return False
        t0 = time.perf_counter()
        self.running = None
        self.scheduler.update(job, result)
        self._decide(True)
        if self.metrics is not None:
            self.sync_metrics(0.05)
        self.park_if_idle()
        t1 = time.perf_counter()
        self.loop.note_work()
        stats.sched_s += t1 - t0
        # what a decision point costs besides onnxruntime (arrivals admitted meanwhile are not its cost)
        self.keeper.boundary_cost((t1 - t_job) - (t0 - t_drain) - (stats.ort_s - ort_before))
        return True

    def park_if_idle(self) -> None:
        """Nothing held, no job given, nothing arrived: the pool's workers wait parked (under the scheduler's
        lock, which every run holds)."""
        if self.park is not None and self.job is None and not self.live and not self.pending:
            self.park.park()

    def admit(self, parent: Parent, opts: RequestOptions, arrival: float) -> None:
        """One request off the inbox into the scheduler, as one sample request per row."""
        t0 = time.perf_counter()
        if opts.deadline_unix_s is not None:
            deadline = arrival + (opts.deadline_unix_s - time.time())
            kw: dict[str, float] = {"deadline": deadline if deadline > arrival else arrival + 1e-9}
        elif opts.sla_s is not None:
            kw = {"sla": opts.sla_s}
        else:
            kw = {}
        key = id(parent)
        self.live[key] = parent
        if self.watcher is not None:
            self.watcher.held_changed()
        self.stats.requests += 1
        wait = self.clock.now() - arrival
        self.stats.admit_wait_s += wait
        self.stats.admit_wait_max_s = max(self.stats.admit_wait_max_s, wait)
        for row in range(parent.remaining):
            r = Request(next(self._ids), arrival, priority=opts.priority, **self._sample_args(parent, row), **kw)
            parent.samples.append(r)
        self.stats.samples += len(parent.samples)
        # admitted or refused as a group; a refused request is answered (UNAVAILABLE) now
        refused = self.scheduler.arrive(parent.samples)
        if refused is None:
            self.arrived = True
        else:
            first = parent.samples[0]
            self._answer(parent, None, first.status, first.error, rejected=refused)  # type: ignore[arg-type]
            if self.metrics is not None:
                self.sync_metrics(0.05)
        self.stats.sched_s += time.perf_counter() - t0

    def _sample_args(self, parent: Parent, row: int) -> dict[str, Any]:
        """Request() arguments of one sample (a seq2seq runtime adds its per-sequence state and enc_steps)."""
        return {"payload": Sample(parent, row)}

    def _table_refreshed(self, dense: list[list[float]]) -> None:
        """The keeper rewrote the table in place: the core's policy recomputes what it derived from it."""
        self.scheduler.recalibrated()
        if self.watcher is not None:  # the stage time it is paced by
            self.watcher.pace(typical_stage_s(dense))

    def answer_cancelled(self, parent: Parent) -> None:
        """Answer a request the watcher saw cancelled, at once: queued, it need not wait for its turn; running, it
        leaves its sub-batch at the next stage boundary (its samples are flagged)."""
        if not parent.answered:
            self.scheduler.cancel(parent.samples)
            self._answer(parent, None, Status.CANCELLED, "request was cancelled by the client")

    def _on_sample_done(self, r: Request) -> None:
        sample: Sample = r.payload
        parent = sample.parent
        if parent.answered:
            return
        if r.status is Status.OK:
            parent.rows[sample.row] = {o: sample.tensors[o] for o in self.runner.output_names}
            sample.tensors = {}
            parent.remaining -= 1
            if parent.remaining:
                return
            rows = parent.rows
            outputs = {o: self.runner.to_host([x[o] for x in rows]) for o in self.runner.output_names}
            self._answer(parent, outputs, Status.OK, None)
        else:
            for sib in parent.samples:
                sib.cancelled = True
            self._answer(parent, None, r.status, r.error)

    def _answer(self, parent: Parent, outputs: dict[str, np.ndarray] | None, status: Status,
                error: str | None, rejected: str | None = None) -> None:
        """Answer ``parent`` (``rejected``: why admission refused it, for the metrics)."""
        with self._answer_lock:  # the watcher never asks an answered request (backend/cancel_watch.py)
            parent.answered = True
        self.loop.note_answer()
        self.live.pop(id(parent), None)
        self.stats.answered[status.name] = self.stats.answered.get(status.name, 0) + 1
        if self.metrics is not None:
            self.metrics.answered(parent.samples, M.outcome_of(status.name, rejected=rejected is not None),
                                  reject_reason=rejected)
        try:
            self.respond(parent.handle, outputs, status, error)
        except Exception:  # a response that cannot be sent must not stop the thread
            traceback.print_exc()

    def answer_leftovers(self) -> None:
        """The thread stops: answer what is still held, and what is left on the inbox: nothing is lost."""
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Group):  # (the close, WAKE, a Call, a cancelled Parent: none new)
                for parent, _, _ in item.items:
                    self.live[id(parent)] = parent
        for r in self.scheduler.close("the model was unloaded before the request finished"):
            self._on_sample_done(r)
        for parent in list(self.live.values()):
            if not parent.answered:
                self._answer(parent, None, Status.UNAVAILABLE, "the model was unloaded before the request finished")
