"""Admission control: a bounded queue and early rejection of requests whose deadline cannot be met.

Under overload a scheduler that accepts everything builds a backlog that every later request waits behind: all of
them miss their SLA, and the backlog takes as long to drain as it took to build. Rejecting at arrival keeps the
backlog bounded and answers the refused requests at once (UNAVAILABLE, with the reason), so clients can retry
elsewhere. The knobs are named after Triton's ``ModelQueuePolicy`` (model_config.proto):

- ``max_queue_size``: the most samples the scheduler may hold (queued or in a sub-batch in flight); 0 = unbounded,
  as in Triton. LazyBatching's sub-batches are themselves queued work (they are preempted and wait), so the bound
  counts everything held, not only what has not started.
- ``timeout_action``: ``REJECT`` refuses a request whose deadline the predictor says cannot be met; ``DELAY`` (the
  default, and what the scheduler did before) accepts it and serves it late.

The prediction: the backlog (everything held plus the new samples) is drained in whole-graph batches of
``max_batch_size`` at the latency table's batched latencies, starting now (work already done on requests in flight
and batching windows are ignored), plus what recent requests showed that drain to miss: the most by which
any of the last ``LATE_WINDOW`` admitted samples finished later than so planned (never below 0; the 95th percentile
was tried first and let 1.9% end late under a busy core), counting only samples admitted behind no more than the
new one is, in the last ``LATE_HORIZON_S``. Why those two limits: the margin learns only from admitted samples, and
a burst's margin (about the whole SLA, learnt behind a full queue) applied to every later request refused even a
lone request on an idle instance, so that nothing was admitted again to teach it lower (a CI run: every request
after a 5x burst refused). A request is
rejected when that would end after its deadline. Why the learned part: the bare drain is optimistic on a real
server (a policy that does not always run full whole-graph batches, a device slower than its profile, a busy
machine): with it alone 1-2% of the requests accepted during a 5x burst ended past their 1 s SLA under a busy core,
and an accepted request is a promise (the goal: >= 99% of accepted requests on time, docs/operations.md). The same idea as the deadline
guard's slip margin (policies/monitor.py); on an exact device (the simulator) nothing is late and the rule is the
bare drain's.

The drain also runs at the slowest speed the model has shown in the last ``SPEED_HORIZON_S``: each job the
scheduler completes reports its served time against the profiled time of its stages at its batch size (``ran``);
a moving average of that ratio (weight ``SPEED_WEIGHT``, each run clamped to ``SPEED_CLAMP``) is the speed now,
and the plan uses its maximum over the horizon, never below 1. Why: the learned margin reacts only when admitted
samples finish, about one SLA after the fact. On a shared 2-core VM the stages ran 20-36% slower than usual for 1-3 s
at a time during a 5x burst; every request admitted just before such a spell was promised a finish at the usual
speed, and 5-13% of the accepted ones ended more than 100 ms past a 1 s SLA. The job's own time follows a spell
within a few runs (the backend's table recalibration is rate-limited and smoothed over about ten), and planning at
the slowest recent speed keeps the headroom between spells. The ratio is bounded (a slower machine, not a backlog),
so a long horizon costs a share of the admitted rate, never everything; on a device as fast as its profile (the
simulator) it is 1 and the rule is as before.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

from typing import Sequence

from .errors import ConfigError
from .latency_table import LatencyTable

REJECT = "REJECT"
DELAY = "DELAY"
TIMEOUT_ACTIONS = (REJECT, DELAY)

# why a request was refused (the label of the rejection metrics)
QUEUE_FULL = "queue_full"
DEADLINE = "deadline"
CLOSED = "closed"
LATE_WINDOW = 64  # admitted samples whose lateness (finish - planned finish) sets the margin
LATE_HORIZON_S = 10.0  # how long one sample's lateness counts: a margin cannot outlive the load that taught it
SPEED_HORIZON_S = 60.0  # how long the slowest recent speed is planned with (module docstring)
SPEED_WEIGHT = 0.3  # moving average of served / profiled job time: a spell shows within a few runs
SPEED_CLAMP = (0.25, 4.0)  # one run's ratio is clamped to this: one stall is evidence of load, not a 20x slower stage


@dataclass(frozen=True)
class QueuePolicy:
    """Triton-style queue policy of one model (see the module docstring)."""

    max_queue_size: int = 0
    timeout_action: str = DELAY

    def __post_init__(self) -> None:
        m = self.max_queue_size
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ConfigError(f"max_queue_size must be an integer >= 0 (0: unbounded), got {m!r}",
                              field="max_queue_size")
        action = str(self.timeout_action).upper()
        if action not in TIMEOUT_ACTIONS:
            raise ConfigError(f"timeout_action must be REJECT or DELAY (Triton's names), got {self.timeout_action!r}",
                              field="timeout_action")
        object.__setattr__(self, "timeout_action", action)

    @property
    def active(self) -> bool:
        return self.max_queue_size > 0 or self.timeout_action == REJECT

    @classmethod
    def parse(cls, max_queue_size: int | str | None = None, timeout_action: str | None = None) -> "QueuePolicy":
        """From user text (config.pbtxt parameters, CLI flags); None keeps the default."""
        if isinstance(max_queue_size, str):
            try:
                max_queue_size = int(max_queue_size.strip() or 0)
            except ValueError:
                raise ConfigError(f"max_queue_size must be an integer, got {max_queue_size!r}",
                                  field="max_queue_size") from None
        return cls(max_queue_size or 0, (timeout_action or DELAY).strip())


class Admission:
    """Decides, for a group of new samples, whether the scheduler takes them (see the module docstring)."""

    __slots__ = ("policy", "max_batch_size", "_drain", "learn", "_planned", "_late", "_profiled", "_speed", "_slow")

    def __init__(self, policy: QueuePolicy, table: LatencyTable, max_batch_size: int, dec_timesteps: int = 1) -> None:
        self.policy = policy
        b = max(1, min(max_batch_size, table.max_batch_size))
        self.max_batch_size = b
        # whole-graph latency at 1..b samples (seq2seq: dec_timesteps decoder steps, one encoder step)
        self._drain = [0.0] + [table.whole_graph_latency(k, 1, dec_timesteps) for k in range(1, b + 1)]
        self.learn = True  # False: the bare drain (tests compare)
        # request id -> (planned finish, samples up to and including it when admitted), for samples with a deadline
        self._planned: dict[int, tuple[float, int]] = {}
        # (depth when admitted, finish - planned finish, finish) of the last LATE_WINDOW admitted samples served
        self._late: collections.deque[tuple[int, float, float]] = collections.deque(maxlen=LATE_WINDOW)
        # the profiled stage times (seconds per stage, per batch size) the served job times are compared with
        self._profiled = [list(row) for row in table.dense]
        self._speed = 1.0  # moving average of served / profiled job time
        self._slow: collections.deque[tuple[float, float]] = collections.deque()

    @property
    def margin(self) -> float:
        """The most any of the last LATE_WINDOW admitted samples was late, at any depth (seconds): a statistic for
        tests and reports, worked out when read, not on every answer."""
        return max((late for _, late, _ in self._late), default=0.0)

    def margin_for(self, depth: int, now: float) -> float:
        """Seconds added to the drain of ``depth`` samples: the most by which a recent sample admitted at that depth
        or shallower finished later than planned (module docstring)."""
        return max((late for d, late, t in self._late if d <= depth and now - t <= LATE_HORIZON_S), default=0.0)

    def ran(self, span: range, batch: int, seconds: float, now: float) -> None:
        """A job over ``span`` at ``batch`` was served in ``seconds`` (the scheduler's clock): the speed now."""
        if not self.learn or self.policy.timeout_action != REJECT or not seconds > 0.0:
            return  # only a REJECT plan reads the speed: a bounded queue alone pays nothing per job
        rows = self._profiled
        expected = sum(rows[s][min(batch, len(rows[s]) - 1)] for s in span)
        if expected <= 0.0:
            return
        lo, hi = SPEED_CLAMP
        ratio = min(hi, max(lo, seconds / expected))
        self._speed += SPEED_WEIGHT * (ratio - self._speed)
        speed, slow = self._speed, self._slow
        while slow and slow[-1][1] <= speed:  # the sliding maximum over SPEED_HORIZON_S
            slow.pop()
        slow.append((now, speed))

    def slowdown(self, now: float) -> float:
        """How many times slower than its profile the model has run at worst in the last SPEED_HORIZON_S (>= 1;
        1 where the jobs ran at their profiled times, as in the simulator)."""
        slow = self._slow
        while slow and now - slow[0][0] > SPEED_HORIZON_S:
            slow.popleft()
        return max(1.0, slow[0][1]) if slow else 1.0

    def drain_time(self, n: int) -> float:
        """Seconds to run ``n`` samples in whole-graph batches of max_batch_size."""
        if n <= 0:
            return 0.0
        b = self.max_batch_size
        full, rest = divmod(n, b)
        return full * self._drain[b] + self._drain[rest]

    def check(self, n_new: int, held: int, now: float, deadline: float) -> tuple[str, str] | None:
        """None to admit, else (reason label, message for the client)."""
        p = self.policy
        if p.max_queue_size and held + n_new > p.max_queue_size:
            return QUEUE_FULL, (f"rejected: the queue is full ({held} samples held, max_queue_size "
                                f"{p.max_queue_size}); retry later or on another instance")
        if p.timeout_action == REJECT and not math.isinf(deadline):
            margin = self.margin_for(held + n_new, now)
            slowdown = self.slowdown(now)
            finish = now + self.drain_time(held + n_new) * slowdown + margin
            if finish > deadline:
                late = (f", {margin * 1e3:.1f} ms of it by which recent requests ended later than so planned"
                        if margin > 0 else "")
                if slowdown > 1.0:
                    late += f", at {slowdown:.2f}x the profiled stage times (the slowest in the last minute)"
                return DEADLINE, (f"rejected: the deadline cannot be met: {held} samples are ahead and the predicted "
                                  f"finish is {(finish - now) * 1e3:.1f} ms away{late}, the deadline "
                                  f"{(deadline - now) * 1e3:.1f} ms (timeout_action REJECT; DELAY serves it late)")
        return None

    def admitted(self, ids: Sequence[int], held: int, now: float, deadline: float) -> None:
        """Samples ``ids`` were admitted with ``held`` ahead of them: remember when the drain planned them done."""
        if self.learn and self.policy.timeout_action == REJECT and not math.isinf(deadline):
            depth = held + len(ids)
            planned = now + self.drain_time(depth) * self.slowdown(now)
            for i in ids:
                self._planned[i] = (planned, depth)

    def finished(self, request_id: int, ok: bool, now: float) -> None:
        """A sample was answered: if it was served, how late against its plan teaches the margin."""
        plan = self._planned.pop(request_id, None)
        if plan is None or not ok:
            return
        planned, depth = plan
        self._late.append((depth, max(0.0, now - planned), now))  # the largest counts: an accepted request is a promise
