"""Whole-graph batching: the paper's GraphB(N), Triton's dynamic batcher, and Serial.

A batch, once dispatched, runs every stage to the end before the next batch may start (no interleaving). For
seq2seq models the batch keeps stepping its decoder until its longest sequence ends; sequences that end earlier ride
along as padding and are answered with the batch, which is what a whole-graph run does.
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

from ..decisions import DISPATCH
from ..errors import ConfigError
from ..interfaces import StageJob, StageResult
from ..request import Request, Status
from .base import DEFAULT_MAX_BATCH_SIZE, Policy, enqueue_by_priority


class _Batch:
    __slots__ = ("node", "active", "parked", "resume", "size", "started", "planned")

    def __init__(self, reqs: list[Request], now: float) -> None:
        self.size = len(reqs)
        self.started = now
        self.planned: float | None = None  # the latest start a deadline guard planned for (monitor.py)
        self.node = 0
        self.active = reqs
        self.parked: list[Request] = []  # sequences that ended early, padding the batch until the longest ends
        self.resume = 0  # the stage the parked sequences go on to


class GraphBatching(Policy):
    """Batch up to ``max_batch_size`` requests, or what has arrived once the oldest waited ``max_queue_delay``.

    Like Triton's dynamic batcher: a batch of a preferred size is dispatched as soon as one can be formed, and
    ``max_queue_delay=0`` dispatches whatever is queued when the device frees.
    """

    name = "graph"

    def __init__(self, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE, max_queue_delay: float = 0.0,
                 preferred_batch_sizes: Sequence[int] = (), name: str | None = None) -> None:
        super().__init__(max_batch_size)
        if name is not None:  # a named variant (the registry's adhoc: no queue delay)
            self.name = name
        if not isinstance(max_queue_delay, (int, float)) or max_queue_delay < 0:
            raise ConfigError(f"max_queue_delay must be >= 0 seconds, got {max_queue_delay!r}",
                              field="max_queue_delay_microseconds")
        pref = sorted(set(preferred_batch_sizes))
        bad = [p for p in pref if not isinstance(p, int) or p < 1 or p > max_batch_size]
        if bad:
            raise ConfigError(f"preferred batch sizes must be integers in 1..max_batch_size ({max_batch_size}), "
                              f"got {bad}", field="preferred_batch_size")
        self.max_queue_delay = float(max_queue_delay)
        self.preferred = pref
        self.queue: deque[Request] = deque()
        self.current: _Batch | None = None

    def describe(self) -> str:
        pref = f", preferred_batch_size={self.preferred}" if self.preferred else ""
        return (f"{self.name}(max_batch_size={self.max_batch_size}, "
                f"max_queue_delay={self.max_queue_delay * 1e3:g} ms{pref})")

    def enqueue(self, request: Request, now: float) -> None:
        enqueue_by_priority(self.queue, request)  # Triton's priority levels: more urgent first

    def _decide(self, now: float) -> tuple[int, str] | float:
        """How many queued requests (a non-empty queue) to dispatch now and why, or when to look again."""
        q = self.queue
        n = len(q)
        if n >= self.max_batch_size:
            return self.max_batch_size, "max_batch_size reached"
        if self.preferred and n >= self.preferred[0]:
            return max(p for p in self.preferred if p <= n), "preferred batch size formed"
        if now >= q[0].arrival + self.max_queue_delay:
            return n, "queue delay expired" if self.max_queue_delay > 0 else "device free"
        return q[0].arrival + self.max_queue_delay

    def _form(self, now: float) -> _Batch | float | None:
        q = self.queue
        while q and q[0].cancelled:
            self._finish(q.popleft(), Status.CANCELLED, "request was cancelled while queued")
        if not q:
            return None
        decided = self._decide(now)
        if not isinstance(decided, tuple):
            return decided
        take, reason = decided
        reqs = []
        for _ in range(take):
            r = q.popleft()
            if r.cancelled:
                self._finish(r, Status.CANCELLED, "request was cancelled while queued")
            else:
                reqs.append(r)
        if not reqs:
            return self._form(now)
        self.log.add(now, DISPATCH, 0, len(reqs), reason)
        return _Batch(reqs, now)

    def next_job(self, now: float) -> StageJob | float | None:
        if self.current is None:
            formed = self._form(now)
            if not isinstance(formed, _Batch):
                return formed
            self.current = formed
        b = self.current
        return StageJob(b.node, b.active, len(b.active) + len(b.parked), b)

    def job_done(self, job: StageJob, result: StageResult | None, now: float) -> None:
        b: _Batch = job.token
        node, cont, exit_node, exited = self.advance(job, result, now)
        if exited:
            b.parked.extend(exited)
            b.resume = exit_node
        if cont and node < self.graph.n:
            b.active, b.node = cont, node
            return
        if not cont and b.parked:
            # every sequence has left the loop: the whole batch moves on together
            cont, node = b.parked, b.resume
            b.active, b.parked, b.node = cont, [], node
            if node < self.graph.n:
                return
        for r in cont:  # past the last stage (or nobody left after errors and cancellations)
            self._finish(r, Status.OK, None)
        self.current = None
        self._batch_done(b, now)

    def _batch_done(self, batch: _Batch, now: float) -> None:
        """Hook for policies that learn from observed whole-batch times."""

    def held(self) -> list[Request]:
        out = list(self.queue)
        if self.current is not None:
            out += self.current.active + self.current.parked
        return out

    def clear(self) -> None:
        self.queue.clear()
        self.current = None


class Serial(GraphBatching):
    """One request at a time, whole graph."""

    name = "serial"

    def __init__(self) -> None:
        super().__init__(max_batch_size=1, max_queue_delay=0.0)

    def describe(self) -> str:
        return "serial"
