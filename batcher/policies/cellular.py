"""Cellular batching (Gao et al., "Low Latency RNN Inference with Cellular Batching", EuroSys 2018; BatchMaker).

The baseline the LazyBatching paper discusses in section III-B (seed 003 is the paper). Every stage is a "cell
type" whose weights are shared by all requests, so the ready cells of *any* requests waiting at the same stage can
run as one batch, whatever timestep each request is at: a new request joins the ongoing execution as soon as it
reaches a stage that others are waiting at, and leaves as soon as its own last cell is done.

BatchMaker's Algorithm 1 on one device (one worker, so "no running task" holds for every cell type whenever the
device is idle, and subgraph pinning is moot):

1. the cell types with at least ``max_batch_size`` ready cells, else
2. every cell type with a ready cell;
3. among those, the one with the highest priority: cells later in the graph first ("decoder nodes should have
   priority over encoder nodes"), which lets in-flight requests finish before new ones start;
4. batch up to ``max_batch_size`` of its ready cells, oldest request first (BatchMaker scans a cell type's queue of
   subgraphs in order, and a request's subgraph keeps its place while its later cells run).

No SLA, no batching window, no slack test. On graphs without loops this degenerates into whole-graph batching with
no window while fewer than ``max_batch_size`` requests wait (a new request cannot join a batch that is already past
stage 0, and the later stages always win), which is why the LazyBatching paper reports it identical to graph
batching on its workloads; only a full batch of new requests (rule 1) overtakes the batch in flight; on seq2seq models it batches
decoder steps of requests at different timesteps, like LazyBatching, but never preempts for new arrivals.
"""

from __future__ import annotations

import heapq
from itertools import count
from typing import TYPE_CHECKING

from ..decisions import DISPATCH
from ..interfaces import StageJob, StageResult
from ..request import Request, Status
from .base import DEFAULT_MAX_BATCH_SIZE, Policy

if TYPE_CHECKING:  # pragma: no cover
    from ..scheduler import Scheduler


class CellularBatching(Policy):
    """Batch the ready cells of one stage across requests, latest stage first."""

    name = "cellular"

    def __init__(self, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> None:
        super().__init__(max_batch_size)
        # per stage, a heap of (priority level, arrival, sequence number, request): the most urgent level's oldest
        # request's cell is batched first
        self.ready: list[list[tuple[int, float, int, Request]]] = []
        self._seq = count()

    def attach(self, scheduler: "Scheduler") -> None:
        super().attach(scheduler)
        self.ready = [[] for _ in range(self.graph.n)]

    def _push(self, stage: int, request: Request) -> None:
        heapq.heappush(self.ready[stage], (request.priority, request.arrival, next(self._seq), request))

    def enqueue(self, request: Request, now: float) -> None:
        self._push(0, request)

    def _pick_stage(self) -> tuple[int, str] | None:
        full = -1
        any_ready = -1
        for s in range(len(self.ready) - 1, -1, -1):
            n = len(self.ready[s])
            if n >= self.max_batch_size:
                full = s
                break
            if n and any_ready < 0:
                any_ready = s
        if full >= 0:
            return full, "max_batch_size ready cells"
        if any_ready >= 0:
            return any_ready, "latest stage with ready cells"
        return None

    def next_job(self, now: float) -> StageJob | None:
        while True:
            picked = self._pick_stage()
            if picked is None:
                return None
            stage, reason = picked
            q = self.ready[stage]
            reqs: list[Request] = []
            while q and len(reqs) < self.max_batch_size:
                r = heapq.heappop(q)[-1]
                if r.cancelled:
                    self._finish(r, Status.CANCELLED, "request was cancelled while waiting for a cell batch")
                else:
                    reqs.append(r)
            if reqs:
                self.log.add(now, DISPATCH, stage, len(reqs), reason)
                return StageJob(stage, reqs, len(reqs))

    def job_done(self, job: StageJob, result: StageResult | None, now: float) -> None:
        node, cont, exit_node, exited = self.advance(job, result, now)
        n = self.graph.n
        for stage, reqs in ((exit_node, exited), (node, cont)):
            if not reqs:
                continue
            if stage >= n:
                for r in reqs:
                    self._finish(r, Status.OK, None)
            else:
                for r in reqs:
                    self._push(stage, r)

    def held(self) -> list[Request]:
        return [item[-1] for q in self.ready for item in q]

    def clear(self) -> None:
        for q in self.ready:
            q.clear()
