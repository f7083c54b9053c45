"""The scheduler thread: wall clock + onnxruntime executor around the single-threaded ``Scheduler``.

Nothing here imports Triton. The Triton model (``model.py``) hands requests in through ``submit`` from Triton's
``execute`` thread and gets answers back through the ``respond`` callback, so the same runtime can be driven by a
plain test without a server.

Why the shape it has:

- The ``Scheduler`` is single-threaded, so exactly one thread (this one) calls into it. ``submit`` only puts the
  request on a thread-safe queue.
- The executor does not run a stage inside ``Executor.submit``: it parks the job, the thread runs it, then drains
  the arrival queue *before* reporting completion. That way the policy sees every request that arrived during the
  stage at the stage boundary, which is where LazyBatching decides to preempt.
- A Triton request with batch size b becomes b scheduler requests (one per sample): the latency table, the slack
  predictor and max_batch_size all count samples. The Triton request is answered once all its samples are done, or
  at once when one fails (its siblings are then cancelled and leave at the next stage boundary).
"""

from __future__ import annotations

import collections
import functools
import heapq
import itertools
import math
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from lazybatch.batcher.admission import QueuePolicy
from lazybatch.batcher.calibration import OnlineCalibrator
from lazybatch.batcher.interfaces import DoneCallback, StageJob, StageResult
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.policies.backend_hooks import inline_hooks
from lazybatch.batcher.policies.base import Policy
from lazybatch.batcher.request import Request, Status
from lazybatch.batcher.scheduler import Scheduler
from lazybatch.sessions.inplace import InPlaceRunError

from . import metrics as M
from .cancel_watch import CancelWatcher, auto_interval, typical_stage_s
from .config import RequestOptions
from .faults import FaultInjector, InjectedFault
from .memory import malloc_trim
from .stages import StageRunner

# respond(handle, outputs or None, status, error message or None) -- called from the scheduler thread.
Respond = Callable[[Any, "dict[str, np.ndarray] | None", Status, "str | None"], None]
IsCancelled = Callable[[Any], bool]
# A sample's tensor is a row of a batched array: (array, row). Kept as the pair, not a 1-row view, so that a
# sub-batch whose members are the rows of one array, in order, is passed on without a copy.
Row = tuple[np.ndarray, int]
DECISION_LOG_CAPACITY = 4096


class _Group(NamedTuple):
    """Inbox item: requests of one execute call, admitted together (``submit_group``)."""

    items: list[tuple[Any, Any, float]]


_WAKE = object()  # put on the inbox to wake the scheduler thread (a cancellation to answer)
BOUNDARY_COST_WEIGHT = 0.02  # per job: the measured cost of a decision point follows the host within ~50 jobs
# An inline pass waits at most this long for the scheduler thread to finish the bookkeeping of its last job (it
# answered everything and holds nothing, but has not gone back to sleep): longer, and the requests go to it instead.
INLINE_LOCK_WAIT_S = 0.002
# ... and, where it holds no job, this long for its idle hook (statistics, metrics, memory given back: a few ms,
# longer on a busy core): a group refused for it went through the scheduler, whose answers cost a response round
# trip each and whose jobs made the next groups follow (4-7 refusals a probe cell, docs/data/probe_routes_mobilenet.txt)
INLINE_BOOKKEEPING_WAIT_S = 0.05
# A group that finds the scheduler busy with work it could only follow (InlineHooks.inline_wait) waits in execute at
# most twice the predicted rest of that work plus this, then runs inline; past that, it goes to the scheduler.
INLINE_WAIT_SLACK_S = 0.005
# The latency table is rewritten from the observed runs (batcher/calibration.py) at most this often: a rewrite
# (every stage, every batch size, and the policy's derived tables) cost more than a MobileNet stage, and was due
# after nearly every run of a noisy span.
RECALIBRATE_INTERVAL_S = 0.25
# The idle hook (statistics file, metrics) runs at most this often: written at every idle moment it cost a JSON file
# per request at low load, on the cores onnxruntime needs. Inline passes leave it to the scheduler thread, which
# wakes this often to see whether they did.
IDLE_HOOK_INTERVAL_S = 0.1
# The statistics file (``on_idle``) and the memory release wait for a quiet moment: nothing run for this long. Under
# steady load there is none, and there they cost eager alone (Triton's path has neither): the file took about 1 ms
# of the scheduler thread at each hook in-process (ad hoc), ten hooks a second beside the passes, on the cores
# onnxruntime needs (docs/triton.md, "Bookkeeping at quiet moments"). Under a load that never pauses the file is
# still written every STATS_MAX_AGE_S, and memory given back every MEMORY_RELEASE_UNDER_LOAD release intervals.
QUIET_S = 0.1
STATS_MAX_AGE_S = 2.0
MEMORY_RELEASE_UNDER_LOAD = 4
# Arena and heap memory is given back (backend/memory.py) at an idle moment at most this often (config
# memory_release_ms; 0: never): a burst's largest batches then hold their memory a few seconds, not for good.
MEMORY_RELEASE_INTERVAL_S = 5.0


def _classes(requests: "Sequence[tuple[dict[str, np.ndarray], int]]",
             options: "Sequence[RequestOptions]") -> list[tuple[float, int]]:
    """(SLA in seconds, inf for none; priority level) per sample, for ``InlineHooks.inline_batch``."""
    now = time.time()
    out: list[tuple[float, int]] = []
    for (_, batch), opts in zip(requests, options):
        if opts.deadline_unix_s is not None:
            sla = opts.deadline_unix_s - now
        else:
            sla = opts.sla_s if opts.sla_s is not None else math.inf
        out += [(sla, opts.priority)] * batch
    return out


