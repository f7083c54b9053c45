"""The runtime's bookkeeping off the request's path: what the scheduler thread does at idle and quiet moments
(``backend/scheduler_loop.py`` says when), and the inline passes' records applied for a reader elsewhere.

A part of ``BackendRuntime`` (``runtime.py``) in a file of its own, as ``stage_runs.py`` is: it reads what the
runtime's constructor built (``route``, ``watcher``, ``stats``, ``metrics``, ``scheduler``, ``runner``,
``whole_runner``, ``on_idle``, ``busy``, ``tally_lock``) and writes only the counters.
"""

from __future__ import annotations

import traceback
from array import array
from typing import TYPE_CHECKING, Any, Callable

from . import memory
from .inline_passes import apply_passes, calibrate, tally

if TYPE_CHECKING:
    import threading

    from lazybatch.batcher.scheduler import Scheduler

    from .cancel_watch import CancelWatcher
    from .inline import InlineRoute
    from .metrics import ModelMetrics
    from .runtime_stats import RuntimeStats
    from .stages import StageRunner


class QuietHooks:
    """The ``scheduler_loop.Worker`` hooks: counters and metrics, the inline passes' tally, memory, statistics."""

    route: "InlineRoute"
    watcher: "CancelWatcher | None"
    stats: "RuntimeStats"
    metrics: "ModelMetrics | None"
    scheduler: "Scheduler"
    runner: "StageRunner"
    whole_runner: "StageRunner | None"
    on_idle: "Callable[[Any], Callable[[], None] | None] | None"
    busy: "threading.Lock"
    tally_lock: "threading.Lock"

    def settled_stats(self) -> RuntimeStats:
        """The counters with every inline pass so far in them: the scheduler thread applies the passes' records
        at its idle hook (``idle_hook``, ``settle``); a reader on another thread (tests, in-process
        benchmarks) applies them now, under the scheduler's lock."""
        with self.busy, self.tally_lock:
            apply_passes(self.route.take_deferred(), self, self.stats)
        return self.stats

    def looks_in(self) -> bool:
        return self.route.on

    def idle_hook(self) -> array:
        """Under the lock: the counters the metrics read, and the inline passes' rows taken for ``settle``."""
        rows = self.route.take_deferred()
        watcher = self.watcher
        if watcher is not None:
            self.stats.cancel_checks = watcher.checks
            self.stats.cancel_check_s = watcher.check_s
            self.stats.cancel_slip = watcher.slip
        if self.metrics is not None:
            self.sync_metrics()
        return rows

    def settle(self, rows: array) -> None:
        """The inline passes' rows (``idle_hook``) into the counters and metrics without the lock, and into the
        table under it, briefly (backend/inline_passes.py: what the lock held meant for the requests that came)."""
        with self.tally_lock:  # (no rows: nothing to tally, nothing to calibrate)
            items = tally(rows, self, self.stats)
        if items:
            with self.busy:
                calibrate(items, self)

    def release_arenas(self) -> None:
        """Nothing held and something ran since the last release: the sessions' next runs shrink their arenas
        (under the lock: an inline pass reads which)."""
        memory.release_arenas((self.runner, self.whole_runner))

    def trim_heap(self) -> bool:
        """glibc returns its free heap pages now (a few ms at most, on this thread, without the lock: under load
        an inline pass that waited for it made the queue behind it wait too); False where it cannot."""
        return memory.trim_heap(self.stats)

    def write_statistics(self) -> None:
        """``on_idle`` under the lock; what it returns (the file written) after it."""
        try:
            with self.busy:
                save = self.on_idle(self) if self.on_idle is not None else None
            if save is not None:
                save()
        except Exception:  # statistics are best effort
            traceback.print_exc()

    def sync_metrics(self, min_interval: float = 0.0) -> None:
        self.metrics.sync_scheduler(self.scheduler.log, held=self.scheduler.held, policy=self.scheduler.policy,
                                    min_interval=min_interval)

