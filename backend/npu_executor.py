"""The NPU-time executor: serve real outputs (onnxruntime on the CPU), release each stage at its modelled NPU time.

Set on a lazybatch model with config parameters ``executor: "npu"`` and ``npu_time_scale: "<k>"`` (written by
``lazybatch repo add --executor npu``). The model's latency table must then be an NPU-modelled one (``lazybatch npu
latency``; it carries ``meta.npu``): the scheduler and the slack predictor read it, multiplied by k, and every stage
run on a batch of b samples is released ``k * T_npu(stage, b)`` after it started.

When the CPU is slower than the modelled NPU (onnxruntime takes longer than ``k * T_npu``) the stage is released
when onnxruntime finishes: completions come at ``max(cpu, k * npu)`` on the wall clock. A virtual clock is not an
option in a real server: its clients, arrivals, deadlines and cancellations all live on the wall clock (a run on a
virtual clock is what the simulator is). Instead the overruns are counted (``npu`` in the backend's statistics) and
``npu_time_scale`` is the knob that removes them: with k large enough the server runs in slow motion, NPU time
dominates every stage, and served latencies divided by k are the NPU's. Scaling is exact for the scheduler: a
table scaled by k with arrival gaps, SLAs and batching windows scaled by k makes the same decisions. What is not
scaled is the server's own per-stage overhead (Python, gRPC, tensor copies), which therefore shrinks by 1/k in the
reported figures; docs/npu.md shows how close served and simulated runs of one trace come.

No changes to ``runtime.py``: the executor is a wrapper around the ``StageRunner`` whose ``run`` the runtime calls
once per stage job.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Mapping

import numpy as np

from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.latency_table import LatencyTable

from .rows import join_rows


def _param(cfg: Any, key: str) -> str | None:
    return cfg.parameters[key].string_value.strip() if key in cfg.parameters else None


class NpuTimedRunner:
    """A StageRunner whose ``run`` returns no earlier than ``scale * T_npu(stage, batch)`` after it was called."""

    def __init__(self, runner: Any, table: LatencyTable) -> None:
        self._runner = runner
        self.table = table  # already scaled
        self._lock = threading.Lock()
        self._released = float("-inf")  # when the previous stage run was released
        self._late = 0.0  # how far after its target that was
        self._prev_npu = 0.0
        self.stats = {"stage_runs": 0, "modelled_s": 0.0, "cpu_s": 0.0, "overruns": 0, "overrun_s": 0.0,
                      "late_s": 0.0}

    def __getattr__(self, name: str) -> Any:  # manifest, n_stages, drop_after, output_names, profile, ...
        return getattr(self._runner, name)

    def run(self, stage: int, feeds: Mapping[str, np.ndarray], *, owned: bool = False) -> dict[str, np.ndarray]:
        t0 = time.monotonic()
        # The previous release came `late` after its target (sleep overshoot on a busy machine: an artefact, not a
        # property of the NPU): when this stage was dispatched right after it, it starts `late` earlier on the NPU's
        # timeline, so overshoots do not add up over the stages of a request.
        start = t0 - self._late if t0 - self._released < self._prev_npu else t0
        outs = self._runner.run(stage, feeds, owned=owned)  # in-place residual stages, as StageRunner.run
        cpu = time.monotonic() - t0
        batch = int(next(iter(feeds.values())).shape[0]) if feeds else 1
        npu = self.table.latency(stage, batch)
        target = max(start + npu, t0 + cpu)  # max(cpu, npu): never before onnxruntime is done
        left = target - time.monotonic()
        if left > 0:
            time.sleep(left)
        self._released = time.monotonic()
        self._late = max(0.0, self._released - target)
        self._prev_npu = npu
        with self._lock:
            s = self.stats
            s["stage_runs"] += 1
            s["modelled_s"] += npu
            s["late_s"] += self._late
            s["cpu_s"] += cpu
            if cpu > npu:
                s["overruns"] += 1
                s["overrun_s"] += cpu - npu
        return outs

    # the served path: host numpy, timed (the NPU is modelled; its stages are never built with device tensors)
    run_resident = run

    def join(self, parts: list[tuple[np.ndarray, int]]) -> np.ndarray:
        return join_rows(parts)

    to_host = join

    def run_all(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._runner.run_all(inputs)  # warm-up and reference runs are not timed

    def npu_stats(self) -> dict[str, Any]:
        with self._lock:
            s = dict(self.stats)
        s["overrun_fraction"] = s["overruns"] / s["stage_runs"] if s["stage_runs"] else 0.0
        s["mean_late_ms"] = s["late_s"] / s["stage_runs"] * 1e3 if s["stage_runs"] else 0.0
        return s


def scale_table(table: LatencyTable, k: float) -> LatencyTable:
    if k == 1:
        return table
    return LatencyTable(table.graph, table.batch_sizes, [[v * k for v in row] for row in table.measured],
                        provenance=f"{table.provenance}; every latency x{k:g} (npu_time_scale)",
                        meta=dict(table.meta, npu_time_scale=k))


def maybe_wrap(cfg: Any, runner: Any, table: LatencyTable, max_batch_size: int) -> tuple[Any, LatencyTable]:
    """(runner, table) unchanged for the onnxruntime executor; the NPU-timed runner and the scaled NPU table for
    ``executor: npu``. Refuses a table that is not NPU-modelled or does not cover ``max_batch_size``."""
    executor = (_param(cfg, "executor") or "onnxruntime").lower()
    scale_text = _param(cfg, "npu_time_scale")
    if executor in ("onnxruntime", "ort", "cpu"):
        if scale_text:
            raise ConfigError("npu_time_scale is only read with executor: npu", field="parameters.npu_time_scale")
        return runner, table
    if executor != "npu":
        raise ConfigError(f"executor must be onnxruntime or npu, got {executor!r}", field="parameters.executor")
    try:
        k = float(scale_text) if scale_text else 1.0
    except ValueError:
        k = float("nan")
    if not math.isfinite(k) or k <= 0:
        raise ConfigError(f"npu_time_scale must be a positive number, got {scale_text!r}",
                          field="parameters.npu_time_scale")
    if "npu" not in table.meta:
        raise ConfigError("executor npu needs an NPU-modelled latency table (from `lazybatch npu latency` or "
                          "`lazybatch repo add --executor npu`); this one has no meta.npu", field="latency_table")
    table.check_covers(max_batch_size)
    scaled = scale_table(table, k)
    # the runner keeps a copy of its own: the scheduler's table is recalibrated in place from observed stage times
    # (batcher/calibration.py), and the modelled NPU time must not follow them
    return NpuTimedRunner(runner, LatencyTable.from_dict(scaled.to_dict())), scaled
