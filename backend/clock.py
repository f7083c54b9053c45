"""The wall clock the backend's scheduler runs on (``batcher.interfaces.Clock``): monotonic time, and timers that
fire on the scheduler thread, between stages (``backend/inbox.py`` sleeps until the next one is due)."""

from __future__ import annotations

import heapq
import itertools
import time
from typing import Callable


class Timer:
    """A ``call_at`` timer; ``cancel`` leaves it in the heap, skipped when it comes up."""

    __slots__ = ("when", "callback", "cancelled")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class WallClock:
    """Monotonic time; timers fire on the scheduler thread, between stages."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return time.monotonic()

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        t = Timer(when, callback)
        heapq.heappush(self._heap, (when, next(self._seq), t))
        return t

    def next_due(self) -> float | None:
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def fire_due(self) -> None:
        now = time.monotonic()
        while self._heap and self._heap[0][0] <= now:
            _, _, t = heapq.heappop(self._heap)
            if not t.cancelled:
                t.callback()
