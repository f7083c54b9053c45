"""The scheduler core: one device, one policy, a clock; driven by a step loop.

It owns the request life cycle (every request is answered exactly once: OK, an error, CANCELLED or UNAVAILABLE)
and the device state (at most one stage job in flight). It never runs anything and never calls its driver: the
driver (the simulator's event loop, or the backend's scheduler thread) hands it inputs and asks it what to do, the
loop of vLLM v1's engine core (schedule, execute, update)::

    while True:
        for each input that came:          arrive(requests) / cancel(requests) / granted() / woke() / recalibrated()
        step = core.schedule()             what to run now, when to ask again, the requests answered meanwhile
        answer step.answers
        if step.job: result = run(step.job); core.update(step.job, result)

``update`` advances the policy's state and never picks the next job by itself, so arrivals that came during a stage
are admitted before the next decision. ``close`` answers what is held and returns it. Single-threaded: one thread
makes every call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Sequence

from .admission import CLOSED, Admission, QueuePolicy
from .decisions import REJECT, DecisionLog
from .interfaces import Clock, StageJob, StageResult
from .latency_table import LatencyTable
from .policies.base import Policy
from .request import Request, Status
from .seat import DeviceSeat

if TYPE_CHECKING:  # pragma: no cover
    from .device import DeviceMember


class Step(NamedTuple):
    """What one decision returns, as values the driver acts on."""

    job: StageJob | None  # run this now; the core holds it in flight until ``update``
    wake_at: float | None  # a batching window: ask again at this instant (it replaces the one before); None: as is
    answers: Sequence[Request]  # requests answered since the last step, in the order they were answered
    parts: Sequence[Any] = ()  # streamed parts the driver's jobs produced since the last step (StageResult.parts),
    # in order: the driver sends them before the answers


NOTHING = Step(None, None, ())


class Scheduler:
    def __init__(self, table: LatencyTable, policy: Policy, clock: Clock, *, log: DecisionLog | None = None,
                 queue_policy: QueuePolicy | None = None, seat: DeviceSeat | None = None) -> None:
        self.table = table
        self.policy = policy
        self.clock = clock
        self.log = log if log is not None else DecisionLog()
        self.busy = False
        self.closed = False
        self.running: StageJob | None = None
        self._wake_at: float | None = None  # the batching window asked for and not yet reached (``woke``)
        self._deciding = False
        self.asks = False  # a grant came (``granted``): the driver steps this core at its next turn
        self._answers: list[Request] = []  # answered since the last step (the outbox)
        self._parts: list[Any] = []  # streamed parts handed back since the last step (StageResult.parts)
        self.completed = 0
        self.outstanding = 0
        self.rejected: dict[str, int] = {}  # refused at arrival, by reason (admission.QUEUE_FULL, ...), in samples
        # the device this model shares with co-located models: the gate its seat holds (SharedDevice.join, a device
        # group's arbiter gate), read at each decision; none: the model has the device to itself, nobody is asked
        self.seat = seat if seat is not None else DeviceSeat()
        policy.attach(self)
        # a bounded queue and/or late requests refused (batcher/admission.py); None: every request admitted
        self.admission: Admission | None = (
            Admission(queue_policy, table, policy.max_batch_size, getattr(policy, "dec_timesteps", 1) or 1)
            if queue_policy is not None and queue_policy.active else None)

    # ------------------------------------------------------------------ inputs
    def arrive(self, requests: Sequence[Request]) -> str | None:
        """Requests that arrived together (the samples of one client request; ``arrival``: when each reached the
        server), admitted or refused as a group. Returns None when they were admitted, else why they were refused
        (they are then answered UNAVAILABLE, in the next step's answers). Decides nothing: the next ``schedule``
        sees them with every other arrival of the moment."""
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
        gate = self.seat.gate
        if refused is None and gate is not None:
            refused = gate.admit(n)  # the shared device's bound across models
        if refused is not None:
            reason, message = refused
            self.rejected[reason] = self.rejected.get(reason, 0) + n
            self.log.add(now, REJECT, 0, n, message)
            for request in requests:
                self.finish(request, Status.REJECTED, message)
            return reason
        if self.admission is not None:
            self.admission.admitted([r.id for r in requests], self.outstanding - self.completed - n, now,
                                    min(r.deadline for r in requests))
        for request in requests:
            self.policy.enqueue(request, now)
        self._take_finished()
        return None

    def update(self, job: StageJob, result: StageResult | None = None) -> None:
        """The driver finished running ``job`` (``result``: loop exits, per-request errors): the policy advances its
        requests and answers those that are done. It does not pick the next job; ``schedule`` does."""
        if job is not self.running:
            raise RuntimeError(f"completion for {job!r}, which is not the job in flight")
        self.running = None
        self.busy = False
        if result is not None and result.parts:
            self._parts.extend(result.parts)
        if self.admission is not None:  # the job's served time: the speed admission plans the drain at
            now = self.clock.now()
            self.admission.ran(job.span, job.batch_size, now - job.started, now)
        gate = self.seat.gate
        if gate is not None:
            gate.finished(job)
        if self.closed:
            return
        self.policy.job_done(job, result, self.clock.now())
        self._take_finished()

    def cancel(self, requests: Sequence[Request]) -> None:
        """The client gave these up: queued ones are dropped at the policy's next look, running ones leave their
        sub-batch at the next stage boundary (the driver answers them CANCELLED itself)."""
        for r in requests:
            r.cancelled = True

    def woke(self) -> None:
        """The instant ``Step.wake_at`` asked for has come: the next ``schedule`` asks the policy again."""
        self._wake_at = None

    def granted(self) -> None:
        """The shared device granted this model a lane (batcher/device.py, a device group's arbiter): the driver
        steps this core at its next turn (``asks``). A grant that answers this core's own ``acquire`` inside
        ``schedule`` needs nothing more: that decision goes on."""
        if not self._deciding:
            self.asks = True

    def recalibrated(self) -> None:
        """The latency table was rewritten in place (online calibration): the policy recomputes what it derived."""
        self.policy.table_changed()
        self._take_finished()

    def close(self, message: str = "the model was unloaded before the request finished") -> list[Request]:
        """Answer every request still held with UNAVAILABLE and stop scheduling. Returns every answer not yet
        taken by a step, these last ones included."""
        self.closed = True
        self._wake_at = None
        self._take_finished()
        held = [r for r in self.policy.held() if r.status is None]
        if self.running is not None:
            held += [r for r in self.running.requests if r.status is None and r not in held]
        for r in held:
            self.finish(r, Status.UNAVAILABLE, message)
        self.policy.clear()
        gate = self.seat.gate
        if gate is not None:
            gate.leave()
        out, self._answers = self._answers, []
        return out

    # ------------------------------------------------------------------ the decision
    def schedule(self) -> Step:
        """What to do now: the job to run (None while one runs, or when the policy waits), the instant to ask again
        at, and the answers given since the last step. With a shared device, the policy is asked only once the
        device is granted to this model, so it decides with the latest arrivals."""
        self.asks = False
        job = wake = None
        if not self.busy and not self.closed:
            self._deciding = True
            try:
                gate = self.seat.gate
                if gate is None or gate.acquire(self.outstanding != self.completed):
                    now = self.clock.now()
                    nxt = self.policy.next_job(now)
                    self._take_finished()
                    if isinstance(nxt, StageJob):
                        job = nxt
                        self.busy = True
                        self.running = nxt
                        nxt.started = now
                        for r in nxt.requests:
                            if r.start is None:
                                r.start = now
                        if gate is not None:
                            gate.started(nxt)
                    else:
                        if gate is not None:
                            gate.release()
                        if nxt is not None and nxt != self._wake_at:
                            self._wake_at = wake = nxt
            finally:
                self._deciding = False
        answers, parts = self._answers, self._parts
        if not answers and job is None and wake is None and not parts:
            return NOTHING
        self._answers = []
        if parts:
            self._parts = []
            return Step(job, wake, answers, parts)
        return Step(job, wake, answers)

    # ------------------------------------------------------------------ state the drivers read
    @property
    def held(self) -> int:
        """Requests (samples) submitted and not yet answered."""
        return self.outstanding - self.completed

    @property
    def idle(self) -> bool:
        return not self.busy and self.outstanding == self.completed

    @property
    def gate(self) -> DeviceMember | None:
        """The gate asked before each job (``seat``'s), or None."""
        return self.seat.gate

    # ------------------------------------------------------------------ answers
    def _take_finished(self) -> None:
        """The requests the policy answered in the call that just returned (``Policy.finished``), in order."""
        done = self.policy.finished
        if done:
            for request, status, error in done:
                self.finish(request, status, error)
            done.clear()

    def finish(self, request: Request, status: Status, error: str | None) -> None:
        """Answer ``request``: it leaves with the next step's answers."""
        if request.status is not None:
            raise RuntimeError(f"request {request.id} answered twice ({request.status.name}, then {status.name})")
        request.status = status
        request.error = error
        request.finish = self.clock.now()
        self.completed += 1
        if self.admission is not None:
            self.admission.finished(request.id, status is Status.OK, request.finish)
        self._answers.append(request)
