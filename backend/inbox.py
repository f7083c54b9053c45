"""The scheduler thread's loop: the inbox Triton's ``execute`` puts arrivals on, and the idle hooks it runs between.

The ``Scheduler`` is single-threaded, so exactly one thread (this one) calls into it; ``execute`` only puts the
requests of one call on a thread-safe queue (``Inbox.put``). The thread sleeps on that queue until an arrival, the
core's batching window (``backend/clock.py``) or a hook is due, takes everything that came, has the core decide once
(``Worker.decide``), and runs the job it gave (``BackendRuntime.run_next``). At moments with nothing held it runs the idle hook (counters, metrics) and, once
nothing has run for a while, the quiet hook (statistics file, memory given back), each at most at its interval.

The interface is narrow both ways. The runtime hands arrivals in (``put``), asks for what came during a job
(``drain``) and says when it answered or worked (``note_answer``, ``note_work``); the loop drives the runtime
through the ``Worker`` methods alone. Neither writes the other's fields; the inline route reads ``pending``,
``closed`` and ``idle`` (docs/architecture.md draws it).
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable, Iterable, NamedTuple, Protocol

if TYPE_CHECKING:
    from .request_parsing import RequestOptions
    from .rows import Parent

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


class Group(NamedTuple):
    """Inbox item: requests of one execute call, admitted together (``submit_group``)."""

    items: list[tuple[Parent, RequestOptions, float]]


WAKE = object()  # put on the inbox to wake the scheduler thread (a cancellation to answer)


class Call(NamedTuple):
    """Inbox item: a call to make on the scheduler thread (a grant from the device group's arbiter, which only
    that thread may hand to the scheduler)."""

    fn: Callable[[], None]


class Worker(Protocol):
    """What the loop asks of the runtime it serves (``BackendRuntime``), all on the loop's thread."""

    def has_job(self) -> bool: ...  # the scheduler gave a job not yet run
    def holds(self) -> bool: ...  # some request is held (admitted, unanswered)
    def run_next(self) -> bool: ...  # run the job, drain, report it done; False once closed
    def admit_group(self, items: list[tuple[Parent, RequestOptions, float]]) -> None: ...
    def answer_cancelled(self) -> None: ...
    def next_due(self) -> float | None: ...  # the core's batching window (monotonic), None: none
    def decide(self) -> None: ...  # the inputs taken: the core decides (answers, a window, a job)
    def looks_in(self) -> bool: ...  # inline passes may run, so the loop looks in on their bookkeeping
    def idle_hook(self) -> Any: ...  # under the lock: counters, metrics; returns the inline passes' rows ...
    def settle(self, rows: Any) -> None: ...  # ... which it tallies without the lock (taking it to calibrate)
    def release_arenas(self) -> None: ...  # under the lock: the sessions' next runs shrink their arenas ...
    def trim_heap(self) -> bool: ...  # ... and glibc's free heap goes back, without it; True: it went
    def write_statistics(self) -> None: ...  # takes the lock for the counters, writes the file after it
    def answer_leftovers(self, queued: Iterable[Parent]) -> None: ...


class InboxLoop:
    """The inbox and the scheduler thread that empties it, for one ``Worker``."""

    def __init__(self, worker: Worker, name: str, busy: threading.Lock, *,
                 memory_release_s: float = MEMORY_RELEASE_INTERVAL_S) -> None:
        self.worker = worker
        self.busy = busy  # held whenever this thread is awake (an inline pass holds it throughout: InlineRoute)
        self.memory_release_s = memory_release_s  # 0: never (config memory_release_ms)
        self.idle = threading.Event()  # set while nothing is held or pending (an inline pass may wait for it)
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()  # Group, WAKE, Call, or None (close)
        self.lock = threading.Lock()  # guards ``closed`` and ``pending`` (execute's threads and this one)
        # written only by this class, under ``lock``; plain attributes, read without it by the inline route (a
        # property call per read cost its every pass)
        self.closed = False
        self.pending = 0  # submitted, not yet admitted by the scheduler thread
        self.dirty = False  # something was answered since the idle hook last ran
        self.idle_hook_at = 0.0  # when the idle hook last ran (IDLE_HOOK_INTERVAL_S)
        self.quiet_owed = False  # the statistics file and the memory release wait for a quiet moment (QUIET_S)
        self.quiet_hook_at = 0.0  # when they last ran (STATS_MAX_AGE_S)
        self.worked_at = 0.0  # when the last pass or job ended (monotonic)
        self.released_at = time.monotonic()  # when memory was last given back (quiet_hook)
        self.thread = threading.Thread(target=self.run, name=f"{name}-scheduler", daemon=True)

    # ------------------------------------------------------------------ any thread
    def put(self, items: list[tuple[Parent, RequestOptions, float]]) -> bool:
        """Requests of one execute call, admitted together; False (nothing queued) once the loop is closing."""
        with self.lock:
            if self.closed:
                return False
            if items:
                self.idle.clear()
                self.queue.put(Group(items))
                self.pending += len(items)
        return True

    def wake(self) -> None:
        self.queue.put(WAKE)

    def post(self, fn: Callable[[], None]) -> None:
        """Have the scheduler thread call ``fn`` at its next turn (backend/arbiter/client.py: grants)."""
        self.queue.put(Call(fn))

    def close(self) -> None:
        """No more arrivals; the thread answers what is left and stops."""
        with self.lock:
            self.closed = True
            self.queue.put(None)

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
                    timeout = None if due is None else max(0.0, due - time.monotonic())
                    with self.lock:
                        if not w.holds() and not self.pending:
                            self.idle.set()  # a group waiting in execute runs inline now
                    item = self.wait(timeout)
                    with busy:
                        if item is None or not self.drain(first=item):
                            break
                        w.decide()
                    continue
                with busy:
                    if not w.run_next():
                        break
        except Exception:  # pragma: no cover - a bug; make it loud and answer what is held
            traceback.print_exc()
        finally:
            with busy:
                w.answer_leftovers(self._leftovers())
                rows = w.idle_hook()
            w.settle(rows)
            w.write_statistics()

    def wait(self, timeout: float | None) -> Any:
        """The next inbox item, or WAKE when ``timeout`` (a timer) passes first; None once close() was called."""
        try:
            return self.queue.get(timeout=timeout) if timeout is None or timeout > 0 else self.queue.get_nowait()
        except queue.Empty:
            return WAKE

    def drain(self, *, first: Any = None) -> bool:
        """Hand every queued arrival to the worker (``first``: one already taken off the inbox); False once
        close() was called."""
        w = self.worker
        while True:
            if first is not None:
                item, first = first, None
            else:
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    return True
            if item is None:
                return False
            if item is WAKE:
                w.answer_cancelled()
                continue
            if type(item) is Call:
                item.fn()
                continue
            with self.lock:
                self.pending -= len(item.items)
            w.admit_group(item.items)

    def _leftovers(self) -> list[Parent]:
        """The requests still on the inbox once the thread stops (None, the close, and WAKE, a cancellation to
        look at, hold none)."""
        out: list[Parent] = []
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                return out
            if isinstance(item, Group):
                out += [parent for parent, _, _ in item.items]

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
