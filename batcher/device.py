"""One device shared by several models' schedulers: who runs the next stage job, across models.

Each co-located model keeps its own ``Scheduler``, ``Policy`` and ``LatencyTable``; a ``SharedDevice`` sits between
them and grants the device (one of ``lanes``, default 1) to one model's next stage job at a time. A model joins with
``SharedDevice.join(scheduler, name, weight=, priority=)``, which seats a ``DeviceMember`` as its scheduler's gate
(batcher/seat.py).

Why a gate asked before the policy, not a queue of committed jobs: a model's scheduler asks its policy for a job
only once the device is granted to it, so the policy decides with every arrival up to that moment (a request that
arrived while another model held the device still joins the batch, or preempts at the boundary). A queue of jobs
formed when each model's own last job ended would run stale batches, which is what Triton's per-model batchers
behind its rate limiter do (the simulator's "token" baseline).

The cross-model rule, at every stage boundary and every arrival that finds a lane free (O(models) per decision):

1. **Least slack first, by priority level**: among the members waiting for the device, the one whose held requests
   are most at risk goes next: the smallest ``Policy.least_slack`` (earliest deadline minus the predicted remaining
   single-input time from that model's own table, the LazyBatching paper's check of co-located models' on-going
   requests), a member of a more urgent ``priority`` level (smaller, Triton's convention) before any less urgent one.
   Within a level, a member whose most urgent request can still meet its deadline (slack >= 0) goes before one
   whose request is already predicted late: a deadline already lost must not take the device from one that can
   still be kept (plain least-slack-first lets one overloaded model's late backlog hold every other model off the
   device up to the fairness bound: 94 ms for a 1.4 ms model beside a 20 ms one at 110% load, in a test). Among
   members that are all late, the **least** late goes first: a request just past its deadline (a small model's
   that waited one stage of a large one) would otherwise wait behind a backlog seconds past its own, whose
   lateness its short pass hardly changes; the other way round, the small model's requests miss by the fairness
   bound each (served: the quickstart pair's small model waited 90 ms for every request behind ResNet-50's late
   backlog, 2026-11-28).
2. **Weighted fair share (the starvation guarantee)**: each member has a virtual time, its device time divided by
   its ``weight``; a member that starts waiting after holding nothing is brought up to the least virtual time of
   the members then active (no credit banked while idle; a backlogged member keeps its own). If the member rule 1
   picks is more than ``lag`` seconds of weighted device time ahead of the waiting member furthest behind, the one
   furthest behind goes instead.

The guarantee (tests/batcher/test_device_fairness.py checks it): **whenever the device is granted to member i while member j
waits, vt_i <= vt_j + lag**. Hence, while i and j both stay waiting, i's weighted device time never runs ahead of
j's by more than ``lag`` plus one job of i (divided by its weight), whatever their deadlines, priorities or loads;
and a member j that starts waiting beside one backlogged member h waits at most the job in flight, one job of h and
``weight_h x (2 x lag + one job of j / weight_j)`` of h's device time (j's own virtual time may be ahead of h's by
lag and a job when it starts waiting). The bound holds across priority levels: priority and slack order the device
within it (a model that should take more of the device gets a larger weight).

3. **Spans (boundaries)**: while two or more models share the device, a member's job spans (``StageJob.stop``, a
   policy's run of several stages with no decision point) only as far as the members waiting at its grant can
   afford: the least of each one's slack (while its deadline can still be met) and its fair-share room (how far
   the winner may run before rule 2 would pick that member), at most ``lag``; one stage when nobody waits, since a
   span hides boundaries at which a newcomer's request could go first. Why not always one stage: served, every
   boundary is a round trip to the arbiter process with the device idle, several wake-ups each on a loaded host;
   a small model granted ahead of a late backlog lost more to those round trips between its 0.5 ms stages than
   it ran (the quickstart pair, 2026-11-28). A newcomer arriving during a span waits at most ``lag``. One model
   alone keeps its spans, so a one-model ``SharedDevice`` schedules exactly as no device at all.

Admission: a model's own ``QueuePolicy`` (batcher/admission.py) still applies first; ``max_queue_size`` here bounds
the samples held across all members, and a refusal says which bound was hit.

Metrics per member (``DeviceMember.stats``): device time and its share, grants, time waited at the device.
Every contended grant (two or more members waiting) is logged as a ``DEVICE`` decision in the log of every member
that waited: which model got the device and why.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .decisions import DEVICE
from .errors import ConfigError
from .interfaces import StageJob

if TYPE_CHECKING:  # pragma: no cover
    from .scheduler import Scheduler

DEVICE_QUEUE_FULL = "device_queue_full"  # the rejection label of the global bound
DEFAULT_LAG_S = 0.020  # weighted device time a member may run ahead of one that waits (the fairness bound)

IDLE, WAITING, GRANTED, RUNNING = 0, 1, 2, 3


class DeviceMember:
    """One model's place on a ``SharedDevice``: the gate its ``Scheduler`` asks (``acquire``/``started``/``release``/
    ``finished``/``admit``/``leave``) and its device metrics."""

    __slots__ = ("device", "scheduler", "name", "weight", "priority", "state", "vt", "slack", "since", "began",
                 "device_time", "waited", "waits", "max_wait", "grants", "left", "drained", "budget")

    def __init__(self, device: "SharedDevice", scheduler: "Scheduler", name: str, weight: float,
                 priority: int) -> None:
        self.device = device
        self.scheduler = scheduler
        self.name = name
        self.weight = weight
        self.priority = priority
        self.state = IDLE
        self.vt = 0.0  # virtual time: device seconds / weight
        self.slack = math.inf  # the last least_slack the device read (decision reasons)
        self.since = 0.0  # when it started waiting
        self.began = 0.0  # when its job in flight started
        self.device_time = 0.0
        self.waited = 0.0
        self.waits = 0
        self.max_wait = 0.0
        self.grants = 0
        self.left = False
        self.drained = True  # it held nothing when it last asked: its virtual time catches up when it next waits
        self.budget = 0.0  # device seconds its granted job may span (``SharedDevice.span_budget``): 0, one stage

    # ------------------------------------------------------------------ the scheduler's side
    def acquire(self, wants: bool) -> bool:
        """The scheduler is idle and asks for the device (``wants``: it holds requests). True: the device is granted
        now, ask the policy; False: wait, the device calls the scheduler back when it grants it."""
        if self.state == GRANTED:
            if wants:
                return True
            self._free_lane()
        elif wants and self.state == IDLE and not self.left:
            self.device._wait(self)
        elif not wants and self.state == WAITING:
            self.state = IDLE
        if not wants:
            self.drained = True
        self.device._grant()
        return self.state == GRANTED

    def started(self, job: StageJob) -> None:
        """The granted scheduler submits ``job``: cut a span where other models share the device, to what the
        models waiting can afford (``budget``; one stage when none waits)."""
        self.state = RUNNING
        self.began = self.scheduler.clock.now()
        if job.stop > job.stage + 1 and self.device.shared:
            job.stop = span_stop(job, self.scheduler, self.budget)

    def release(self) -> None:
        """The granted scheduler's policy had nothing to run now (a batching window, or nothing held)."""
        if self.state == GRANTED:
            self._free_lane()
            self.device._grant()

    def finished(self, job: StageJob) -> None:
        """The job in flight completed: account its device time. The lane is handed on at the scheduler's next
        ``acquire`` (right after the policy has seen the completion), so this model competes for it too."""
        if self.state != RUNNING:
            return
        ran = self.scheduler.clock.now() - self.began
        self.device_time += ran
        self.device.busy_time += ran
        self.vt += ran / self.weight
        self._free_lane()
        if self.left:  # unloaded meanwhile: no acquire follows, so hand the lane on here
            self.device._grant()

    def admit(self, n: int) -> tuple[str, str] | None:
        """The global bound, for ``n`` new samples (already counted in this scheduler's ``held``)."""
        return self.device._admit(n)

    def leave(self) -> None:
        """The model is unloaded: it asks for nothing more; a lane it holds for a job in flight is freed when that
        job completes."""
        self.left = True
        if self.state in (WAITING, GRANTED):
            if self.state == GRANTED:
                self._free_lane()
            self.state = IDLE
            self.device._grant()

    # ------------------------------------------------------------------ metrics
    def stats(self) -> dict[str, Any]:
        d = self.device
        return {"model": self.name, "weight": self.weight, "priority": self.priority,
                "device_s": self.device_time, "share": self.device_time / d.busy_time if d.busy_time > 0 else 0.0,
                "grants": self.grants, "wait_avg_s": self.waited / self.waits if self.waits else 0.0,
                "wait_max_s": self.max_wait}

    def _free_lane(self) -> None:
        self.state = IDLE
        self.device.lane_back()

    def __repr__(self) -> str:
        return f"DeviceMember({self.name!r}, state={('idle', 'waiting', 'granted', 'running')[self.state]})"


