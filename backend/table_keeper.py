"""Keeps a served model's latency table true: what its stage runs take, served, goes back into the table the policy
plans with, and what a decision point costs goes to a policy that weighs boundaries against it.

Why: the table is profiled once, alone; served next to other work the stages run slower, and not uniformly, and a
predictor that believes the profile admits work that then misses its deadline. The online calibrator
(batcher/calibration.py) rewrites the table per stage and batch size from the observed runs; the rewrite (every
stage, every batch size and the policy's derived tables) is rate-limited to ``RECALIBRATE_INTERVAL_S``. Scheduler
thread only (an inline pass holds its lock).
"""

from __future__ import annotations

import time
from typing import Callable

from lazybatch.batcher.calibration import OnlineCalibrator
from lazybatch.batcher.interfaces import StageJob
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.policies.backend_hooks import serving_costs
from lazybatch.batcher.policies.base import Policy

from .runtime_stats import RuntimeStats

# The latency table is rewritten from the observed runs at most this often: a rewrite cost more than a MobileNet
# stage, and was due after nearly every run of a noisy span.
RECALIBRATE_INTERVAL_S = 0.25
BOUNDARY_COST_WEIGHT = 0.02  # per job: the measured cost of a decision point follows the host within ~50 jobs


class TableKeeper:
    """The calibrated table of one runtime, and the measured cost of a decision point."""

    def __init__(self, table: LatencyTable, policy: Policy, stats: RuntimeStats, *,
                 measure_boundary_cost: bool = True,
                 on_refresh: Callable[[list[list[float]]], None] | None = None) -> None:
        self.stats = stats
        self.dense = table.dense  # the rows the calibrator rewrites in place
        self.calibrator = OnlineCalibrator(table)
        # the policy's boundary cost follows the measured cost of a job, unless the model's config fixed it
        self._costs = serving_costs(policy) if measure_boundary_cost else None
        self.on_refresh = on_refresh  # after each rewrite, with the new rows (the core's recalibration, the watcher's pace)
        self.owed = False
        self.refreshed_at = float("-inf")

    def observe(self, stage: int, batch: int, took: float) -> None:
        """One stage run of ``batch`` rows took ``took`` seconds served (onnxruntime, join and split)."""
        if self.calibrator.observe(stage, batch, took, refresh=False):
            self.owed = True
        self._maybe_refresh()

    def observe_span(self, start: int, stop: int, batch: int, took: float, runs: int = 1) -> None:
        """A span's time shared among its stages in proportion to their table times (a whole-graph pass has no
        per-stage times of its own); ``runs``: that many runs whose mean was ``took``."""
        if batch >= len(self.dense[start]):
            return
        if self.calibrator.observe_span(start, stop, batch, took, refresh=False, runs=runs):
            self.owed = True
        self._maybe_refresh()

    def _maybe_refresh(self) -> None:
        if not self.owed:
            return
        now = time.monotonic()
        if now - self.refreshed_at < RECALIBRATE_INTERVAL_S:
            return
        self.owed = False
        self.refreshed_at = now
        self.calibrator.refresh()
        self.stats.time_scale = self.calibrator.scale
        if self.on_refresh is not None:
            self.on_refresh(self.dense)

    def expected_s(self, job: StageJob) -> float:
        """How long the job should take, from the (calibrated) table."""
        dense = self.dense
        b = job.batch_size
        t = 0.0
        for s in job.span:
            row = dense[s]
            t += row[b] if b < len(row) else row[-1] * b / (len(row) - 1)
        return t

    def boundary_cost(self, host_s: float) -> None:
        """A moving average of what one job costs the scheduler thread besides onnxruntime: tensors joined and
        split, the policy's decision, the hand-off. A policy that weighs decision points against their cost
        (``boundary_cost``, batcher/policies/eager.py) reads it, unless the model's config fixed it."""
        stats = self.stats
        if host_s < 0.0:
            return
        stats.host_per_job_s += BOUNDARY_COST_WEIGHT * (host_s - stats.host_per_job_s) if stats.stage_runs > 1 \
            else host_s - stats.host_per_job_s
        if self._costs is not None:
            self._costs.measured_costs(boundary_s=stats.host_per_job_s)
