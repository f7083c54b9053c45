"""Client cancellation, watched off the scheduler thread.

``request.is_cancelled()`` in the Python backend is a round trip to the Triton process (Triton 2.51's
python_backend has no other way to learn of a cancellation: no callback, no batch query; the stub caches a "yes"
only). Asked by the scheduler thread for every held request at every stage boundary, it cost more than an MLP stage
(the problem: 2 ms polls, a round trip per held request per stage). The watcher asks instead, on a thread of its own; the
scheduler thread only reads the flags it sets (``Request.cancelled``, read at the next stage boundary: a cancelled
request's compute stops there) and answers a cancelled request at once when woken.

When it asks (the goal: "cancellation of queued and running requests answered within one stage time", docs/operations.md):

- ``interval`` > 0 (``cancel_poll_ms: <ms>``): every held request at most once per interval, the earlier fixed rule.
  With the old 50 ms default a cancel was answered ~40 ms (median) after it, and a running request ran on for as
  many stages (docs/operations.md, Cancellation).
- ``interval`` == 0 (``cancel_poll_ms: auto``, the default): paced by the stage boundaries. The scheduler thread
  tells the watcher when a job starts, how long the latency table says it takes, and when it ended
  (``job_started``, ``job_ended``: no round trip, a few assignments). The watcher asks the job's requests shortly
  *before* its predicted end, so that a cancel that came during the stage is seen at its boundary, where the
  request's compute stops and its answer goes: within one stage time. The prediction is the table's time scaled by
  how much longer than predicted recent jobs took (the median of the last ``SLIP_WINDOW``: a table profiled alone
  is short when served), and a job still running past its predicted end is asked again every ``BOUNDARY_LEAD`` of
  its time until it ends. Queued requests are asked in the same sweeps, in turn. Every ``auto_interval(stage
  time)`` a sweep comes whatever the prediction says (while a job runs too: a prediction far off, such as the slip
  the first slow runs of every stage teach, must not leave running requests unasked for several stages; seen on
  the real server before this floor: a cancel answered 6 stages late after a warm-up).

What keeps the load on the Triton process bounded, whatever the rule: at most ``SWEEP_BUDGET`` requests asked per
sweep (running ones first: theirs is the compute being spent), sweeps at least ``MIN_INTERVAL_S`` apart, and at most
``MAX_ASK_RATE`` asks a second on average, fewer where asks take long (``MAX_ASK_SHARE`` of the clock) (a token bucket of ``SWEEP_BUDGET``: a sweep that overdraws it puts the
next one as much later as the debt takes to repay). An ask cost ~20 us of CPU in the stub and ~10 us in
tritonserver here (a probe of 5000 asks, docs/operations.md): 1000 a second is ~3% of one core, a twentieth of the
rate of the overload run below. Asks are synchronous, one at a time, so they never queue up in the server; the
server thread that answers them also takes the responses (python_backend's StubToParentMQMonitor), another reason
to keep them few.
"""

from __future__ import annotations

import collections
import statistics
import threading
import time
import traceback
from typing import Any, Callable, Iterable, Sequence

# Sweeps are at least this far apart: a model of 0.1 ms stages is not asked every stage, and a watcher asked to poll
# "continuously" (tests) still yields the core between sweeps.
MIN_INTERVAL_S = 0.001
MAX_AUTO_INTERVAL_S = 0.05  # auto never asks less often than the earlier fixed default (50 ms) did
# Requests asked per sweep, in turn. Each ask is a message to the Triton process: asking every held request every
# sweep (a thousand held past capacity, twenty sweeps a second) drove tritonserver to 11 GB and a heap-corruption
# abort in an overload run (MobileNet at 300% load); the scheduler thread's bounded polling of earlier versions,
# 16 per poll, never did.
SWEEP_BUDGET = 16
MAX_ASK_RATE = 1000.0  # is_cancelled() calls a second, on average over sweeps
# ... and, past capacity (more requests held than a sweep asks), at most this share of the wall clock spent asking
# (the rate falls as an ask's measured round trip grows):
# past capacity on a busy 2-core machine an ask took ~0.25 ms, not the 30 us of a quiet probe, and 1000 a second
# then held a quarter of a core that onnxruntime needed (ResNet-50 at 120% load with mixed traffic: 8144 asks,
# 2.1 s of 8, and 31/s served against 45/s without them)
MAX_ASK_SHARE = 0.03
# The sweep before a boundary starts this share of the job's predicted time before its predicted end (plus the
# round trips it will make): room for a prediction that is a little off and for the thread to wake. A cancel that
# comes in this last part of a stage is seen at the next boundary instead.
BOUNDARY_LEAD = 0.2
SLIP_WINDOW = 8  # recent jobs whose (actual / predicted) time scales the prediction (their median)
DEFAULT_RTT_S = 1e-4  # an ask's round trip until one is measured

Job = tuple  # (number, requests, when it started, predicted seconds); set by the scheduler thread only


