"""An inline pass's record, written on Triton's execute thread, and the records applied by the scheduler thread.

Why apart from the route (backend/inline.py): the route writes one row of numbers a pass and nothing else (every
line on its path delays the answer); the counters, the metrics and the table's calibration are applied later, by
the scheduler thread at its idle hook, for all the passes since its last look at once.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .runtime import BackendRuntime
    from .runtime_stats import RuntimeStats

# one inline pass, as the route records it (``InlineRoute._count``, ``run_one``) for ``apply_passes``: (samples, requests answered, seconds since execute
# began, requests failed alone, seconds the pass took (0: it failed), onnxruntime seconds, join and split seconds),
# PASS_FIELDS numbers in a row of a flat array of doubles. Not a tuple a pass: an object kept until the scheduler
# thread looks in is one the garbage collector tracks, and enough of them made the stub collect, a pause of tens of
# ms where Triton's batcher never collected (tiny at 90% load; the path now allocates nothing that outlives the call)
PASS_FIELDS = 7
PassRecord = tuple[int, int, float, int, float, float, float]


# what ``tally`` leaves for the table: (group size, mean seconds of its passes, passes), applied under the lock
Calibration = list[tuple[int, float, int]]


def apply_passes(deferred: array, rt: BackendRuntime, stats: RuntimeStats) -> None:
    """The passes' rows into the runtime's counters, metrics and calibration at once, under the runtime's lock (a
    reader on another thread: ``settled_stats``, the model's close)."""
    calibrate(tally(deferred, rt, stats), rt)


def calibrate(items: Calibration, rt: BackendRuntime) -> None:
    """``tally``'s means into the table the policy plans with: under the runtime's lock (the calibrator and the
    policy's table are the scheduler thread's, and an inline pass reads them)."""
    n_stages = rt.runner.n_stages
    for n, took, runs in items:
        rt.calibrate_span(0, n_stages, n, took, runs=runs)


def tally(deferred: array, rt: BackendRuntime, stats: RuntimeStats) -> Calibration:
    """The passes' rows (``PASS_FIELDS`` numbers each) into the runtime's counters and metrics, per batch size, one
    metrics call each; returns what the table is to learn from them (``calibrate``). Scheduler thread, without the
    runtime's lock: the counters written here are this thread's alone (the inline route writes others), and the
    metrics have a lock of their own. Why not under the lock: this took 0.3 ms of every 0.1 s interval on a 0.7 ms
    model at 90% load, served (ad hoc), and requests that came meanwhile waited for the lock; at 90% load the queue
    that forms takes ten times the wait to drain. Applied pass by pass, they cost 11 us of this thread per request
    in-process."""
    by_size: dict[int, list[array]] = {}  # each pass's row (PassRecord's fields, as doubles) by its size
    for k in range(0, len(deferred), PASS_FIELDS):
        by_size.setdefault(int(deferred[k]), []).append(deferred[k:k + PASS_FIELDS])
    n_stages = rt.runner.n_stages
    answered = stats.answered
    items: Calibration = []
    for n, recs in by_size.items():
        ok = failed = 0
        ort_s = io_s = 0.0
        latencies: list[tuple[float, int]] = []
        took: list[float] = []
        for _, ok_one, latency, failed_one, took_one, ort_one, io_one in recs:
            ok += int(ok_one)
            failed += int(failed_one)
            ort_s += ort_one
            io_s += io_one
            latencies.append((latency, int(ok_one)))
            if took_one > 0.0:
                took.append(took_one)
        stats.requests += ok + failed
        stats.inline_requests += ok + failed
        stats.samples += n * len(recs)
        stats.inline_runs += len(recs)
        stats.stage_runs += len(recs)
        stats.batch_hist[n] = stats.batch_hist.get(n, 0) + len(recs)
        stats.ort_s += ort_s
        stats.io_s += io_s
        answered["OK"] = answered.get("OK", 0) + ok
        if failed:
            answered["ERROR"] = answered.get("ERROR", 0) + failed
        if rt.metrics is not None:
            rt.metrics.passes_done(n_stages, n, latencies, failed)
        if took and not rt.whole_wide:  # a wider pass says nothing of the stages' times
            items.append((n, sum(took) / len(took), len(took)))
    return items
