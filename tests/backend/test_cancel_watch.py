"""The cancel watcher's rule (backend/cancel_watch.py): when it asks whom, and what bounds its round trips.

No server: parents are the runtime's own ``Parent`` objects (backend/rows.py), ``is_cancelled`` a function that
records each ask.
"""

from __future__ import annotations

import threading
import time

import pytest

from lazybatch.backend import cancel_watch as cw
from lazybatch.backend.cancel_watch import CancelWatcher, auto_interval, typical_stage_s
from lazybatch.backend.rows import Parent, Sample
from lazybatch.batcher.request import Request


class Asks:
    """is_cancelled stand-in: records (monotonic time, handle) of every ask; ``gone`` handles answer True."""

    def __init__(self) -> None:
        self.log: list[tuple[float, int]] = []
        self.gone: set[int] = set()
        self.answers: list[tuple[int, bool]] = []  # (handle, what the ask answered), in order
        self.lock = threading.Lock()

    def __call__(self, handle: int) -> bool:
        with self.lock:
            self.log.append((time.monotonic(), handle))
            gone = handle in self.gone
            self.answers.append((handle, gone))
        return gone

    def handles(self) -> list[int]:
        with self.lock:
            return [h for _, h in self.log]


def _parents(n: int, first: int = 0) -> list[Parent]:
    out = []
    for h in range(first, first + n):
        p = Parent(h, {}, 1)
        p.samples.append(Request(h, 0.0, payload=Sample(p, 0)))
        out.append(p)
    return out


def test_auto_interval_is_one_stage_time_within_bounds():
    """auto: one (typical, batch-1) stage time, never below the floor that bounds wake-ups, never above the old
    fixed default."""
    assert auto_interval(0.004) == pytest.approx(0.004)
    assert auto_interval(1e-5) == cw.MIN_INTERVAL_S
    assert auto_interval(2.0) == cw.MAX_AUTO_INTERVAL_S == 0.05
    # the median over stages of the batch-1 column (rows are indexed by batch size, 0 unused)
    assert typical_stage_s([[0, 0.001, 0.002], [0, 0.009, 0.01], [0, 0.003, 0.005]]) == pytest.approx(0.003)


def test_running_requests_are_asked_just_before_their_stage_should_end():
    """A job announced to take 40 ms: its requests are asked once, in the last part of the stage (BOUNDARY_LEAD
    before the predicted end, less the round trips), not at its start; queued requests in the same sweep, after the
    running ones. Why: a cancel that comes during the stage is then seen before the boundary where compute stops."""
    asks = Asks()
    running, queued = _parents(2), _parents(2, first=10)
    held = running + queued
    w = CancelWatcher(lambda: held, asks, lambda p: None, interval=0.0, stage_s=0.2)
    try:
        time.sleep(0.01)
        t0 = time.monotonic()
        w.job_started([p.samples[0] for p in running], 0.040)
        time.sleep(0.036)  # the job ends just before its predicted end (a job still running then is asked again)
        t_end = time.monotonic() - t0
        w.job_ended()
        time.sleep(0.03)
        log = list(asks.log)
    finally:
        w.close()
    first = [(t - t0, h) for t, h in log if t >= t0]
    assert [h for _, h in first[:4]] == [0, 1, 10, 11], first  # running first, then the queue
    # not at the start: in the stage's last fifth, less the round trips (the upper bound allows a thread that
    # wakes up to 10 ms late on a loaded machine; what the test guards is the lower bound)
    assert 0.040 * (1 - cw.BOUNDARY_LEAD) - 0.004 <= first[0][0] <= 0.050, first
    # once for this job (the next sweep is a period of 0.2 s away) ... unless the 36 ms sleep overran the predicted
    # end, as it did once under a busy core: a job still running then is asked again every BOUNDARY_LEAD of its
    # time (8 ms), and only while it runs
    asks0 = [t for t, h in first if h == 0]
    reask = 0.040 * cw.BOUNDARY_LEAD
    for prev, t in zip(asks0, asks0[1:]):
        assert t - prev >= reask - 1e-3 and t <= t_end + 0.005, (asks0, t_end)
    if t_end < asks0[0] + reask - 1e-3:
        assert len(asks0) == 1, (asks0, t_end)


def test_a_cancel_seen_flags_the_samples_and_is_reported_once():
    asks = Asks()
    held = _parents(3)
    seen: list[int] = []
    w = CancelWatcher(lambda: held, asks, lambda p: seen.append(p.handle), interval=0.0, stage_s=0.002)
    try:
        asks.gone.add(1)
        w.held_changed()
        end = time.monotonic() + 2.0
        while not seen and time.monotonic() < end:
            time.sleep(0.002)
        time.sleep(0.02)
    finally:
        w.close()
    assert seen == [1]
    assert held[1].cancel_seen and held[1].samples[0].cancelled and not held[0].samples[0].cancelled
    # asked until it answered "cancelled" (the watcher may have asked before the cancel), never after
    ones = [gone for h, gone in asks.answers if h == 1]
    assert ones[-1] and ones.count(True) == 1, ones


