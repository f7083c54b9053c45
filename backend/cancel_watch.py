"""Client cancellation, watched off the scheduler thread.

``request.is_cancelled()`` in the Python backend is a round trip to the Triton process. Asked by the scheduler
thread for every held request at every stage boundary, it cost more than an MLP stage (issue: 2 ms polls, a round
trip per held request per stage). The watcher asks instead, on a thread of its own, each held request at most once
per ``interval``; the scheduler thread only reads the flags it sets (``Request.cancelled``, read at the next stage
boundary: a cancelled request's compute stops there) and answers a cancelled request at once when woken.
"""

from __future__ import annotations

import threading
import time
import traceback
from typing import Any, Callable, Iterable

MIN_INTERVAL_S = 0.002  # a watcher asked to poll "continuously" (tests) still yields the core between sweeps
# Requests asked per sweep, in turn. Each ask is a message to the Triton process: asking every held request every
# sweep (a thousand held past capacity, twenty sweeps a second) drove tritonserver to 11 GB and a heap-corruption
# abort in an overload run (MobileNet at 300% load); the scheduler thread's bounded polling of earlier versions,
# 16 per poll, never did.
SWEEP_BUDGET = 16


class CancelWatcher:
    """Sweeps ``held()`` every ``interval`` seconds and calls ``on_cancel(parent)`` for each one ``is_cancelled``
    reports gone (once per parent)."""

    def __init__(self, held: Callable[[], Iterable[Any]], is_cancelled: Callable[[Any], bool],
                 on_cancel: Callable[[Any], None], interval: float, name: str = "lazybatch",
                 lock: threading.Lock | None = None) -> None:
        self.held = held
        # Held while a request is asked; whoever answers a request sets ``answered`` under it. Asking a request
        # whose final response was sent is a use-after-free in the server (seen: tritonserver crashed with
        # SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled), so a request is asked only while unanswered.
        self.lock = lock or threading.Lock()
        self.is_cancelled = is_cancelled
        self.on_cancel = on_cancel
        self.interval = max(MIN_INTERVAL_S, interval)
        self.checks = 0  # is_cancelled() calls made (statistics, tests)
        self.budget = SWEEP_BUDGET
        self._cursor = 0  # where the next sweep starts among the held requests (round robin)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"{name}-cancel-watch", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sweep()
            except Exception:  # pragma: no cover - a bug; keep watching
                traceback.print_exc()

    def sweep(self) -> None:
        """Ask up to ``budget`` held requests not asked within the interval, in turn from where the last sweep
        stopped; a copy of the held set, so the scheduler thread may change it meanwhile."""
        now = time.monotonic()
        try:
            held = list(self.held())
        except RuntimeError:  # changed while copied (not in CPython, where the copy holds the GIL): next sweep
            return
        if not held:
            return
        start = self._cursor % len(held)
        asked = 0
        for i in range(len(held)):
            if asked >= self.budget:
                self._cursor = start + i
                break
            parent = held[(start + i) % len(held)]
            if parent.answered or parent.cancel_seen or now - parent.checked < self.interval:
                continue
            asked += 1
            parent.checked = now
            with self.lock:
                if parent.answered:
                    continue
                self.checks += 1
                try:
                    gone = bool(self.is_cancelled(parent.handle))
                except Exception:  # the request went away under us: the scheduler answers it anyway
                    gone = False
            if gone:
                parent.cancel_seen = True
                for r in list(parent.samples):
                    r.cancelled = True
                self.on_cancel(parent)