def join_rows(parts: list[Row]) -> np.ndarray:
    """The rows as one batch: a slice of the shared array when they are consecutive rows of it, else a copy."""
    a0, k0 = parts[0]
    n = len(parts)
    if all(a is a0 and k == k0 + i for i, (a, k) in enumerate(parts)):
        return a0 if k0 == 0 and n == a0.shape[0] else a0[k0:k0 + n]
    return np.concatenate([a[k:k + 1] for a, k in parts], axis=0)


def _gather(inp: Any, reqs: list[Request]) -> np.ndarray:
    """One stage input (a model input, or a tensor an earlier stage left with each request) as one batch."""
    if inp.source is None:
        return join_rows([(r.payload.parent.inputs[inp.name], r.payload.row) for r in reqs])
    return join_rows([r.payload.tensors[inp.name] for r in reqs])


class _Timer:
    __slots__ = ("when", "callback", "cancelled")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class WallClock:
    """Monotonic time; timers fire on the scheduler thread, between stages."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Timer]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return time.monotonic()

    def call_at(self, when: float, callback: Callable[[], None]) -> _Timer:
        t = _Timer(when, callback)
        heapq.heappush(self._heap, (when, next(self._seq), t))
        return t

    def next_due(self) -> float | None:
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def fire_due(self) -> None:
        now = time.monotonic()
        while self._heap and self._heap[0][0] <= now:
            _, _, t = heapq.heappop(self._heap)
            if not t.cancelled:
                t.callback()


class _Parent:
    """One client request (possibly several samples)."""

    __slots__ = ("handle", "inputs", "samples", "remaining", "rows", "answered", "checked", "cancel_seen")

    def __init__(self, handle: Any, inputs: dict[str, np.ndarray], batch: int) -> None:
        self.handle = handle
        self.inputs = inputs
        self.samples: list[Request] = []
        self.remaining = batch
        self.rows: list[dict[str, Row] | None] = [None] * batch
        self.answered = False
        self.checked = 0.0  # when is_cancelled() was last asked (backend/cancel_watch.py)
        self.cancel_seen = False


class _Sample:
    __slots__ = ("parent", "row", "tensors")

    def __init__(self, parent: _Parent, row: int) -> None:
        self.parent = parent
        self.row = row
        self.tensors: dict[str, Row] = {}


@dataclass
class RuntimeStats:
    """Where the scheduler thread's time goes; ``overhead_per_stage`` excludes onnxruntime."""

    requests: int = 0
    samples: int = 0
    stage_runs: int = 0
    batch_hist: dict[int, int] = field(default_factory=dict)
    ort_s: float = 0.0
    io_s: float = 0.0  # concatenating inputs and splitting outputs
    sched_s: float = 0.0  # policy decisions, bookkeeping, hand-off
    answered: dict[str, int] = field(default_factory=dict)
    span_runs: int = 0  # jobs that ran several stages with no decision point between (StageJob.stop)
    inline_runs: int = 0  # whole-graph passes run in Triton's execute call, outside the scheduler (run_inline)
    inline_requests: int = 0
    inline_groups: int = 0  # execute calls served inline (inline_runs / inline_groups: passes a group took)
    inline_waits: int = 0  # groups that waited in execute for the scheduler to finish what it held, then ran inline
    # why a group handed to execute went to the scheduler instead (run_inline's refusals, by reason)
    inline_refused: dict[str, int] = field(default_factory=dict)
    time_scale: float = 1.0  # measured / profiled stage time over the model (batcher/calibration.py: its scale)
    host_per_job_s: float = 0.0  # what a job costs besides onnxruntime (moving average): a decision point's cost
    memory_releases: int = 0  # idle moments that released arena and heap memory (backend/memory.py)
    memory_release_s: float = 0.0  # time malloc_trim took on the scheduler thread
    cancel_checks: int = 0  # is_cancelled() round trips the watcher made (backend/cancel_watch.py): its IPC load
    cancel_check_s: float = 0.0  # the wall time they took
    cancel_slip: float = 1.0  # served job time over the table's, as the watcher predicts boundaries with it
    admit_wait_s: float = 0.0  # from execute's hand-off to the scheduler thread taking the request, summed
    admit_wait_max_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        n = max(self.stage_runs, 1)
        return {
            "requests": self.requests, "samples": self.samples, "stage_runs": self.stage_runs,
            "batch_hist": {str(k): v for k, v in sorted(self.batch_hist.items())},
            "ort_s": self.ort_s, "io_s": self.io_s, "sched_s": self.sched_s,
            "mean_stage_ort_ms": self.ort_s / n * 1e3,
            "overhead_per_stage_ms": (self.io_s + self.sched_s) / n * 1e3,
            "overhead_fraction": (self.io_s + self.sched_s) / self.ort_s if self.ort_s else 0.0,
            "answered": dict(self.answered), "time_scale": self.time_scale, "span_runs": self.span_runs,
            "inline_runs": self.inline_runs, "inline_requests": self.inline_requests,
            "inline_groups": self.inline_groups, "inline_waits": self.inline_waits,
            "inline_refused": dict(sorted(self.inline_refused.items())),
            "host_per_job_ms": self.host_per_job_s * 1e3,
            "memory_releases": self.memory_releases, "memory_release_ms": self.memory_release_s * 1e3,
            "cancel_checks": self.cancel_checks, "cancel_check_ms": self.cancel_check_s * 1e3,
            "cancel_slip": self.cancel_slip,
            "admit_wait_mean_ms": self.admit_wait_s / max(self.requests, 1) * 1e3,
            "admit_wait_max_ms": self.admit_wait_max_s * 1e3,
        }