def auto_interval(stage_s: float) -> float:
    """The ``cancel_poll_ms: auto`` period while no job runs, for a model whose typical stage takes ``stage_s``
    seconds: one stage, within [MIN_INTERVAL_S, MAX_AUTO_INTERVAL_S]."""
    return min(MAX_AUTO_INTERVAL_S, max(MIN_INTERVAL_S, float(stage_s)))


def typical_stage_s(dense: Sequence[Sequence[float]]) -> float:
    """The median over stages of the batch-1 time (``LatencyTable.dense`` rows are indexed by batch size)."""
    times = [row[1] for row in dense if len(row) > 1]
    return statistics.median(times) if times else MAX_AUTO_INTERVAL_S


class CancelWatcher:
    """Sweeps ``held()`` and calls ``on_cancel(parent)`` for each one ``is_cancelled`` reports gone (once per
    parent). ``interval`` 0 (auto): paced by the jobs ``job_started``/``job_ended`` announce, and every
    ``auto_interval(stage_s)`` while none runs; else every ``interval`` seconds."""

    def __init__(self, held: Callable[[], Iterable[Any]], is_cancelled: Callable[[Any], bool],
                 on_cancel: Callable[[Any], None], interval: float, name: str = "lazybatch",
                 lock: threading.Lock | None = None, *, stage_s: float = MAX_AUTO_INTERVAL_S,
                 parent_of: Callable[[Any], Any] | None = None) -> None:
        self.held = held
        # Held while a request is asked; whoever answers a request sets ``answered`` under it. Asking a request
        # whose final response was sent is a use-after-free in the server (seen: tritonserver crashed with
        # SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled), so a request is asked only while unanswered.
        self.lock = lock or threading.Lock()
        self.is_cancelled = is_cancelled
        self.on_cancel = on_cancel
        self.auto = interval <= 0
        self.interval = auto_interval(stage_s) if self.auto else max(MIN_INTERVAL_S, interval)
        self.parent_of = parent_of or (lambda r: getattr(getattr(r, "payload", None), "parent", None))
        self.checks = 0  # is_cancelled() calls made (statistics, tests)
        self.check_s = 0.0  # wall time they took
        self.budget = SWEEP_BUDGET
        self._cursor = 0  # where the next sweep starts among the held requests (round robin)
        self._rtt = DEFAULT_RTT_S  # moving average of one ask's round trip
        self._job: Job | None = None
        self._jobs = 0
        self._ended = 0  # the number of the last job that ended
        self._slips: collections.deque[float] = collections.deque(maxlen=SLIP_WINDOW)
        self._asked_job = 0  # the last job whose requests were asked before its boundary
        self._asked_at = float("-inf")  # when
        self._last_sweep = time.monotonic()  # a fixed interval's first sweep comes one interval after the start
        self._next_allowed = float("-inf")  # MIN_INTERVAL_S and MAX_ASK_RATE
        self._tokens = float(SWEEP_BUDGET)  # asks the rate allows now (negative: owed)
        self._refilled = time.monotonic()
        self._sleeping_until: float | None = None  # None: asleep until woken (nothing held)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"{name}-cancel-watch", daemon=True)
        self._thread.start()

    def pace(self, stage_s: float) -> None:
        """The table changed: an automatic interval follows its typical stage time (a fixed one stays)."""
        if self.auto:
            self.interval = auto_interval(stage_s)

    @property
    def ask_rate(self) -> float:
        """Asks a second allowed now: MAX_ASK_RATE, or fewer where asks take long (MAX_ASK_SHARE of the clock)."""
        return min(MAX_ASK_RATE, MAX_ASK_SHARE / max(self._rtt, 1e-7))

    # ------------------------------------------------------------------ scheduler thread (cheap: no round trip)
    def job_started(self, requests: Sequence[Any], expected_s: float) -> None:
        """A job of ``requests`` starts now and should take ``expected_s`` (latency table). Wakes the watcher only
        where it sleeps past the moment to ask them."""
        if not self.auto:
            return
        now = time.monotonic()
        self._jobs += 1
        job = (self._jobs, requests, now, max(expected_s, 1e-6))
        self._job = job
        until = self._sleeping_until
        if until is None or until > max(self._ask_at(job), self._next_allowed) + 1e-4:
            self._wake.set()

    def job_ended(self) -> None:
        """The job announced last ended: its time teaches the prediction, and it is asked no more."""
        job = self._job
        if job is not None and self.auto:
            self._ended = job[0]
            slip = (time.monotonic() - job[2]) / job[3]
            if job[0] != self._asked_job and slip < (1.0 - BOUNDARY_LEAD) * self.slip:
                # it ended before its sweep was due: the learned slip is stale (the first, slow runs after a load
                # taught it), so the next job is predicted from this one alone, not after half a window of them
                self._slips.clear()
            self._slips.append(slip)

    def held_changed(self) -> None:
        """A request was added: a watcher asleep for want of held requests starts sweeping again."""
        if self._sleeping_until is None:
            self._wake.set()

    # ------------------------------------------------------------------ any thread
    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    @property
    def slip(self) -> float:
        """How much longer than the table recent jobs took (the median ratio; 1 before any ended)."""
        slips = list(self._slips)
        return min(4.0, max(0.25, statistics.median(slips))) if slips else 1.0

    # ------------------------------------------------------------------ watcher thread
    def _ask_at(self, job: Job) -> float:
        """When to ask a job's requests: the answers must be in before its predicted end."""
        return max(job[2], job[2] + (1.0 - BOUNDARY_LEAD) * self.slip * job[3] - len(job[1]) * self._rtt)

    def _reask(self, job: Job) -> float:
        """How often a job still running past its predicted end is asked again."""
        return max(MIN_INTERVAL_S, BOUNDARY_LEAD * self.slip * job[3])

    def _due(self, now: float) -> float | None:
        """When the next sweep is due; None: nothing to ask until woken."""
        job = self._job
        if job is not None and job[0] != self._ended:  # a job runs
            # the periodic sweep stays as a floor: a prediction far off (the first, slow runs of every stage teach
            # a slip that later jobs no longer have) must not leave the running requests unasked for many stages
            periodic = self._last_sweep + self.interval
            if job[0] != self._asked_job:
                return max(min(self._ask_at(job), periodic), self._next_allowed)
            return max(min(self._asked_at + self._reask(job), periodic), self._next_allowed)
        if not any(True for p in list(self.held()) if not (p.answered or p.cancel_seen)):
            return None
        return max(self._last_sweep + self.interval, self._next_allowed)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sleeping_until = None  # before held() is read: an addition after the read wakes us
                now = time.monotonic()
                due = self._due(now)
                if due is None or due > now:
                    self._sleeping_until = due
                    self._wake.wait(None if due is None else due - now)
                    self._wake.clear()
                    continue
                self.sweep()
            except RuntimeError:  # held() changed while read (not in CPython, where the copy holds the GIL)
                time.sleep(MIN_INTERVAL_S)
            except Exception:  # pragma: no cover - a bug; keep watching
                traceback.print_exc()
                time.sleep(self.interval)

    def _running(self, now: float) -> tuple[Sequence[Any], float]:
        """The running job's requests this sweep asks first, and since when they must not have been asked."""
        job = self._job if self.auto else None
        if job is None or job[0] == self._ended:
            return (), now
        if job[0] != self._asked_job:
            if now >= self._ask_at(job) - 1e-4:  # its sweep before the boundary: all of them
                self._asked_job, self._asked_at = job[0], now
                return job[1], now
            # a sweep that came late for the job before (a loaded machine): catch up on those not asked since
            # this job started; its own sweep before its boundary still comes
            return job[1], job[2]
        if now >= self._asked_at + self._reask(job) - 1e-4:  # past its predicted end and still running: again
            self._asked_at = now
            return job[1], now
        return (), now

    def _order(self, held: list[Any], running: Sequence[Any], since: float, now: float) -> list[Any]:
        """Whom to ask, in order: the running job's requests not asked since ``since``, then the held ones not
        asked within the interval (auto: by an earlier sweep), in turn from where the last sweep stopped; at most
        ``budget``."""
        out: list[Any] = []
        gap = MIN_INTERVAL_S / 2 if self.auto else self.interval
        seen: set[int] = set()
        for r in running:
            p = self.parent_of(r)
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            if not (p.answered or p.cancel_seen) and p.checked < since:
                out.append(p)
                if len(out) >= self.budget:
                    return out
        if not held:
            return out
        start = self._cursor % len(held)
        for i in range(len(held)):
            if len(out) >= self.budget:
                self._cursor = start + i
                break
            p = held[(start + i) % len(held)]
            if id(p) in seen or p.answered or p.cancel_seen or now - p.checked < gap:
                continue
            out.append(p)
        else:
            self._cursor = start + len(held)
        return out

    def sweep(self) -> None:
        """Ask up to ``budget`` requests (see ``_order``); a copy of the held set, so the scheduler thread may change
        it meanwhile."""
        now = time.monotonic()
        running, since = self._running(now)
        held = list(self.held())
        self._last_sweep = now
        spent = 0.0
        asked = 0
        for parent in self._order(held, running, since, now):
            parent.checked = now
            with self.lock:
                if parent.answered:
                    continue
                self.checks += 1
                t0 = time.perf_counter()
                try:
                    gone = bool(self.is_cancelled(parent.handle))
                except Exception:  # the request went away under us: the scheduler answers it anyway
                    gone = False
                took = time.perf_counter() - t0
            spent += took
            asked += 1
            if gone:
                parent.cancel_seen = True
                for r in list(parent.samples):
                    r.cancelled = True
                self.on_cancel(parent)
        if asked:
            self.check_s += spent
            self._rtt += 0.2 * (spent / asked - self._rtt)
        # the share cap binds past capacity only (more held than one sweep asks): a few held requests are asked
        # at the full rate, so that their cancels are seen within a stage even while round trips are slow (the
        # first runs after a load)
        rate = self.ask_rate if len(held) > SWEEP_BUDGET else MAX_ASK_RATE
        self._tokens = min(float(SWEEP_BUDGET), self._tokens + (now - self._refilled) * rate) - asked
        self._refilled = now
        self._next_allowed = now + max(MIN_INTERVAL_S, -self._tokens / rate)
