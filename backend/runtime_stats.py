"""The backend runtime's counters: where the scheduler thread's time goes, what the inline route served, and why
groups went to the scheduler instead. Written as the statistics file (``LAZYBATCH_STATS_DIR``, backend/model.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RuntimeStats:
    """Where the scheduler thread's time goes; ``overhead_per_stage`` excludes onnxruntime."""

    requests: int = 0
    samples: int = 0
    stage_runs: int = 0
    batch_hist: dict[int, int] = field(default_factory=dict)
    ort_s: float = 0.0
    io_s: float = 0.0  # concatenating inputs and splitting outputs
    sched_s: float = 0.0  # policy decisions, bookkeeping, hand-off
    answered: dict[str, int] = field(default_factory=dict)
    span_runs: int = 0  # jobs that ran several stages with no decision point between (StageJob.stop)
    inline_runs: int = 0  # whole-graph passes run in Triton's execute call, outside the scheduler (InlineRoute.run)
    inline_requests: int = 0
    inline_groups: int = 0  # execute calls served inline (inline_runs / inline_groups: passes a group took)
    inline_waits: int = 0  # groups that waited in execute for the scheduler to finish what it held, then ran inline
    # why a group handed to execute went to the scheduler instead (InlineRoute.run's refusals, by reason)
    inline_refused: dict[str, int] = field(default_factory=dict)
    time_scale: float = 1.0  # measured / profiled stage time over the model (batcher/calibration.py: its scale)
    host_per_job_s: float = 0.0  # what a job costs besides onnxruntime (moving average): a decision point's cost
    memory_releases: int = 0  # idle moments that released arena and heap memory (backend/memory.py)
    memory_release_s: float = 0.0  # time malloc_trim took on the scheduler thread
    cancel_checks: int = 0  # is_cancelled() round trips the watcher made (backend/cancel_watch.py): its IPC load
    cancel_check_s: float = 0.0  # the wall time they took
    cancel_slip: float = 1.0  # served job time over the table's, as the watcher predicts boundaries with it
    admit_wait_s: float = 0.0  # from execute's hand-off to the scheduler thread taking the request, summed
    admit_wait_max_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        n = max(self.stage_runs, 1)
        return {
            "requests": self.requests, "samples": self.samples, "stage_runs": self.stage_runs,
            "batch_hist": {str(k): v for k, v in sorted(self.batch_hist.items())},
            "ort_s": self.ort_s, "io_s": self.io_s, "sched_s": self.sched_s,
            "mean_stage_ort_ms": self.ort_s / n * 1e3,
            "overhead_per_stage_ms": (self.io_s + self.sched_s) / n * 1e3,
            "overhead_fraction": (self.io_s + self.sched_s) / self.ort_s if self.ort_s else 0.0,
            "answered": dict(self.answered), "time_scale": self.time_scale, "span_runs": self.span_runs,
            "inline_runs": self.inline_runs, "inline_requests": self.inline_requests,
            "inline_groups": self.inline_groups, "inline_waits": self.inline_waits,
            "inline_refused": dict(sorted(self.inline_refused.items())),
            "host_per_job_ms": self.host_per_job_s * 1e3,
            "memory_releases": self.memory_releases, "memory_release_ms": self.memory_release_s * 1e3,
            "cancel_checks": self.cancel_checks, "cancel_check_ms": self.cancel_check_s * 1e3,
            "cancel_slip": self.cancel_slip,
            "admit_wait_mean_ms": self.admit_wait_s / max(self.requests, 1) * 1e3,
            "admit_wait_max_ms": self.admit_wait_max_s * 1e3,
        }
