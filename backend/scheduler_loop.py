"""The scheduler thread's loop: when it sleeps, and the bookkeeping it does at idle and quiet moments.

The ``Scheduler`` is single-threaded, so exactly one thread (this one) calls into it. The loop asks its runtime to
wait for inputs until the core's batching window (``backend/clock.py``) or a hook is due (``Worker.take_inputs``:
the runtime takes every arrival, cancellation and call that came and has the core decide once), then runs the job
the core gave (``Worker.run_next``). The requests themselves never pass through here: the runtime owns its inbox.
At moments with nothing held it runs the idle hook (counters, metrics) and, once nothing has run for a while, the
quiet hook (statistics file, memory given back), each at most at its interval.

The loop drives the runtime through the ``Worker`` methods alone; the runtime tells it when it answered or worked
(``note_answer``, ``note_pass``, ``note_work``), and the inline route does the same (docs/architecture.md draws it).
"""

from __future__ import annotations

import threading
import time
import traceback
from typing import Any, Protocol

# The idle hook (statistics file, metrics) runs at most this often: written at every idle moment it cost a JSON file
# per request at low load, on the cores onnxruntime needs. Inline passes leave it to the scheduler thread, which
# wakes this often to see whether they did.
IDLE_HOOK_INTERVAL_S = 0.1
# The statistics file (``on_idle``) and the memory release wait for a quiet moment: nothing run for this long. Under
# steady load there is none, and there they cost eager alone (Triton's path has neither): the file took about 1 ms
# of the scheduler thread at each hook in-process (ad hoc), ten hooks a second beside the passes, on the cores
# onnxruntime needs (docs/triton.md, "Bookkeeping at quiet moments"). Under a load that never pauses the file is
# still written every STATS_MAX_AGE_S, and memory given back every MEMORY_RELEASE_UNDER_LOAD release intervals.
QUIET_S = 0.1
STATS_MAX_AGE_S = 2.0
MEMORY_RELEASE_UNDER_LOAD = 4
# Arena and heap memory is given back (backend/memory.py) at an idle moment at most this often (config
# memory_release_ms; 0: never): a burst's largest batches then hold their memory a few seconds, not for good.
MEMORY_RELEASE_INTERVAL_S = 5.0


class Worker(Protocol):
    """What the loop asks of the runtime it serves (``BackendRuntime``), all on the loop's thread."""

    def has_job(self) -> bool: ...  # the scheduler gave a job not yet run
    def holds(self) -> bool: ...  # some request is held (admitted, unanswered)
    def next_due(self) -> float | None: ...  # the core's batching window (monotonic), None: none
    def take_inputs(self, timeout: float | None) -> bool: ...  # wait, take what came, decide; False once closed
    def run_next(self) -> bool: ...  # run the job, take inputs, report it done; False once closed
    def looks_in(self) -> bool: ...  # inline passes may run, so the loop looks in on their bookkeeping
    def idle_hook(self) -> Any: ...  # under the lock: counters, metrics; returns the inline passes' rows ...
    def settle(self, rows: Any) -> None: ...  # ... which it tallies without the lock (taking it to calibrate)
    def release_arenas(self) -> None: ...  # under the lock: the sessions' next runs shrink their arenas ...
    def trim_heap(self) -> bool: ...  # ... and glibc's free heap goes back, without it; True: it went
    def write_statistics(self) -> None: ...  # takes the lock for the counters, writes the file after it
    def answer_leftovers(self) -> None: ...  # the thread stops: everything held or still in the inbox answered


