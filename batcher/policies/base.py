"""The one interface every batching policy implements, and the progress bookkeeping they share."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import deque
from typing import TYPE_CHECKING

from ..decisions import REJECT, DecisionLog
from ..errors import ConfigError
from ..graph import ModelGraph, StageType
from ..interfaces import StageJob, StageResult
from ..latency_table import LatencyTable
from ..request import Request, Status

if TYPE_CHECKING:  # pragma: no cover
    from ..scheduler import Scheduler

DEFAULT_MAX_BATCH_SIZE = 64


def enqueue_by_priority(queue: "deque[Request]", request: Request) -> None:
    """Append ``request`` behind every queued request of the same or a more urgent priority level.

    Levels follow Triton's: a smaller ``Request.priority`` is more urgent; requests of one level keep arrival
    order. With one level (the default: every priority 0) this is a plain append, and it stays O(1) whenever
    requests arrive in priority order; a more urgent arrival walks past the less urgent tail only.
    """
    if not queue or queue[-1].priority <= request.priority:
        queue.append(request)
        return
    i = len(queue) - 1
    while i > 0 and queue[i - 1].priority > request.priority:
        i -= 1
    queue.insert(i, request)


class Policy(ABC):
    """Decides what the device runs next.

    The scheduler calls ``enqueue`` on arrival, ``next_job`` whenever the device is idle (after an arrival, a stage
    completion or a timer) and ``job_done`` when a stage completes. ``next_job`` returns the job to run, a time to
    be woken at (a batching window), or None to stay idle until the next arrival. The requests a call answered
    (done, failed, cancelled) are left in ``finished``, which the scheduler takes after each call: a policy never
    calls back into its scheduler.
    """

    name = "policy"

    def __init__(self, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> None:
        if not isinstance(max_batch_size, int) or isinstance(max_batch_size, bool) or max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be a positive integer, got {max_batch_size!r}",
                              field="max_batch_size")
        self.max_batch_size = max_batch_size
        self.table: LatencyTable
        self.graph: ModelGraph
        self.log: DecisionLog
        self.finished: list[tuple[Request, Status, str | None]] = []  # answered, for the scheduler to take

    def attach(self, scheduler: "Scheduler") -> None:
        self.table = scheduler.table
        self.graph = scheduler.table.graph
        self.log = scheduler.log
        self.table.check_covers(self.max_batch_size)

    def table_changed(self) -> None:
        """The latency table was rewritten in place (online recalibration): recompute anything derived from it."""

    @abstractmethod
    def enqueue(self, request: Request, now: float) -> None: ...

    @abstractmethod
    def next_job(self, now: float) -> StageJob | float | None: ...

    @abstractmethod
    def job_done(self, job: StageJob, result: StageResult | None, now: float) -> None: ...

    @abstractmethod
    def held(self) -> list[Request]:
        """Every request the policy holds (queued or in flight), for shutdown."""

    @abstractmethod
    def clear(self) -> None:
        """Forget every request held (after the scheduler has answered them)."""

    def describe(self) -> str:
        return f"{self.name}(max_batch_size={self.max_batch_size})"

    def least_slack(self, now: float) -> float:
        """How much at risk the requests held are, for a device shared with other models (batcher/device.py): the
        least, over the requests held, of deadline - now - the predicted remaining single-input time (the
        LazyBatching paper's check of co-located models' on-going requests); inf without deadlines.

        This default walks every request held and counts each as not started (its ``est``, else the whole graph
        at batch 1); LazyBatching (and eager) answer from their BatchTable in O(sub-batches)."""
        whole = sum(self.table.single)
        return min((r.deadline - (r.est or whole) for r in self.held()), default=math.inf) - now

    # ------------------------------------------------------------------ shared bookkeeping
    def _finish(self, request: Request, status: Status, error: str | None) -> None:
        """Answer ``request``: the scheduler takes it from ``finished`` when this call returns."""
        self.finished.append((request, status, error))

    def advance(self, job: StageJob, result: StageResult | None, now: float) -> tuple[int, list[Request],
                                                                                      int, list[Request]]:
        """Move the job's requests past its stage.

        Returns ``(next_stage, requests, exit_stage, exited)``: the requests that go on to ``next_stage`` and, at the
        end of a loop body, those that leave the loop for ``exit_stage``. A stage index equal to the number of
        stages means "finished". Failed and cancelled requests are answered here and appear in neither list.
        """
        g = self.graph
        s = job.stage
        reqs = job.requests
        errors = result.errors if result is not None else None
        if errors:
            ok = []
            for r in reqs:
                msg = errors.get(r.id)
                if msg is None:
                    ok.append(r)
                else:
                    self._finish(r, Status.ERROR, f"stage {g.stages[s].name!r} failed: {msg}")
            reqs = ok
        if any(r.cancelled for r in reqs):
            keep = []
            for r in reqs:
                if r.cancelled:
                    self.log.add(now, REJECT, s, 1, "cancelled by the client")
                    self._finish(r, Status.CANCELLED, "request was cancelled")
                else:
                    keep.append(r)
            reqs = keep
        if job.stop != s + 1:  # a span of static stages (StageJob.stop): no loop ends inside it
            return job.stop, reqs, job.stop, []
        if not g.is_loop_end[s]:
            return s + 1, reqs, s + 1, []
        exits = result.loop_exits if result is not None else None
        kind = g.loop_type[s]
        cont: list[Request] = []
        out: list[Request] = []
        for r in reqs:
            r.loop_iter += 1
            if kind is StageType.DECODER and r.first_token is None:
                r.first_token = now
            if exits is not None:
                leaving = r.id in exits
            elif kind is StageType.ENCODER:
                leaving = r.loop_iter >= r.enc_steps
            elif r.dec_steps is not None:
                leaving = r.loop_iter >= r.dec_steps
            else:
                self._finish(r, Status.ERROR, "the executor did not report whether decoding ended and the request "
                                              "has no dec_steps")
                continue
            if leaving:
                r.loop_iter = 0
                out.append(r)
            else:
                cont.append(r)
        return g.block_start[s], cont, s + 1, out