class SharedDevice:
    """Grants one device (``lanes`` jobs at once) to co-located models' schedulers (see the module docstring)."""

    def __init__(self, *, lanes: int = 1, max_queue_size: int = 0, lag: float = DEFAULT_LAG_S) -> None:
        if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
            raise ConfigError(f"lanes must be a positive integer, got {lanes!r}", field="lanes")
        if isinstance(max_queue_size, bool) or not isinstance(max_queue_size, int) or max_queue_size < 0:
            raise ConfigError(f"the device's max_queue_size must be an integer >= 0 (0: unbounded), got "
                              f"{max_queue_size!r}", field="device_max_queue_size")
        if not lag >= 0.0:
            raise ConfigError(f"the fairness lag must be >= 0 seconds, got {lag!r}", field="lag")
        self.lanes = lanes
        self.free = lanes
        self.max_queue_size = max_queue_size
        self.lag = lag
        self.members: list[DeviceMember] = []
        self.vnow = 0.0  # the virtual time of the latest grant (where a member waking with nobody active starts)
        self.busy_time = 0.0
        self._granting = False
        self._again = False

    def join(self, scheduler: "Scheduler", name: str | None = None, *, weight: float = 1.0,
             priority: int = 0) -> DeviceMember:
        """Put ``scheduler`` on this device; it asks the returned member before each job from now on."""
        if scheduler.seat.gate is not None:
            raise ConfigError("this scheduler already shares a device", field="device")
        if not (isinstance(weight, (int, float)) and weight > 0 and math.isfinite(weight)):
            raise ConfigError(f"a model's device weight must be a positive number, got {weight!r}", field="weight")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ConfigError(f"a model's priority must be an integer (smaller: more urgent), got {priority!r}",
                              field="priority")
        m = DeviceMember(self, scheduler, name or scheduler.table.name, float(weight), priority)
        m.vt = self._active_vt(None)
        self.members.append(m)
        scheduler.seat.take(m)
        scheduler.log.counts.setdefault(DEVICE, 0)
        return m

    @property
    def shared(self) -> bool:
        """Whether more than one model may use the device (spans are then cut at every boundary)."""
        return len(self.members) > 1

    @property
    def held(self) -> int:
        """Samples held by every member (queued or in flight)."""
        return sum(m.scheduler.held for m in self.members)

    def stats(self) -> list[dict[str, Any]]:
        return [m.stats() for m in self.members]

    # ------------------------------------------------------------------ internals
    def _active_vt(self, exclude: DeviceMember | None) -> float:
        """The least virtual time of the members waiting, granted or running (``vnow`` when none is)."""
        v = math.inf
        for m in self.members:
            if m is not exclude and m.state != IDLE and m.vt < v:
                v = m.vt
        return self.vnow if v == math.inf else v

    def _wait(self, m: DeviceMember) -> None:
        if m.drained:  # back from holding nothing: no credit banked while idle (a backlogged member keeps its vt)
            v = self._active_vt(m)
            if m.vt < v:
                m.vt = v
            m.drained = False
        m.state = WAITING
        m.since = m.scheduler.clock.now()

    def _admit(self, n: int) -> tuple[str, str] | None:
        cap = self.max_queue_size
        if not cap:
            return None
        held = self.held - n
        if held + n > cap:
            return DEVICE_QUEUE_FULL, device_queue_full_message(held, len(self.members), cap)
        return None

    def lane_back(self) -> None:
        """A member's job ended, or its lease went back: its lane is free again."""
        self.free += 1

    def lease_lane(self, member: DeviceMember) -> None:
        """A lane for ``member`` outside the grant order (the arbiter's solo lease for a member that joins with
        nobody else active, backend/arbiter/server.py); the caller checked that one is free."""
        self.free -= 1
        member.state = GRANTED
        member.grants += 1

    def _grant(self) -> None:
        """Hand free lanes to waiting members, one decision per lane. Re-entrant calls (a granted scheduler whose
        policy had nothing to run releases at once) loop here instead of recursing."""
        if self._granting:
            self._again = True
            return
        self._granting = True
        try:
            while True:
                self._again = False
                if self.free > 0:
                    winner = self._choose()
                    if winner is not None:
                        self.free -= 1
                        winner.state = GRANTED
                        now = winner.scheduler.clock.now()
                        wait = now - winner.since
                        winner.waited += wait
                        winner.waits += 1
                        if wait > winner.max_wait:
                            winner.max_wait = wait
                        winner.grants += 1
                        if winner.vt > self.vnow:
                            self.vnow = winner.vt
                        winner.budget = self.span_budget(winner)
                        winner.scheduler.granted()
                        self._again = True
                if not self._again:
                    return
        finally:
            self._granting = False

    def _choose(self) -> DeviceMember | None:
        """The member that gets the next free lane (module docstring), or None when nobody waits."""
        best = behind = None
        contenders = 0
        for m in self.members:
            if m.state != WAITING:
                continue
            contenders += 1
            now = m.scheduler.clock.now()
            m.slack = s = m.scheduler.policy.least_slack(now)
            if best is None or m.priority < best.priority or (m.priority == best.priority and _before(s, best.slack)):
                best = m
            if behind is None or m.vt < behind.vt:
                behind = m
        if best is None or behind is None:
            return None
        winner, fair = best, False
        if best.vt - behind.vt > self.lag:
            winner, fair = behind, True
        if contenders > 1:
            self._log(winner, best, fair)
        return winner

    def span_budget(self, winner: DeviceMember) -> float:
        """Device seconds the job just granted to ``winner`` may span before the others must be asked again (rule 3
        of the module docstring): the least, over the members waiting, of what each can afford (its slack while
        its deadline can still be met; the fair-share room ``lag - (vt_winner - vt_it)``, in the winner's device
        seconds, either way), at most ``lag``; 0 (one stage) when nobody waits. The slacks are those ``_choose``
        just read."""
        room = math.inf
        for o in self.members:
            if o is winner or o.state != WAITING:
                continue
            r = max(0.0, self.lag - (winner.vt - o.vt)) * winner.weight
            if 0.0 <= o.slack < r:
                r = o.slack
            if r < room:
                room = r
        return 0.0 if room == math.inf else min(room, self.lag)

    def _log(self, winner: DeviceMember, best: DeviceMember, fair: bool) -> None:
        """A DEVICE decision in the log of every member that waited (only where one of them keeps records)."""
        waiting = [m for m in self.members if m.state == WAITING]
        reason = ""
        if any(m.scheduler.log.enabled for m in waiting):  # the text only where a log keeps records
            if fair:
                why = (f"fair share: {(best.vt - winner.vt) * 1e3:.3f} ms of weighted device time behind "
                       f"{best.name} (lag bound {self.lag * 1e3:g} ms)")
            else:
                why = (f"least slack at priority {winner.priority}" if winner.slack >= 0.0 else
                       f"least late at priority {winner.priority}, every one waiting already late")
            others = ", ".join(f"{o.name} {_ms(o.slack)}" for o in waiting if o is not winner)
            reason = f"device to {winner.name}: {why} (its slack {_ms(winner.slack)}; waiting: {others})"
        now = winner.scheduler.clock.now()
        value = winner.slack if math.isfinite(winner.slack) else None
        for m in waiting:
            m.scheduler.log.add(now, DEVICE, 0, winner.scheduler.held, reason, value)


