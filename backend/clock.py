"""The wall clock the backend's scheduler core runs on (``batcher.interfaces.Clock``): monotonic time, and the one
instant the core asked to be stepped again at (``Step.wake_at``, a batching window's end), which the scheduler
thread sleeps until (``backend/scheduler_loop.py``)."""

from __future__ import annotations

import time


class WallClock:
    """Monotonic time, and the core's batching window."""

    __slots__ = ("wake_at",)

    def __init__(self) -> None:
        self.wake_at: float | None = None  # when the core asked to decide again; None: at the next input

    def now(self) -> float:
        return time.monotonic()

    def due(self) -> bool:
        """Whether the window has ended (it is then forgotten: the core is told through ``Scheduler.woke``)."""
        if self.wake_at is not None and self.wake_at <= time.monotonic():
            self.wake_at = None
            return True
        return False
