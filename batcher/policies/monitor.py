"""BatchMonitor / BatchDispatcher (Khan et al., seed 002) and the seed's two comparison points.

BatchMonitor counts arrivals per window (default 1 s). At each window's end it takes the observed rate R and picks
the preferred batch size: the smallest b whose throughput b / T_b exceeds R (Eq. 1, Algorithm 1), where T_b comes
from a linear regression of whole-batch time on batch size, fitted on the latency table and refitted online from
observed batch times. BatchDispatcher, independently, dispatches batches of the current preferred size, starting
from 1. It batches whole requests: no stage split is needed.

Two things the seed leaves open, decided here:

* Algorithm 1's loop starts at batch size 2; we start at 1, so that a rate that one request at a time can serve
  gets no batching delay (the smallest b with b / T_b > R, as the text of the seed states it).
* The rate a window's count supports, not the raw count: the preferred size is planned for ``n - rate_sigma *
  sqrt(n)`` arrivals per window (one Poisson standard deviation below the count n by default; ``rate_sigma=0`` is
  Algorithm 1's raw count). Where a window holds hundreds of arrivals (the seed's GPUs: 1 s, up to 240 requests/s)
  this lowers the planned rate by a few percent; where it holds one or two (a model served at about one request per
  second, as VGG-19 on a 2-core CPU), a single arrival no longer reads as a rate above the batch-1 service rate, which
  made the dispatcher wait up to T_2 for a second request that was not coming (measured: 2.4x ad-hoc's average
  latency in the simulator with the CPU's table, docs/monitor.md).
* Preferred sizes are hints, never prerequisites: a request never waits past what its SLA allows for a batch to
  fill (the deadline guard dispatches whatever is queued once the oldest request's deadline minus the predicted
  batch time is reached), nor longer than the preferred batch's own predicted compute time T_b (the seed's
  Q_b = T_b optimum: a batch that takes longer to fill than to run means the rate fell since the last window),
  and the dispatcher looks again at every window end, when the preferred size may change.

Windows are evaluated lazily, at the first event after a window ends, which gives the same preferred size at every
dispatch as a timer firing at each window end would.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Iterable

from ..errors import ConfigError
from ..latency_table import LatencyTable
from .base import DEFAULT_MAX_BATCH_SIZE, enqueue_by_priority
from .graph_batching import GraphBatching, _Batch


class BatchLatencyModel:
    """T(b) = intercept + slope * b, least squares with exponential forgetting.

    Seeded with (batch size, whole-graph latency) points of the latency table, each weighing ``prior_weight``;
    every observed batch multiplies the old weights by ``forget`` and adds itself with weight 1, so the fit follows
    what the device really does.
    """

    __slots__ = ("forget", "_w", "_sb", "_st", "_sbb", "_sbt", "intercept", "slope")

    def __init__(self, points: Iterable[tuple[float, float]], *, prior_weight: float = 1.0,
                 forget: float = 0.98) -> None:
        if not 0 < forget <= 1:
            raise ConfigError(f"forget must be in (0, 1], got {forget!r}", field="forget")
        self.forget = forget
        self._w = self._sb = self._st = self._sbb = self._sbt = 0.0
        self.intercept = self.slope = 0.0
        for b, t in points:
            self._add(b, t, prior_weight)
        if self._w <= 0:
            raise ConfigError("the batch-latency regression needs at least one point", field="points")
        self._fit()

    @classmethod
    def from_table(cls, table: LatencyTable, enc_steps: int = 1, dec_steps: int = 1,
                   **kw: float) -> "BatchLatencyModel":
        return cls([(b, table.whole_graph_latency(b, enc_steps, dec_steps)) for b in table.batch_sizes], **kw)

    def _add(self, b: float, t: float, w: float) -> None:
        self._w += w
        self._sb += w * b
        self._st += w * t
        self._sbb += w * b * b
        self._sbt += w * b * t

    def _fit(self) -> None:
        var = self._sbb * self._w - self._sb * self._sb
        if var > 1e-12 * max(1.0, self._w * self._sbb):
            self.slope = (self._sbt * self._w - self._sb * self._st) / var
            self.intercept = (self._st - self.slope * self._sb) / self._w
        else:  # one batch size seen so far: a line through the origin and the mean
            mean_b = self._sb / self._w
            self.slope = (self._st / self._w) / mean_b if mean_b else 0.0
            self.intercept = 0.0

    def observe(self, batch_size: int, seconds: float) -> None:
        f = self.forget
        self._w *= f
        self._sb *= f
        self._st *= f
        self._sbb *= f
        self._sbt *= f
        self._add(batch_size, seconds, 1.0)
        self._fit()

    def predict(self, batch_size: int) -> float:
        t = self.intercept + self.slope * batch_size
        return t if t > 1e-9 else 1e-9


def preferred_batch_size(rate: float, model: BatchLatencyModel, max_batch_size: int) -> int:
    """Eq. 1: the smallest batch size b with b / T_b > rate, capped at max_batch_size."""
    for b in range(1, max_batch_size + 1):
        if b / model.predict(b) > rate:
            return b
    return max_batch_size


class _DeadlineAware(GraphBatching):
    """Shared by the policies that size batches with the regression and guard the oldest request's deadline."""

    GUARD_MARGIN = 0.1  # the guard plans for batches 10% slower than predicted
    SLIP_WINDOW = 64  # batches whose slips the guard remembers
    SLIP_QUANTILE = 0.95

    def __init__(self, max_batch_size: int, forget: float) -> None:
        super().__init__(max_batch_size=max_batch_size, max_queue_delay=0.0)
        self.forget = forget
        self.model: BatchLatencyModel
        # How much later than planned recent guarded batches ended: started after their planned latest start (the
        # device still busy, a late timer) plus ran longer than the guard allowed. On a real server both happen
        # (docs/monitor.md: 9-43% of deadlines missed when the guard planned for exact predictions); the guard
        # plans that much earlier, so that waiting until the edge keeps the deadline. Exact predictions on an idle
        # device give no slip, and the policy is the seed's.
        self.learn_slip = True  # False: plan for exact predictions on an idle device only (the seed's guard)
        self._slips: deque[float] = deque(maxlen=self.SLIP_WINDOW)
        self.slip_margin = 0.0
        self._last_latest: float | None = None

    def attach(self, scheduler) -> None:  # type: ignore[override]
        super().attach(scheduler)
        self.model = BatchLatencyModel.from_table(self.table, forget=self.forget)
        self._table_time = [0.0] + [self.table.whole_graph_latency(b) for b in range(1, self.max_batch_size + 1)]

    def _latest_start(self, n: int) -> float:
        """When the oldest queued request must start for a batch of ``n`` to end by its deadline.

        A straight line cannot follow a flat-then-linear batch curve everywhere, so the guard takes the larger of
        the regression and the latency table, plus a margin: waiting "until the edge" must not cross it.
        """
        n = max(1, min(n, self.max_batch_size))
        t = max(self.model.predict(n), self._table_time[n]) * (1 + self.GUARD_MARGIN)
        latest = self.queue[0].deadline - t - self.slip_margin
        self._last_latest = latest
        return latest

    def _form(self, now: float) -> _Batch | float | None:
        self._last_latest = None
        formed = super()._form(now)
        if isinstance(formed, _Batch):
            formed.planned = self._last_latest
        return formed

    def _batch_done(self, batch: _Batch, now: float) -> None:
        took = now - batch.started
        if self.learn_slip and batch.planned is not None and not math.isinf(batch.planned):
            allowed = max(self.model.predict(batch.size), self._table_time[min(batch.size, self.max_batch_size)]) \
                * (1 + self.GUARD_MARGIN)
            self._slips.append(max(0.0, batch.started - batch.planned) + max(0.0, took - allowed))
            ordered = sorted(self._slips)
            self.slip_margin = ordered[min(len(ordered) - 1, int(self.SLIP_QUANTILE * len(ordered)))]
        self.model.observe(batch.size, took)