def test_running_first_within_the_sweep_budget():
    """More running requests than the budget: a sweep asks only running ones, ``budget`` of them."""
    asks = Asks()
    running, queued = _parents(20), _parents(10, first=100)
    held = running + queued
    w = CancelWatcher(lambda: held, asks, lambda p: None, interval=0.0, stage_s=10.0)
    try:
        w._job = (1, [p.samples[0] for p in running], time.monotonic() - 1.0, time.monotonic())
        w.sweep()
    finally:
        w.close()
    assert asks.handles()[:cw.SWEEP_BUDGET] == list(range(cw.SWEEP_BUDGET))


def test_round_trips_stay_within_the_rate_bound_under_overload():
    """A thousand held requests and a job every millisecond (what a model of tiny stages past capacity looks like):
    the watcher still makes at most MAX_ASK_RATE round trips a second (plus one budget of burst) and sweeps at most
    every MIN_INTERVAL_S. The fixed 50 ms rule allowed 320 a second; the overload run that crashed tritonserver
    made ~20,000."""
    asks = Asks()
    held = _parents(1000)
    w = CancelWatcher(lambda: held, asks, lambda p: None, interval=0.0, stage_s=0.0005)
    stop = time.monotonic() + 0.5
    t0 = time.monotonic()
    try:
        k = 0
        while time.monotonic() < stop:
            batch = held[(8 * k) % 1000:(8 * k) % 1000 + 8]
            w.job_started([p.samples[0] for p in batch], 0.001)
            k += 1
            time.sleep(0.001)
    finally:
        w.close()
    took = time.monotonic() - t0
    n = sum(1 for t, _ in asks.log if t >= t0)
    assert n <= cw.MAX_ASK_RATE * took + 2 * cw.SWEEP_BUDGET, (n, took)
    assert n >= 0.3 * cw.MAX_ASK_RATE * took, "the watcher stopped asking"


def test_nothing_held_no_wake_ups_until_a_request_arrives():
    """An idle model costs nothing: with nothing held the watcher sleeps until a request is added."""
    asks = Asks()
    held: list[Parent] = []
    sweeps = []
    w = CancelWatcher(lambda: held, asks, lambda p: None, interval=0.0, stage_s=0.001)
    real = w.sweep
    w.sweep = lambda: (sweeps.append(1), real())  # type: ignore[method-assign]
    try:
        time.sleep(0.1)
        assert not sweeps
        held.extend(_parents(1))
        w.held_changed()
        end = time.monotonic() + 1.0
        while not asks.log and time.monotonic() < end:
            time.sleep(0.002)
    finally:
        w.close()
    assert asks.handles()[:1] == [0]


def test_fixed_interval_keeps_the_rule_before_issue_19():
    """cancel_poll_ms: <ms> asks each held request at most once per interval and ignores job announcements."""
    asks = Asks()
    held = _parents(2)
    w = CancelWatcher(lambda: held, asks, lambda p: None, interval=0.05)
    try:
        assert not w.auto and w.interval == 0.05
        for _ in range(10):
            w.job_started([held[0].samples[0]], 0.001)
            time.sleep(0.012)
    finally:
        w.close()
    # 120 ms at one sweep per 50 ms: two or three sweeps, whatever the jobs
    assert 2 <= asks.handles().count(0) <= 3, asks.log


def test_a_prediction_far_off_still_asks_running_requests_every_period():
    """Jobs predicted to take ten times longer than the stage period (as after a slow warm-up, whose slip the
    watcher learned): the periodic sweep still asks the running requests about once a period, instead of waiting
    for the predicted end. Before this floor a real server answered a cancel 6 stages late (test_cancel.py)."""
    asks = Asks()
    running = _parents(2)
    held = list(running)
    w = CancelWatcher(lambda: held, asks, lambda p: None, interval=0.0, stage_s=0.010)
    try:
        t0 = time.monotonic()
        for _ in range(10):  # ten 10 ms jobs, each announced as 100 ms long
            w.job_started([p.samples[0] for p in running], 0.100)
            time.sleep(0.010)
            w.job_ended()
    finally:
        w.close()
    asked = [t - t0 for t, h in asks.log if h == 0 and t >= t0]
    # ~10 asks in 100 ms (one per period); without the floor none (each job ends before its predicted end)
    assert len(asked) >= 4, asked
    assert max(b - a for a, b in zip([0.0] + asked, asked + [0.1])) < 0.045, asked
