"""Counts the answers still owed to one ``execute`` call (``batch_per_execute``): the call returns once every
request of Triton's batch was answered, as a model with its own decode loop under Triton's batcher does."""

from __future__ import annotations

import threading


class Latch:
    def __init__(self, n: int) -> None:
        self._left = n
        self._cond = threading.Condition()

    def count_down(self) -> None:
        with self._cond:
            self._left -= 1
            if self._left <= 0:
                self._cond.notify_all()

    def wait(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._left <= 0)