class BackendRuntime:
    """Owns the scheduler thread of one model instance."""

    stats_class: Callable[[], RuntimeStats] = RuntimeStats  # a subclass may count more (backend/seq2seq.py)

    def __init__(self, runner: StageRunner, table: LatencyTable, policy: Policy, respond: Respond, *,
                 is_cancelled: IsCancelled | None = None, cancel_poll_s: float = 0.002,
                 on_idle: "Callable[[BackendRuntime], None] | None" = None,
                 on_batch: "Callable[[int, int, float], None] | None" = None,
                 name: str = "lazybatch", queue_policy: QueuePolicy | None = None,
                 metrics: "M.ModelMetrics | None" = None, fault: FaultInjector | None = None) -> None:
        if table.graph.n != runner.n_stages:
            raise ValueError(f"latency table has {table.graph.n} stages, the stage directory {runner.n_stages}")
        self.runner = runner
        # the verified whole graph (backend/fusion.py), for jobs that span every stage; None: chain the stages
        self.whole_runner: StageRunner | None = None
        self._inline = False  # run_inline allowed (the ``inline`` property)
        self.policy = policy
        self._hooks = inline_hooks(policy)  # the inline route's questions, where the policy answers them
        self._dense = table.dense
        self.calibrator = OnlineCalibrator(table)  # rewrites table.dense in place (the rows _dense holds)
        self._recalibrate_owed = False
        self._recalibrated_at = float("-inf")
        # the policy's boundary_cost follows the measured cost of a job, unless the model's config fixed it
        self.measure_boundary_cost = True
        self.respond = respond
        self.is_cancelled = is_cancelled
        self.cancel_poll_s = cancel_poll_s
        self.on_idle = on_idle  # statistics: called on the scheduler thread at quiet moments (_quiet_hook)
        self.on_batch = on_batch  # (stage, batch size, onnxruntime seconds) after every stage run (batch logs)
        self.clock = WallClock()
        self.stats = self.stats_class()
        self.scheduler = Scheduler(table, policy, _ExecutorAdapter(self), self.clock, on_response=self._on_sample_done)
        # production (docs/operations.md): admission control, metrics, fault injection; and a server keeps only the
        # newest decisions (the metrics read them as they come): the simulator's default of 100,000 records held
        # about 15 MB per model once full, which a soak run showed as memory growth
        if queue_policy is not None:
            self.scheduler.set_queue_policy(queue_policy)
        self.scheduler.log.keep(DECISION_LOG_CAPACITY)
        self.metrics = metrics  # Prometheus bookkeeping (backend/metrics.py), updated on this thread
        self.fault = fault  # fault injection for tests (backend/faults.py), None unless configured
        self._admitting = False  # inside Scheduler.submit_many: an UNAVAILABLE answer now is a rejection
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()  # _Group, _WAKE, or None (close)
        self._job: tuple[StageJob, DoneCallback] | None = None
        self._ids = itertools.count()
        self._live: dict[int, _Parent] = {}
        self._cancelled: queue.SimpleQueue[_Parent] = queue.SimpleQueue()  # seen cancelled by the watcher
        self._dirty = False
        # inline passes' metrics and calibration, applied by the scheduler thread at its idle hook (_apply_deferred)
        self._deferred: collections.deque[tuple[int, int, float, int, float]] = collections.deque()
        self._idle_hook_at = 0.0  # when the idle hook last ran (IDLE_HOOK_INTERVAL_S)
        self._quiet_owed = False  # the statistics file and the memory release wait for a quiet moment (QUIET_S)
        self._quiet_hook_at = 0.0  # when they last ran (STATS_MAX_AGE_S)
        self._worked_at = 0.0  # when the last pass or job ended (monotonic)
        self.memory_release_s = MEMORY_RELEASE_INTERVAL_S  # 0: never (config memory_release_ms)
        self._released_at = time.monotonic()  # when memory was last given back (_release_memory)
        self._stopping = threading.Event()
        self._closed = False
        self._submit_lock = threading.Lock()
        self._pending = 0  # submitted, not yet admitted by the scheduler thread (under _submit_lock)
        self._running: StageJob | None = None  # the job onnxruntime runs now (scheduler thread)
        self._idle = threading.Event()  # set while the scheduler holds nothing (an inline pass may wait for it)
        self._answer_lock = threading.Lock()  # a request is asked for cancellation only while unanswered
        # held by the scheduler thread whenever it is not asleep on the inbox; an inline pass holds it throughout,
        # so that the policy and the table are only ever touched by one thread at a time
        self._busy_lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name=f"{name}-scheduler", daemon=True)
        self._thread.start()
        # cancel_poll_s 0: paced by the stage times (cancel_poll_ms: auto, backend/cancel_watch.py)
        self._watcher = (CancelWatcher(lambda: self._live.values(), is_cancelled, self._on_cancel, cancel_poll_s,
                                       name, lock=self._answer_lock, stage_s=typical_stage_s(table.dense))
                         if is_cancelled is not None else None)

    # ------------------------------------------------------------------ any thread
    @property
    def inline(self) -> bool:
        """Whether ``run_inline`` may run passes: the model turns it on where Triton's dynamic batcher hands
        execute its groups (backend/model.py)."""
        return self._inline

    @inline.setter
    def inline(self, on: bool) -> None:
        self._inline = bool(on)
        self._inbox.put(_WAKE)  # the scheduler thread may sleep with no timeout: from now on it looks in on them

    @staticmethod
    def check_deadline(opts: RequestOptions) -> str | None:
        """An error message for a request whose own deadline passed before it reached the model, else None."""
        if opts.deadline_unix_s is not None:
            left = opts.deadline_unix_s - time.time()
            if left <= 0:
                return f"the request's deadline passed {-left * 1e3:.1f} ms before it reached the model"
        return None

    def submit(self, handle: Any, inputs: dict[str, np.ndarray], batch: int, opts: RequestOptions) -> str | None:
        """Queue a validated request; returns an error message instead when it cannot be accepted."""
        return self.submit_group([(handle, inputs, batch, opts)])[0]

    def submit_group(self, group: "Sequence[tuple[Any, dict[str, np.ndarray], int, RequestOptions]]"
                     ) -> list[str | None]:
        """Queue requests that reached the model together (one ``execute`` call) as one arrival: the scheduler
        admits them in one go and asks its policy once, so an idle device does not start the first alone. Returns
        per request None (queued) or why it cannot be accepted (it is then not queued)."""
        arrival = time.monotonic()
        errors: list[str | None] = [self.check_deadline(opts) for *_, opts in group]
        with self._submit_lock:
            if self._closed:
                return [err or "the model is shutting down; retry on another instance" for err in errors]
            items = [(_Parent(h, inputs, batch), opts, arrival)
                     for (h, inputs, batch, opts), err in zip(group, errors) if err is None]
            if items:
                self._idle.clear()
                self._inbox.put(_Group(items))
                self._pending += len(items)
        return errors

    def run_inline(self, requests: list[tuple[dict[str, np.ndarray], int]],
                   early: "Callable[[int, dict[str, np.ndarray] | str], None] | None" = None,
                   options: "Sequence[RequestOptions] | None" = None
                   ) -> "list[dict[str, np.ndarray] | str | None] | None":
        """Run these validated requests now, on the caller's thread (Triton's ``execute``), as whole-graph passes,
        and return each one's outputs, or the error it failed with (a batch that fails is rerun request by
        request, so that only the requests that fail alone get the error); None: they must all go to the
        scheduler (``submit``). Where the policy serves the group in several passes one after the other, the
        requests of all but the last pass are handed to ``early`` (index, outputs or error) as soon as their pass
        ends, and their entries in the list are None.

        Why: a request that goes through the scheduler costs a hand-off to its thread, another to the response
        thread and a response round trip of its own, on the cores onnxruntime needs (docs/results/default.md: the
        served gap to Triton's batcher was that cost, not the decisions). Passes run inline only where they are
        the ones the scheduler would run: nothing held, and the policy would start these requests so, with no
        decision point in their passes (``InlineHooks.inline_batch``). Triton's dynamic batcher queues what arrives
        meanwhile and hands it to the next ``execute`` as one group: its own behaviour with no queue delay.
        ``options``: each request's scheduling options (SLA, priority level), which tell the policy the classes of
        the traffic (an urgent member may need the scheduler, and boundaries kept for the next one)."""
        whole = self.whole_runner
        if whole is None or not self._inline or self._hooks is None:
            return None
        if (self._job is not None or self._live or self._pending) and not self._await_idle():
            return None
        if not self._acquire_for_inline():
            return self._refuse("scheduler thread's bookkeeping")
        try:
            if self._closed or self._job is not None or self._live or self._pending or self.scheduler.held:
                return self._refuse("scheduler busy")
            n = requests[0][1] if len(requests) == 1 else sum(b for _, b in requests)
            start = time.monotonic()
            hooks = self._hooks
            classes = _classes(requests, options) if options is not None and hooks.needs_classes else None
            k = hooks.inline_batch(start, n, classes)
            if k <= 0 or (k < n and early is None):
                return self._refuse("a boundary may pay")
            self.stats.inline_groups += 1
            if k >= n:  # one pass (the common case: spared the bookkeeping of several)
                chunks: list[list[int]] = [list(range(len(requests)))]
            else:
                chunks = [[]]
                size = 0
                for i, (_, b) in enumerate(requests):  # whole requests, at most k samples a pass (or one larger)
                    if chunks[-1] and size + b > k:
                        chunks.append([])
                        size = 0
                    chunks[-1].append(i)
                    size += b
            results: list[dict[str, np.ndarray] | None] = [None] * len(requests)
            names = whole.input_names
            for c, idx in enumerate(chunks):
                t0 = t1 = time.perf_counter()
                try:
                    feeds = {name: requests[idx[0]][0][name] if len(idx) == 1 else
                             np.concatenate([requests[i][0][name] for i in idx]) for name in names}
                    t1 = time.perf_counter()
                    outs = whole.run(0, feeds)
                except Exception as e:  # each request alone: only the ones that fail on their own get the error
                    if self.metrics is not None:
                        self.metrics.stage_failed(0)
                    for i in idx:
                        results[i] = self._run_alone(whole, names, requests[i][0]) if len(idx) > 1 else \
                            f"{type(e).__name__}: {e}"
                    failed = sum(1 for i in idx if isinstance(results[i], str))
                    self._inline_stats(len(idx) - failed, sum(requests[i][1] for i in idx), 0.0, 0.0, start,
                                       failed=failed, took=0.0)
                    if c < len(chunks) - 1:
                        for i in idx:
                            early(i, results[i])  # type: ignore[misc]
                            results[i] = None
                    continue
                t2 = time.perf_counter()
                row = 0
                for i in idx:
                    b = requests[i][1]
                    results[i] = outs if len(idx) == 1 else {o: v[row:row + b] for o, v in outs.items()}
                    row += b
                t3 = time.perf_counter()
                m = n if len(chunks) == 1 else sum(requests[i][1] for i in idx)
                self._inline_stats(len(idx), m, t1 - t0 + t3 - t2, t2 - t1, start, took=t3 - t0)
                if c < len(chunks) - 1:
                    for i in idx:
                        early(i, results[i])  # type: ignore[misc]
                        results[i] = None
            self._worked_at = end = time.monotonic()
            hooks.inline_done(start, end, n)
            return results
        finally:
            self._busy_lock.release()

    def _acquire_for_inline(self) -> bool:
        """Take the scheduler thread's lock: briefly where it may be between jobs, longer where it holds no job
        and can only be at its idle hook."""
        if self._busy_lock.acquire(timeout=INLINE_LOCK_WAIT_S):
            return True
        if self._job is not None or self._running is not None or self._live or self._pending:
            return False
        return self._busy_lock.acquire(timeout=INLINE_BOOKKEEPING_WAIT_S)

    def _await_idle(self) -> bool:
        """Wait (in execute) for the scheduler to hold nothing where these requests could only follow its work
        (``InlineHooks.inline_wait``); True once it holds nothing."""
        left = self._hooks.inline_wait(time.monotonic(), self._running, self._pending)  # type: ignore[union-attr]
        if left is None:
            self._refuse("scheduler busy")
            return False
        if not self._idle.wait(2.0 * left + INLINE_WAIT_SLACK_S):
            self._refuse("scheduler busy past its predicted end")
            return False
        self.stats.inline_waits += 1
        return True

    def _refuse(self, reason: str) -> None:
        """Count why a group goes to the scheduler instead (statistics ``inline_refused``); run_inline returns
        this None."""
        refused = self.stats.inline_refused
        refused[reason] = refused.get(reason, 0) + 1

    def _run_alone(self, whole: StageRunner, names: list[str],
                   inputs: dict[str, np.ndarray]) -> "dict[str, np.ndarray] | str":
        try:
            return whole.run(0, {name: inputs[name] for name in names})
        except Exception as e:  # onnxruntime failure: this request fails, the server goes on
            if self.metrics is not None:
                self.metrics.stage_failed(0)
            return f"{type(e).__name__}: {e}"

    def _inline_stats(self, requests: int, n: int, io_s: float, ort_s: float, start: float, *,
                      failed: int = 0, took: float) -> None:
        """One inline pass of ``requests`` answered (and ``failed`` that failed alone), ``n`` samples in all, that
        took ``took`` seconds (0: it failed). The counters are kept now; the metrics and the calibration of the
        table are left to the scheduler thread (``_apply_deferred``): done here they delayed the answer, which
        Triton sends when ``execute`` returns, by 4% of a 3.5 ms MobileNet pass (benchmarks/probes/probe_idle_cost.py)."""
        stats = self.stats
        stats.requests += requests + failed
        stats.samples += n
        stats.inline_runs += 1
        stats.inline_requests += requests + failed
        stats.stage_runs += 1
        stats.batch_hist[n] = stats.batch_hist.get(n, 0) + 1
        stats.ort_s += ort_s
        stats.io_s += io_s
        stats.answered["OK"] = stats.answered.get("OK", 0) + requests
        if failed:
            stats.answered["ERROR"] = stats.answered.get("ERROR", 0) + failed
        self._dirty = True
        if self.on_batch is not None and ort_s:
            self.on_batch(0, n, ort_s)
        # from execute: Triton's own queue time is in its nv_inference_*
        self._deferred.append((n, requests, time.monotonic() - start, failed, took))

    def _apply_deferred(self) -> None:
        """The inline passes' metrics and calibration (``_inline_stats``); scheduler thread, under the busy lock
        (the calibrator and the policy's table are this thread's)."""
        deferred = self._deferred
        n_stages = self.runner.n_stages
        while deferred:
            n, ok, latency, failed, took = deferred.popleft()
            if self.metrics is not None:
                self.metrics.pass_done(n_stages, n, ok, latency, failed)
            if took > 0.0:
                self._calibrate_span(0, n_stages, n, took)

    def close(self, timeout: float = 30.0) -> None:
        """Answer everything still held with UNAVAILABLE and stop the thread."""
        with self._submit_lock:
            self._closed = True
            self._inbox.put(None)
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.close()
        self._thread.join(timeout)

    def _on_cancel(self, parent: _Parent) -> None:
        """The watcher saw ``parent`` cancelled (watcher thread): wake the scheduler thread to answer it."""
        self._cancelled.put(parent)
        self._inbox.put(_WAKE)

    # ------------------------------------------------------------------ Executor (scheduler thread)
    def submit_job(self, job: StageJob, done: DoneCallback) -> None:
        self._job = (job, done)

    # ------------------------------------------------------------------ scheduler thread
    def _loop(self) -> None:
        clock = self.clock
        stats = self.stats
        try:
            while True:
                if self._job is None:
                    due = clock.next_due()
                    if (self._dirty or self._quiet_owed) and not self._live:  # about to wait with nothing held
                        now = time.monotonic()
                        if self._dirty and now - self._idle_hook_at >= IDLE_HOOK_INTERVAL_S:
                            with self._busy_lock:
                                self._dirty = False
                                self._quiet_owed = True
                                self._idle_hook_at = now
                                self._apply_deferred()
                                self._idle_hook()
                        if self._quiet_owed and not self._dirty and (
                                now - self._worked_at >= QUIET_S or now - self._quiet_hook_at >= STATS_MAX_AGE_S):
                            with self._busy_lock:
                                self._quiet_owed = False
                                self._quiet_hook_at = now
                                self._quiet_hook(now)
                    hook = None
                    if self._dirty:  # the hook is owed: at its interval
                        hook = max(self._idle_hook_at + IDLE_HOOK_INTERVAL_S, time.monotonic() + 1e-3)
                    elif self._quiet_owed:  # ... and then the quiet one, once nothing has run for QUIET_S
                        hook = max(min(self._worked_at + QUIET_S, self._quiet_hook_at + STATS_MAX_AGE_S),
                                   time.monotonic() + 1e-3)
                    elif self._inline:
                        # inline passes, which never wake this thread, may make it owed (their metrics and
                        # calibration are applied by it, _apply_deferred): look in once an interval.
                        # (Not "at the interval after the last hook": with nothing owed that moment is past, and
                        # the thread woke every millisecond, 25 ms of CPU a second in an idle stub.)
                        hook = time.monotonic() + IDLE_HOOK_INTERVAL_S
                    if hook is not None:
                        due = hook if due is None else min(due, hook)
                    timeout = None if due is None else max(0.0, due - time.monotonic())
                    with self._submit_lock:
                        if not self._live and not self._pending:
                            self._idle.set()  # a group waiting in execute runs inline now
                    item = self._wait(timeout)
                    with self._busy_lock:
                        if item is None or not self._drain(block=False, first=item):
                            break
                        t0 = time.perf_counter()
                        clock.fire_due()
                        stats.sched_s += time.perf_counter() - t0
                    continue
                with self._busy_lock:
                    if not self._run_next(stats):
                        break
        except Exception:  # pragma: no cover - a bug; make it loud and answer what is held
            traceback.print_exc()
        finally:
            with self._busy_lock:
                self._shutdown()
                self._apply_deferred()
                self._idle_hook()
                self._write_statistics()

    def _wait(self, timeout: float | None) -> Any:
        """The next inbox item, or _WAKE when ``timeout`` (a timer) passes first; None once close() was called."""
        try:
            return self._inbox.get(timeout=timeout) if timeout is None or timeout > 0 else self._inbox.get_nowait()
        except queue.Empty:
            return _WAKE

    def _run_next(self, stats: RuntimeStats) -> bool:
        """Run the job the scheduler gave, then report it done; False once close() was called."""
        clock = self.clock
        if True:
                job, done = self._job
                self._job = None
                self._running = job
                t_job = time.perf_counter()
                ort_before = stats.ort_s
                watcher = self._watcher
                if watcher is not None:  # it asks these requests just before the job should end
                    watcher.job_started(job.requests, self._expected_s(job))
                result = self._run(job)
                if watcher is not None:
                    watcher.job_ended()
                if self.metrics is not None:  # here, not in _run_batch: subclasses replace that (seq2seq)
                    ran = sum(1 for r in job.requests if not r.cancelled)
                    if ran:
                        for stage in job.span:
                            self.metrics.stage_run(stage, ran)
                t_drain = time.perf_counter()
                if not self._drain(block=False):
                    return False
                t0 = time.perf_counter()
                self._running = None
                done(job, result)
                clock.fire_due()
                if self.metrics is not None:
                    self._sync_metrics(0.05)
                t1 = time.perf_counter()
                self._worked_at = time.monotonic()
                stats.sched_s += t1 - t0
                # what a decision point costs besides onnxruntime (arrivals admitted meanwhile are not its cost)
                self._boundary_cost((t1 - t_job) - (t0 - t_drain) - (stats.ort_s - ort_before))
        return True

    def _sync_metrics(self, min_interval: float = 0.0) -> None:
        self.metrics.sync_scheduler(self.scheduler.log, held=self.scheduler.held, policy=self.scheduler.policy,
                                    min_interval=min_interval)

    def _release_memory(self, now: float) -> None:
        """Nothing held and something ran since the last release: the sessions' next runs shrink their arenas,
        and glibc returns its free heap pages now (a few ms at most, on this otherwise idle thread)."""
        self._released_at = now
        for runner in (self.runner, self.whole_runner):
            release = getattr(runner, "release_arenas", None)  # executor wrappers (npu) may have no arenas
            if release is not None:
                release()
        t0 = time.perf_counter()
        if malloc_trim():
            self.stats.memory_releases += 1
            self.stats.memory_release_s += time.perf_counter() - t0

    def _idle_hook(self) -> None:
        """At most once an IDLE_HOOK_INTERVAL_S with nothing held: the counters the metrics read."""
        if self._watcher is not None:
            self.stats.cancel_checks = self._watcher.checks
            self.stats.cancel_check_s = self._watcher.check_s
            self.stats.cancel_slip = self._watcher.slip
        if self.metrics is not None:
            self._sync_metrics()

    def _quiet_hook(self, now: float) -> None:
        """After an idle hook, once nothing has run for QUIET_S (or the file is STATS_MAX_AGE_S old): the statistics
        file, and the memory given back (at most once a ``memory_release_s``)."""
        # memory at rest, or (load that never pauses) at the latest every MEMORY_RELEASE_UNDER_LOAD intervals: a
        # burst's high-water mark is not kept for good by the steady load after it
        since = now - self._released_at
        if self.memory_release_s and since >= self.memory_release_s and (
                now - self._worked_at >= QUIET_S or since >= MEMORY_RELEASE_UNDER_LOAD * self.memory_release_s):
            self._release_memory(now)
        self._write_statistics()

    def _write_statistics(self) -> None:
        if self.on_idle is not None:
            try:
                self.on_idle(self)
            except Exception:  # statistics are best effort
                traceback.print_exc()

    def _drain(self, *, block: bool = False, first: Any = None) -> bool:
        """Submit every queued arrival to the scheduler (``first``: one already taken off the inbox); False once
        close() was called."""
        while True:
            if first is not None:
                item, first = first, None
            else:
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    return True
            if item is None:
                return False
            if item is _WAKE:
                self._answer_cancelled()
                continue
            with self.scheduler.deferred_dispatch():  # the requests of one execute call: one arrival
                for one in item.items:
                    self._admit(*one)

    def _admit(self, parent: _Parent, opts: RequestOptions, arrival: float) -> None:
        t0 = time.perf_counter()
        with self._submit_lock:
            self._pending -= 1
        if opts.deadline_unix_s is not None:
            deadline = arrival + (opts.deadline_unix_s - time.time())
            kw: dict[str, float] = {"deadline": deadline if deadline > arrival else arrival + 1e-9}
        elif opts.sla_s is not None:
            kw = {"sla": opts.sla_s}
        else:
            kw = {}
        key = id(parent)
        self._live[key] = parent
        if self._watcher is not None:
            self._watcher.held_changed()
        self.stats.requests += 1
        wait = self.clock.now() - arrival
        self.stats.admit_wait_s += wait
        self.stats.admit_wait_max_s = max(self.stats.admit_wait_max_s, wait)
        for row in range(parent.remaining):
            r = Request(next(self._ids), arrival, priority=opts.priority, **self._sample_args(parent, row), **kw)
            parent.samples.append(r)
        self.stats.samples += len(parent.samples)
        # admitted or refused as a group; a refusal answers the request (UNAVAILABLE) inside submit_many
        self._admitting = True
        try:
            refused = self.scheduler.submit_many(parent.samples)
        finally:
            self._admitting = False
        if refused is not None and self.metrics is not None:
            self._sync_metrics(0.05)
        self.stats.sched_s += time.perf_counter() - t0

    def _sample_args(self, parent: _Parent, row: int) -> dict[str, Any]:
        """Request() arguments of one sample (a seq2seq runtime adds its per-sequence state and enc_steps)."""
        return {"payload": _Sample(parent, row)}

    def _run(self, job: StageJob) -> StageResult | None:
        """Run the job's stage (or span of stages) on its (not cancelled) requests: concatenate, onnxruntime, split.

        If the batched run fails, each request is run alone so that only the ones that fail on their own are
        answered with the error; the rest of the batch goes on.
        """
        reqs = [r for r in job.requests if not r.cancelled]
        if not reqs:
            return None
        if job.stop == job.stage + 1:
            run: Callable[[list[Request]], None] = functools.partial(self._run_batch, job.stage)
        else:
            run = functools.partial(self._run_span, job.stage, job.stop)
        try:
            run(reqs)
            return None
        except Exception as e:
            if self.metrics is not None:  # a span's failure counts against its first stage unless the error says
                self.metrics.stage_failed(e.stage if isinstance(e, InjectedFault) else job.stage)
            if len(reqs) == 1 or isinstance(e, InPlaceRunError):  # in place: the inputs are gone, no rerun
                return StageResult(errors={r.id: f"{type(e).__name__}: {e}" for r in reqs})
        errors: dict[int, str] = {}
        for r in reqs:
            try:
                run([r])
            except Exception as e:  # onnxruntime failure: this request fails, the server goes on
                if self.metrics is not None:
                    self.metrics.stage_failed(e.stage if isinstance(e, InjectedFault) else job.stage)
                errors[r.id] = f"{type(e).__name__}: {e}"
        return StageResult(errors=errors) if errors else None

    def _run_span(self, start: int, stop: int, reqs: list[Request]) -> None:
        """Stages ``start .. stop-1`` on one batch with no decision point between them (``StageJob.stop``): the
        inputs are joined once, the batch's tensors pass from stage to stage as they are, and only what later stages
        or the answer read is split per request at the end. The whole graph (0..n) runs as one onnxruntime call
        where the backend holds the verified whole-graph session (``whole_runner``)."""
        runner = self.runner
        stages = runner.manifest.stages
        stats = self.stats
        t0 = time.perf_counter()
        whole = self.whole_runner if start == 0 and stop == runner.n_stages else None
        feeds: dict[str, np.ndarray] = {}
        need = [i for s in range(start, stop) for i in stages[s].inputs
                if i.source is None or i.source < start]
        for inp in need:
            if inp.name not in feeds:
                feeds[inp.name] = _gather(inp, reqs)
        t1 = time.perf_counter()
        if self.fault is not None:
            ids = [r.id for r in reqs]
            for s in range(start, stop):
                self.fault.check(s, ids)
        if whole is not None:
            tensors = whole.run(0, feeds, owned=True)
        else:
            tensors = dict(feeds)
            for s in range(start, stop):
                spec = stages[s]
                tensors.update(runner.run(s, {i.name: tensors[i.name] for i in spec.inputs}, owned=True))
        t2 = time.perf_counter()
        keep = [name for name, arr in tensors.items() if runner.last_use.get(name, -1) >= stop]
        for k, r in enumerate(reqs):
            own = r.payload.tensors
            for name in keep:
                own[name] = (tensors[name], k)
            for s in range(start, stop):
                for name in runner.drop_after[s]:
                    own.pop(name, None)
        t3 = time.perf_counter()
        stats.stage_runs += 1
        stats.span_runs += 1
        stats.batch_hist[len(reqs)] = stats.batch_hist.get(len(reqs), 0) + 1
        stats.ort_s += t2 - t1
        stats.io_s += (t1 - t0) + (t3 - t2)
        if self.on_batch is not None:
            self.on_batch(start, len(reqs), t2 - t1)
        # a whole-graph pass too: the table must follow what the device does, and at low load nearly every
        # request is one (its time shared among the stages by their table times)
        self._calibrate_span(start, stop, len(reqs), t3 - t0)

    def _run_batch(self, stage: int, reqs: list[Request]) -> None:
        runner = self.runner
        spec = runner.manifest.stages[stage]
        stats = self.stats
        t0 = time.perf_counter()
        feeds = {inp.name: _gather(inp, reqs) for inp in spec.inputs}
        t1 = time.perf_counter()
        if self.fault is not None:
            self.fault.check(stage, [r.id for r in reqs])
        outs = runner.run(stage, feeds, owned=True)  # join_rows' arrays: this batch's alone, see StageRunner.run
        t2 = time.perf_counter()
        for k, r in enumerate(reqs):
            tensors = r.payload.tensors
            for name, arr in outs.items():
                tensors[name] = (arr, k)
            for name in runner.drop_after[stage]:
                tensors.pop(name, None)
        t3 = time.perf_counter()
        stats.stage_runs += 1
        stats.batch_hist[len(reqs)] = stats.batch_hist.get(len(reqs), 0) + 1
        stats.ort_s += t2 - t1
        stats.io_s += (t1 - t0) + (t3 - t2)
        if self.on_batch is not None:
            self.on_batch(stage, len(reqs), t2 - t1)
        self._calibrate(stage, len(reqs), t3 - t0)  # what the stage costs served: onnxruntime, join and split

    def _calibrate(self, stage: int, batch: int, took: float) -> None:
        """Keep the policy's table true: the onnxruntime time of every stage run goes to the online calibrator
        (batcher/calibration.py), which rewrites the table per stage and batch size; policies then recompute what
        they derived from it. Why: the table is profiled once, alone; served next to other work the stages run
        slower, not uniformly, and a predictor that believes the profile admits work that then misses its
        deadline."""
        if self.calibrator.observe(stage, batch, took, refresh=False):
            self._recalibrate_owed = True
        self._maybe_recalibrate()

    def _maybe_recalibrate(self) -> None:
        if self._recalibrate_owed:
            now = time.monotonic()
            if now - self._recalibrated_at >= RECALIBRATE_INTERVAL_S:
                self._recalibrate_owed = False
                self._recalibrated_at = now
                self.calibrator.refresh()
                self.policy.table_changed()
                self.stats.time_scale = self.calibrator.scale
                if self._watcher is not None and self._watcher.auto:  # the stage time it is paced by
                    self._watcher.interval = auto_interval(typical_stage_s(self._dense))

    def _expected_s(self, job: StageJob) -> float:
        """How long the job should take, from the (calibrated) latency table."""
        dense = self._dense
        b = job.batch_size
        t = 0.0
        for s in job.span:
            row = dense[s]
            t += row[b] if b < len(row) else row[-1] * b / (len(row) - 1)
        return t

    def _calibrate_span(self, start: int, stop: int, batch: int, took: float) -> None:
        """A span's time shared among its stages in proportion to their table times (a whole-graph pass has no
        per-stage times of its own)."""
        if batch >= len(self._dense[start]):
            return
        if self.calibrator.observe_span(start, stop, batch, took, refresh=False):
            self._recalibrate_owed = True
        self._maybe_recalibrate()

    def _boundary_cost(self, host_s: float) -> None:
        """A moving average of what one job costs the scheduler thread besides onnxruntime: tensors joined and
        split, the policy's decision, the hand-off. A policy that weighs decision points against their cost
        (``boundary_cost``, batcher/policies/eager.py) reads it, unless the model's config fixed it."""
        stats = self.stats
        if host_s < 0.0:
            return
        stats.host_per_job_s += BOUNDARY_COST_WEIGHT * (host_s - stats.host_per_job_s) if stats.stage_runs > 1 \
            else host_s - stats.host_per_job_s
        if self.measure_boundary_cost and hasattr(self.policy, "boundary_cost"):
            self.policy.boundary_cost = stats.host_per_job_s

    def _answer_cancelled(self) -> None:
        """Answer the requests the watcher saw cancelled, at once: queued ones need not wait for their turn, running
        ones leave their sub-batch at the next stage boundary (their samples are flagged)."""
        while True:
            try:
                parent = self._cancelled.get_nowait()
            except queue.Empty:
                return
            if parent.answered:
                continue
            for r in parent.samples:
                r.cancelled = True
            self._answer(parent, None, Status.CANCELLED, "request was cancelled by the client")

    def _on_sample_done(self, r: Request) -> None:
        sample: _Sample = r.payload
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
            outputs = {o: join_rows([x[o] for x in rows]) for o in self.runner.output_names}
            self._answer(parent, outputs, Status.OK, None)
        else:
            for sib in parent.samples:
                sib.cancelled = True
            self._answer(parent, None, r.status, r.error)

    def _answer(self, parent: _Parent, outputs: dict[str, np.ndarray] | None, status: Status,
                error: str | None) -> None:
        with self._answer_lock:  # the watcher never asks an answered request (backend/cancel_watch.py)
            parent.answered = True
        self._dirty = True
        self._live.pop(id(parent), None)
        self.stats.answered[status.name] = self.stats.answered.get(status.name, 0) + 1
        if self.metrics is not None:
            self._record(parent, status)
        try:
            self.respond(parent.handle, outputs, status, error)
        except Exception:  # a response that cannot be sent must not stop the thread
            traceback.print_exc()

    def _record(self, parent: _Parent, status: Status) -> None:
        """One answered client request into the metrics: outcome, latencies, SLA."""
        samples = parent.samples
        if status is Status.OK:
            now = time.monotonic()
            first = samples[0]
            starts = [r.start for r in samples if r.start is not None]
            deadline = min(r.deadline for r in samples)
            self.metrics.request_done(M.OK, latency=now - first.arrival,
                                      queue_delay=min(starts) - first.arrival if starts else None,
                                      sla_met=None if deadline == float("inf") else now <= deadline)
        elif status is Status.UNAVAILABLE and self._admitting:
            self.metrics.request_done(M.REJECTED, reject_reason=self.scheduler.last_rejection or "refused")
        else:
            outcome = {Status.CANCELLED: M.CANCELLED, Status.ERROR: M.ERROR}.get(status, M.UNAVAILABLE)
            self.metrics.request_done(outcome)

    def _shutdown(self) -> None:
        # answer what is still queued or held: nothing is lost
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Group):  # None (the close) and _WAKE (a cancellation to look at) hold no request
                for parent, _, _ in item.items:
                    self._live[id(parent)] = parent
        self.scheduler.close("the model was unloaded before the request finished")
        for parent in list(self._live.values()):
            if not parent.answered:
                self._answer(parent, None, Status.UNAVAILABLE, "the model was unloaded before the request finished")


# The scheduler calls executor.submit(job, done); requests come in through BackendRuntime.submit: a small adapter
# keeps the two apart.
class _ExecutorAdapter:
    __slots__ = ("rt",)

    def __init__(self, rt: BackendRuntime) -> None:
        self.rt = rt

    def submit(self, job: StageJob, done: DoneCallback) -> None:
        self.rt.submit_job(job, done)