class BatchMonitor(_DeadlineAware):
    name = "monitor"

    def __init__(self, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE, window: float = 1.0, *,
                 forget: float = 0.98, rate_sigma: float = 1.0) -> None:
        if not isinstance(window, (int, float)) or not window > 0:
            raise ConfigError(f"the monitor window must be a positive number of seconds, got {window!r}",
                              field="window_ms")
        if not isinstance(rate_sigma, (int, float)) or not 0 <= rate_sigma < math.inf:
            raise ConfigError(f"rate_sigma must be a number >= 0 (Poisson standard deviations below a window's "
                              f"count; 0: the raw count), got {rate_sigma!r}", field="rate_sigma")
        super().__init__(max_batch_size, forget)
        self.window = float(window)
        self.rate_sigma = float(rate_sigma)
        self.pbs = 1  # the dispatcher starts from batch size 1
        self.rate = 0.0
        self._count = 0
        self._window_end: float | None = None
        self.history: list[tuple[float, float, int]] = []  # (window end, observed rate, preferred batch size)

    def describe(self) -> str:
        return (f"monitor(max_batch_size={self.max_batch_size}, window={self.window:g} s, "
                f"rate_sigma={self.rate_sigma:g})")

    def _roll(self, now: float) -> None:
        end = self._window_end
        if end is None:
            self._window_end = now + self.window
            return
        if now < end:
            return
        self._close_window(end, self._count / self.window)
        self._count = 0
        end += self.window
        if now >= end:  # whole windows without arrivals: rate 0 (one step, however long the gap)
            skipped = math.floor((now - end) / self.window) + 1
            end += skipped * self.window
            self._close_window(end - self.window, 0.0)
        self._window_end = end

    def supported_rate(self, rate: float) -> float:
        """The rate a window's count supports: ``rate_sigma`` Poisson standard deviations below the count."""
        n = rate * self.window
        return max(0.0, n - self.rate_sigma * math.sqrt(n)) / self.window

    def _close_window(self, t: float, rate: float) -> None:
        self.rate = rate
        self.pbs = preferred_batch_size(self.supported_rate(rate), self.model, self.max_batch_size)
        self.history.append((t, rate, self.pbs))

    def enqueue(self, request, now: float) -> None:  # type: ignore[override]
        self._roll(now)
        self._count += 1
        enqueue_by_priority(self.queue, request)

    def _decide(self, now: float) -> tuple[int, str] | float:
        self._roll(now)
        n = len(self.queue)
        target = self.pbs
        take = min(n, self.max_batch_size)
        latest = self._latest_start(take)
        if now >= latest and n < target:
            return take, f"deadline guard: {n} queued, preferred {target}"
        if n >= target:
            # at least the preferred size; a backlog beyond it (the rate rose since the last window) goes along
            return take, f"preferred batch size {target} reached ({self.rate:.0f} requests/s last window)"
        # Eq. 1's own reasoning: latency is lowest when a batch fills in the time it computes (Q_b = T_b); once the
        # oldest request has waited T_b for the preferred size, the rate has dropped since the last window: go.
        fill_by = self.queue[0].arrival + self.model.predict(target)
        if now >= fill_by:
            return take, f"fill timeout: {n} of preferred {target} queued after T_b"
        assert self._window_end is not None
        return min(latest, fill_by, self._window_end)


class MaxBatchUnderDeadline(_DeadlineAware):
    """The seed's first comparison point: wait until the largest batch that still meets the oldest deadline."""

    name = "deadline"

    def __init__(self, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE, *, forget: float = 0.98) -> None:
        super().__init__(max_batch_size, forget)

    def describe(self) -> str:
        return f"deadline(max_batch_size={self.max_batch_size})"

    def _decide(self, now: float) -> tuple[int, str] | float:
        n = len(self.queue)
        if n >= self.max_batch_size:
            return self.max_batch_size, "max_batch_size reached"
        latest = self._latest_start(n)
        if now >= latest or math.isinf(latest):
            return n, "the oldest request's deadline allows no more waiting" if not math.isinf(latest) \
                else "no deadline to wait for"
        return latest
