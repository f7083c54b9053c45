"""The arrival-rate estimate eager's rules read: arrivals per second, arrivals per second of busy time (what a stage
boundary can serve), and how busy the device was, over a window of a few dozen whole passes."""

from __future__ import annotations

import math
from collections import deque

# The arrival rate is the count of arrivals in the last RATE_WINDOW_PASSES batch-1 passes of the whole graph (at
# least RATE_WINDOW_MIN_S): long enough to hold a few arrivals at 10% load, short enough to follow a load change
# within a fraction of a second.
RATE_WINDOW_PASSES = 64
RATE_WINDOW_MIN_S = 0.05
RATE_MIN_PASSES = 8
# Requests handed to an inline pass (backend/inline.py) carry no arrival time; those handed over this soon after the
# previous pass ended queued while it ran (Triton calls execute again at once when requests wait). Short, so that
# an idle-time arrival is rarely taken for a busy-time one: an underestimate only keeps passes whole, as Triton's.
BACK_TO_BACK_S = 0.0005


class ArrivalRates:
    """Arrivals and busy time in a sliding window (``window`` seconds); the rates divide by at least ``floor``."""

    def __init__(self) -> None:
        self.arrivals: deque[float] = deque()
        self.first: float | None = None  # the first arrival seen
        self.busy_arrivals: deque[float] = deque()  # arrivals while a job ran
        # the ends and durations of recent jobs, as floats apart: a float is no object the garbage collector tracks,
        # a tuple kept for the window is, and two of those a request made the default's stub collect (a pause of
        # tens of ms on a 1 ms model's queue) where Triton's batcher never did
        self.busy_end: deque[float] = deque()
        self.busy_len: deque[float] = deque()
        self.busy_s = 0.0
        self.window = RATE_WINDOW_MIN_S
        self.floor = math.inf  # the least time the rates divide by (table_changed: a few whole passes)
        self.last_end: float | None = None  # when the device last fell idle (inline passes, BACK_TO_BACK_S)

    def table_changed(self, whole_1: float) -> None:
        """The window and floor from the table's batch-1 pass of the whole graph."""
        self.window = max(RATE_WINDOW_MIN_S, RATE_WINDOW_PASSES * whole_1)
        self.floor = RATE_MIN_PASSES * whole_1

    def arrived(self, now: float, busy: bool) -> None:
        """A request reached the scheduler (``busy``: while it held work)."""
        self.arrivals.append(now)
        if self.first is None:
            self.first = now
        if busy:
            self.busy_arrivals.append(now)

    def job_ran(self, end: float, duration: float) -> None:
        self.busy_end.append(end)
        self.busy_len.append(duration)
        self.busy_s += duration
        self.last_end = end

    def inline_ran(self, start: float, end: float, n: int) -> None:
        """An inline pass of ``n`` requests (handed over at ``start``, no arrival times of their own) ran."""
        if n == 1:  # the common case, kept short: it runs on the request's path
            self.arrivals.append(start)
        else:
            self.arrivals.extend([start] * n)
        last_end = self.last_end
        if last_end is None:
            if self.first is None:
                self.first = start
        elif start - last_end <= BACK_TO_BACK_S:
            self.busy_arrivals.extend([start] * n)
        self.busy_end.append(end)
        self.busy_len.append(end - start)
        self.busy_s += end - start
        self.last_end = end

    def busy_rate(self, now: float) -> float:
        """Arrivals per second of busy time: the rate at which requests turn up while a pass runs, which is what
        a stage boundary can serve. Open-loop traffic arrives as often busy as idle; a closed-loop client (the next
        request after the previous answer) never arrives mid-pass, and boundaries would only cost."""
        edge = now - self.window
        ends, lens = self.busy_end, self.busy_len
        while ends and ends[0] < edge:
            ends.popleft()
            self.busy_s -= lens.popleft()
        a = self.arrivals  # trimmed here too: where every request runs inline, rate() is never asked
        while a and a[0] < edge:
            a.popleft()
        a = self.busy_arrivals
        while a and a[0] < edge:
            a.popleft()
        return len(a) / max(self.busy_s, self.floor)

    def busy_fraction(self, now: float) -> float:
        """The share of the recent window the device was busy (jobs and inline passes)."""
        if self.first is None:
            return 0.0
        self.busy_rate(now)  # drops what left the window
        span = max(min(self.window, now - self.first), self.floor)
        return self.busy_s / span

    def rate(self, now: float) -> float:
        """Arrivals per second (samples) over the recent window."""
        a = self.arrivals
        edge = now - self.window
        while a and a[0] < edge:
            a.popleft()
        if self.first is None:
            return 0.0
        # over the time observed so far until a whole window has passed (a cold start must not read as low load),
        # but never over less than a few passes (two arrivals a microsecond apart are not a million per second)
        span = max(min(self.window, now - self.first), self.floor)
        return len(a) / span
