"""The scheduler thread's stage runs: a job's stage, or its span of stages, on its requests' joined tensors, split
back per request, timed into the statistics and the table the policy plans with.

A part of ``BackendRuntime`` (``runtime.py``) in a file of its own: it reads what the runtime's constructor built
(``runner``, ``whole_runner``, ``whole_wide``, ``alone``, ``fault``, ``metrics``, ``stats``, ``on_batch``,
``keeper``) and writes nothing onto it. ``Seq2SeqRuntime`` overrides ``_run`` and ``_run_batch`` with its loops.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Callable

import numpy as np

from lazybatch.batcher.interfaces import StageJob, StageResult
from lazybatch.batcher.request import Request
from lazybatch.sessions.inplace import InPlaceRunError

from .faults import InjectedFault
from .rows import gather

if TYPE_CHECKING:
    from .faults import FaultInjector
    from .metrics import ModelMetrics
    from .runtime_stats import RuntimeStats
    from .stages import StageRunner
    from .table_keeper import TableKeeper


class StageRuns:
    """``_run`` (the executor's job), with each request run alone where a batched run fails."""

    runner: "StageRunner"
    whole_runner: "StageRunner | None"
    whole_wide: bool
    alone: Callable[[], bool]
    fault: "FaultInjector | None"
    metrics: "ModelMetrics | None"
    stats: "RuntimeStats"
    on_batch: "Callable[[int, int, float], None] | None"
    keeper: "TableKeeper"

    def _run(self, job: StageJob) -> StageResult | None:
        """Run the job's stage (or span of stages) on its (not cancelled) requests: concatenate, onnxruntime, split.

        If the batched run fails, each request is run alone so that only the ones that fail on their own are
        answered with the error; the rest of the batch goes on.
        """
        reqs = [r for r in job.requests if not r.cancelled]
        if not reqs:
            return None
        if job.stop == job.stage + 1:
            run: Callable[[list[Request]], None] = functools.partial(self._run_batch, job.stage)
        else:
            run = functools.partial(self._run_span, job.stage, job.stop)
        try:
            run(reqs)
            return None
        except Exception as e:
            if self.metrics is not None:  # a span's failure counts against its first stage unless the error says
                self.metrics.stage_failed(e.stage if isinstance(e, InjectedFault) else job.stage)
            if len(reqs) == 1 or isinstance(e, InPlaceRunError):  # in place: the inputs are gone, no rerun
                return StageResult(errors={r.id: f"{type(e).__name__}: {e}" for r in reqs})
        errors: dict[int, str] = {}
        for r in reqs:
            try:
                run([r])
            except Exception as e:  # onnxruntime failure: this request fails, the server goes on
                if self.metrics is not None:
                    self.metrics.stage_failed(e.stage if isinstance(e, InjectedFault) else job.stage)
                errors[r.id] = f"{type(e).__name__}: {e}"
        return StageResult(errors=errors) if errors else None

    def _run_span(self, start: int, stop: int, reqs: list[Request]) -> None:
        """Stages ``start .. stop-1`` on one batch with no decision point between them (``StageJob.stop``): the
        inputs are joined once, the batch's tensors pass from stage to stage as they are, and only what later stages
        or the answer read is split per request at the end. The whole graph (0..n) runs as one onnxruntime call
        where the backend holds the verified whole-graph session (``whole_runner``)."""
        runner = self.runner
        stages = runner.manifest.stages
        stats = self.stats
        t0 = time.perf_counter()
        whole = self.whole_runner if start == 0 and stop == runner.n_stages else None
        wide = whole is not None and self.whole_wide
        if wide and not self.alone():
            whole = None
            wide = False
        feeds: dict[str, np.ndarray] = {}
        need = [i for s in range(start, stop) for i in stages[s].inputs
                if i.source is None or i.source < start]
        for inp in need:
            if inp.name not in feeds:
                feeds[inp.name] = gather(inp, reqs, runner.join)
        t1 = time.perf_counter()
        if self.fault is not None:
            ids = [r.id for r in reqs]
            for s in range(start, stop):
                self.fault.check(s, ids)
        if whole is not None:
            tensors = whole.run_resident(0, feeds, owned=True)
        else:
            tensors = dict(feeds)
            for s in range(start, stop):
                spec = stages[s]
                tensors.update(runner.run_resident(s, {i.name: tensors[i.name] for i in spec.inputs}, owned=True))
        t2 = time.perf_counter()
        keep = [name for name, arr in tensors.items() if runner.last_use.get(name, -1) >= stop]
        for k, r in enumerate(reqs):
            own = r.payload.tensors
            for name in keep:
                own[name] = (tensors[name], k)
            for s in range(start, stop):
                for name in runner.drop_after[s]:
                    own.pop(name, None)
        t3 = time.perf_counter()
        stats.span_runs += 1
        self._counted(start, len(reqs), t0, t1, t2, t3)
        # a whole-graph pass too: the table must follow what the device does, and at low load nearly every
        # request is one (its time shared among the stages by their table times); not a wider one (whole_wide)
        if not wide:
            self.keeper.observe_span(start, stop, len(reqs), t3 - t0)

    def _run_batch(self, stage: int, reqs: list[Request]) -> None:
        runner = self.runner
        spec = runner.manifest.stages[stage]
        t0 = time.perf_counter()
        feeds = {inp.name: gather(inp, reqs, runner.join) for inp in spec.inputs}
        t1 = time.perf_counter()
        if self.fault is not None:
            self.fault.check(stage, [r.id for r in reqs])
        outs = runner.run_resident(stage, feeds, owned=True)  # joined: this batch's alone, see StageRunner.run
        t2 = time.perf_counter()
        for k, r in enumerate(reqs):
            tensors = r.payload.tensors
            for name, arr in outs.items():
                tensors[name] = (arr, k)
            for name in runner.drop_after[stage]:
                tensors.pop(name, None)
        t3 = time.perf_counter()
        self._counted(stage, len(reqs), t0, t1, t2, t3)
        self._calibrate(stage, len(reqs), t3 - t0)  # what the stage costs served: onnxruntime, join and split

    def _counted(self, stage: int, batch: int, t0: float, t1: float, t2: float, t3: float) -> None:
        """A run into the statistics and the batch log: joined by ``t1``, onnxruntime until ``t2``, split by ``t3``."""
        stats = self.stats
        stats.stage_runs += 1
        stats.batch_hist[batch] = stats.batch_hist.get(batch, 0) + 1
        stats.ort_s += t2 - t1
        stats.io_s += (t1 - t0) + (t3 - t2)
        if self.on_batch is not None:
            self.on_batch(stage, batch, t2 - t1)

    def _calibrate(self, stage: int, batch: int, took: float) -> None:
        """The stage run into the table the policy plans with (backend/table_keeper.py)."""
        self.keeper.observe(stage, batch, took)

    def calibrate_span(self, start: int, stop: int, batch: int, took: float, runs: int = 1) -> None:
        self.keeper.observe_span(start, stop, batch, took, runs)