def span_stop(job: StageJob, scheduler: "Scheduler", budget: float) -> int:
    """Where a span granted ``budget`` device seconds stops: the most stages of ``job``'s span whose predicted time
    (the model's table at the job's batch size) fits in it, and at least one."""
    table = scheduler.table
    scale = getattr(scheduler.policy, "time_scale", 1.0)
    b = min(max(job.batch_size, 1), table.max_batch_size)
    stop, used = job.stage + 1, scale * table.latency(job.stage, b)
    while stop < job.stop:
        used += scale * table.latency(stop, b)
        if used > budget:
            break
        stop += 1
    return stop


def _before(s: float, other: float) -> bool:
    """Whether a member of slack ``s`` goes before one of slack ``other`` at the same priority level (rule 1 of the
    module docstring): a deadline that can still be met first, least slack first among those; among the late, the
    least late first."""
    if (s < 0.0) != (other < 0.0):
        return other < 0.0
    return s < other if s >= 0.0 else s > other


def device_queue_full_message(held: int, members: int, cap: int) -> str:
    """The refusal of the device-wide bound (here and in the arbiter's stubs, backend/arbiter/client.py)."""
    return (f"rejected: the shared device's queue is full ({held} samples held across {members} models, the "
            f"device's max_queue_size {cap}; each model's own max_queue_size is not the bound hit); retry later or "
            "on another instance")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if math.isfinite(seconds) else "no deadline"