class SchedulerLoop:
    """The scheduler thread of one ``Worker``, and when its hooks are due."""

    def __init__(self, worker: Worker, name: str, busy: threading.Lock, *,
                 memory_release_s: float = MEMORY_RELEASE_INTERVAL_S) -> None:
        self.worker = worker
        self.busy = busy  # held whenever this thread is awake (an inline pass holds it throughout: InlineRoute)
        self.memory_release_s = memory_release_s  # 0: never (config memory_release_ms)
        # written by the notes below (this thread, or an inline pass under ``busy``); plain attributes
        self.dirty = False  # something was answered since the idle hook last ran
        self.idle_hook_at = 0.0  # when the idle hook last ran (IDLE_HOOK_INTERVAL_S)
        self.quiet_owed = False  # the statistics file and the memory release wait for a quiet moment (QUIET_S)
        self.quiet_hook_at = 0.0  # when they last ran (STATS_MAX_AGE_S)
        self.worked_at = 0.0  # when the last pass or job ended (monotonic)
        self.released_at = time.monotonic()  # when memory was last given back (quiet_hook)
        self.thread = threading.Thread(target=self.run, name=f"{name}-scheduler", daemon=True)

    # ------------------------------------------------------------------ the runtime and its inline passes
    def note_answer(self) -> None:
        """A request was answered: the idle hook is owed."""
        self.dirty = True

    def note_pass(self, end: float) -> None:
        """An inline pass answered and ended at ``end`` (time.monotonic()): ``note_answer`` and ``note_work`` in
        one call, on the lone request's path."""
        self.dirty = True
        self.worked_at = end

    def note_work(self, now: float | None = None) -> None:
        """A job or a pass ended now (``now``: time.monotonic(), where the caller has it): the quiet moment starts
        later."""
        self.worked_at = time.monotonic() if now is None else now

    # ------------------------------------------------------------------ scheduler thread
    def run(self) -> None:
        w = self.worker
        busy = self.busy
        try:
            while True:
                if not w.has_job():
                    due = w.next_due()
                    if (self.dirty or self.quiet_owed) and not w.holds():  # about to wait with nothing held
                        now = time.monotonic()
                        if self.dirty and now - self.idle_hook_at >= IDLE_HOOK_INTERVAL_S:
                            with busy:
                                self.dirty = False
                                self.quiet_owed = True
                                self.idle_hook_at = now
                                rows = w.idle_hook()
                            w.settle(rows)  # the inline passes' tally, without the lock (Worker.settle)
                        if self.quiet_owed and not self.dirty and (
                                now - self.worked_at >= QUIET_S or now - self.quiet_hook_at >= STATS_MAX_AGE_S):
                            with busy:
                                self.quiet_owed = False
                                self.quiet_hook_at = now
                                trim = self.quiet_hook(now)
                            if trim:  # glibc's heap, without the lock: 1-4 ms served under load (ad hoc)
                                w.trim_heap()
                            w.write_statistics()  # takes the lock for the counters only
                    hook = None
                    if self.dirty:  # the hook is owed: at its interval
                        hook = max(self.idle_hook_at + IDLE_HOOK_INTERVAL_S, time.monotonic() + 1e-3)
                    elif self.quiet_owed:  # ... and then the quiet one, once nothing has run for QUIET_S
                        hook = max(min(self.worked_at + QUIET_S, self.quiet_hook_at + STATS_MAX_AGE_S),
                                   time.monotonic() + 1e-3)
                    elif w.looks_in():
                        # inline passes, which never wake this thread, may make it owed (their metrics and
                        # calibration are applied by it, Worker.settle): look in once an interval.
                        # (Not "at the interval after the last hook": with nothing owed that moment is past, and
                        # the thread woke every millisecond, 25 ms of CPU a second in an idle stub.)
                        hook = time.monotonic() + IDLE_HOOK_INTERVAL_S
                    if hook is not None:
                        due = hook if due is None else min(due, hook)
                    if not w.take_inputs(None if due is None else max(0.0, due - time.monotonic())):
                        break
                    continue
                with busy:
                    if not w.run_next():
                        break
        except Exception:  # pragma: no cover - a bug; make it loud and answer what is held
            traceback.print_exc()
        finally:
            with busy:
                w.answer_leftovers()
                rows = w.idle_hook()
            w.settle(rows)
            w.write_statistics()

    # ------------------------------------------------------------------ hooks (scheduler thread, busy lock held)
    def quiet_hook(self, now: float) -> bool:
        """After an idle hook, once nothing has run for QUIET_S (or the file is STATS_MAX_AGE_S old): the memory
        given back (at most once a ``memory_release_s``): the arenas here, under the lock; True: the heap is
        trimmed after it (``Worker.trim_heap``). The statistics file follows (``Worker.write_statistics``)."""
        # memory at rest, or (load that never pauses) at the latest every MEMORY_RELEASE_UNDER_LOAD intervals: a
        # burst's high-water mark is not kept for good by the steady load after it
        every = self.memory_release_s
        since = now - self.released_at
        if every and since >= every and (now - self.worked_at >= QUIET_S or since >= MEMORY_RELEASE_UNDER_LOAD * every):
            self.released_at = now
            self.worker.release_arenas()
            return True
        return False
