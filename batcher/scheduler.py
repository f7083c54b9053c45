"""The scheduler core: one device, one policy, a clock and an executor.

It owns the request life cycle (every request is answered exactly once: OK, an error, CANCELLED or UNAVAILABLE)
and the device state (at most one stage job in flight), and asks the policy what to run whenever the device is idle.
It is single-threaded: the driver (the simulator's event loop, or the backend's scheduler thread) calls
``submit``, the executor's completion callback and timer callbacks from one thread.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from .admission import CLOSED, Admission, QueuePolicy
from .decisions import REJECT, DecisionLog
from .interfaces import Clock, Executor, StageJob, StageResult, Timer
from .latency_table import LatencyTable
from .policies.base import Policy
from .request import Request, Status

if TYPE_CHECKING:  # pragma: no cover
    from .device import DeviceMember

ResponseCallback = Callable[[Request], None]


class Scheduler:
    def __init__(self, table: LatencyTable, policy: Policy, executor: Executor, clock: Clock, *,
                 on_response: ResponseCallback | None = None, log: DecisionLog | None = None,
                 queue_policy: QueuePolicy | None = None) -> None:
        self.table = table
        self.policy = policy
        self.executor = executor
        self.clock = clock
        self.on_response = on_response
        self.log = log if log is not None else DecisionLog()
        self.busy = False
        self.closed = False
        self.running: StageJob | None = None
        self._timer: Timer | None = None
        self._timer_at: float | None = None
        self._in_dispatch = False
        self._again = False
        self.completed = 0
        self.outstanding = 0
        self.rejected: dict[str, int] = {}  # refused at arrival, by reason (admission.QUEUE_FULL, ...), in samples
        self.last_rejection: str | None = None
        # the device this model shares with co-located models (``share_device``: SharedDevice.join, a device
        # group's arbiter gate); None: the model has the device to itself and nothing below asks anyone
        self.gate: DeviceMember | None = None
        policy.attach(self)
        self.admission: Admission | None = None
        if queue_policy is not None:
            self.set_queue_policy(queue_policy)

    # ------------------------------------------------------------------ driver-facing API
    def submit(self, request: Request) -> str | None:
        """A request arrived (its ``arrival`` is the time it reached the server). Returns None when it was
        accepted, else why it was refused (it has then been answered UNAVAILABLE already)."""
        return self.submit_many((request,))

    def submit_many(self, requests: Sequence[Request]) -> str | None:
        """Requests that arrived together (the samples of one client request): admitted or refused as a group."""
        for request in requests:
            if request.status is not None:
                raise ValueError(f"request {request.id} was already answered ({request.status.name})")
        n = len(requests)
        self.outstanding += n
        now = self.clock.now()
        refused: tuple[str, str] | None = None
        if self.closed:
            refused = CLOSED, "the model is shutting down; retry on another instance"
        elif self.admission is not None:
            deadline = min(r.deadline for r in requests)
            refused = self.admission.check(n, self.outstanding - self.completed - n, now, deadline)
        if refused is None and self.gate is not None:
            refused = self.gate.admit(n)  # the shared device's bound across models
        if refused is not None:
            reason, message = refused
            self.rejected[reason] = self.rejected.get(reason, 0) + n
            self.last_rejection = reason  # readable from on_response while the refused requests are answered
            self.log.add(now, REJECT, 0, n, message)
            for request in requests:
                self.finish(request, Status.REJECTED, message)
            return reason
        if self.admission is not None:
            self.admission.admitted([r.id for r in requests], self.outstanding - self.completed - n, now,
                                    min(r.deadline for r in requests))
        for request in requests:
            self.policy.enqueue(request, now)
        if not self.busy:
            self._dispatch()
        return None

    @contextmanager
    def deferred_dispatch(self) -> Iterator[None]:
        """Submit several arrivals as one moment: the policy is asked what to run once, after the last of them.

        Why: requests that reached the model together (one group from Triton's dynamic batcher) must be seen
        together; otherwise an idle device starts the first alone and the rest wait for it."""
        if self._in_dispatch:  # already inside a dispatch (or a deferral): it asks the policy at its end
            yield
            return
        self._in_dispatch = True
        self._again = False
        try:
            yield
        finally:
            self._in_dispatch = False
        self._dispatch()  # a no-op while a job runs

    def set_queue_policy(self, queue_policy: QueuePolicy) -> None:
        """Bound the queue and/or reject late requests from now on (batcher/admission.py)."""
        p = self.policy
        self.admission = Admission(queue_policy, self.table, p.max_batch_size,
                                   getattr(p, "dec_timesteps", 1) or 1) if queue_policy.active else None

    @property
    def held(self) -> int:
        """Requests (samples) submitted and not yet answered."""
        return self.outstanding - self.completed

    def complete(self, job: StageJob, result: StageResult | None = None) -> None:
        """The executor finished ``job``."""
        if job is not self.running:
            raise RuntimeError(f"completion for {job!r}, which is not the job in flight")
        self.running = None
        self.busy = False
        if self.admission is not None:  # the job's served time: the speed admission plans the drain at
            now = self.clock.now()
            self.admission.ran(job.span, job.batch_size, now - job.started, now)
        if self.gate is not None:
            self.gate.finished(job)
        if self.closed:
            return
        self.policy.job_done(job, result, self.clock.now())
        self._dispatch()

    def close(self, message: str = "the model was unloaded before the request finished") -> list[Request]:
        """Answer every request still held with UNAVAILABLE and stop scheduling. Returns the requests answered."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        held = [r for r in self.policy.held() if r.status is None]
        if self.running is not None:
            held += [r for r in self.running.requests if r.status is None and r not in held]
        for r in held:
            self.finish(r, Status.UNAVAILABLE, message)
        self.policy.clear()
        if self.gate is not None:
            self.gate.leave()
        return held

    @property
    def idle(self) -> bool:
        return not self.busy and self.outstanding == self.completed

    def share_device(self, gate: DeviceMember | None) -> None:
        """Ask ``gate`` before each job from now on (the shared device's member: batcher/device.py, or a device
        group's arbiter gate); None: the model has the device to itself again (the arbiter is gone)."""
        self.gate = gate

    def granted(self) -> None:
        """The shared device granted this model a lane (batcher/device.py): ask the policy now. Inside a dispatch
        (the grant answered this scheduler's own ``acquire``) nothing more is needed: that dispatch goes on."""
        if not self._in_dispatch:
            self._dispatch()

    # ------------------------------------------------------------------ used by policies
    def finish(self, request: Request, status: Status, error: str | None) -> None:
        if request.status is not None:
            raise RuntimeError(f"request {request.id} answered twice ({request.status.name}, then {status.name})")
        request.status = status
        request.error = error
        request.finish = self.clock.now()
        self.completed += 1
        if self.admission is not None:
            self.admission.finished(request.id, status is Status.OK, request.finish)
        if self.on_response is not None:
            self.on_response(request)

    # ------------------------------------------------------------------ internals
    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        if not self.busy and not self.closed:
            self._dispatch()

    def _dispatch(self) -> None:
        # A synchronous executor calls complete() from inside submit(); loop instead of recursing.
        if self._in_dispatch:
            self._again = True
            return
        self._in_dispatch = True
        try:
            while True:
                self._again = False
                gate = self.gate
                # with a shared device, the policy is asked only once the device is granted to this model (the
                # device calls _dispatch back when it grants it), so it decides with the latest arrivals
                if not self.busy and not self.closed and (
                        gate is None or gate.acquire(self.outstanding != self.completed)):
                    now = self.clock.now()
                    nxt = self.policy.next_job(now)
                    if isinstance(nxt, StageJob):
                        self.busy = True
                        self.running = nxt
                        nxt.started = now
                        for r in nxt.requests:
                            if r.start is None:
                                r.start = now
                        if gate is not None:
                            gate.started(nxt)
                        self.executor.submit(nxt, self.complete)
                    else:
                        if gate is not None:
                            gate.release()
                        if nxt is not None and nxt != self._timer_at:
                            if self._timer is not None:
                                self._timer.cancel()
                            self._timer_at = nxt
                            self._timer = self.clock.call_at(nxt, self._on_timer)
                if not self._again:
                    return
        finally:
            self._in_dispatch = False
