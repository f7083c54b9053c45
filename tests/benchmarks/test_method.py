"""The measurement method's rules (benchmarks/harness/method.py): the noise floor's band, the p99's request count,
the machine's busy time from the real /proc/stat."""

from __future__ import annotations

import math
import os
import time

from benchmarks.harness.method import (MIN_P99_REQUESTS, STEAL_MAX, busy_between, cpu_times, floor_note,
                                       floor_reaches, floor_settled, floor_verdict, p99_note, segments_for,
                                       steal_between, stolen,
                                       while_ours)


def test_a_cell_is_settled_only_where_every_copy_lies_in_the_band():
    assert floor_settled([0.95, 1.04, 1.10])
    assert not floor_settled([0.95, 1.11]) and not floor_settled([0.89]) and not floor_settled([])
    assert not floor_settled([1.0, math.nan])
    assert floor_note([0.84, 1.2]) == "no verdict: the noise floor read 0.84-1.20, outside 0.90-1.10 (run longer)"


def test_a_verdict_stands_only_where_the_copy_stays_clear_of_the_figure():
    """The quickstart at 3292fa4: lazybatch 0.90-0.94 against Triton 0 ms, its identical copy 0.90-1.00 (settled):
    chance gave a copy of the baseline as much, so "behind" is no result."""
    assert floor_reaches([0.90, 0.94, 0.91], [0.90, 1.00, 0.97])
    assert floor_verdict([0.90, 0.94, 0.91], [0.90, 1.00, 0.97], True) == (
        "no verdict: the noise floor read 0.90-1.00, reaching the figure's 0.90-0.94 (run longer)")
    # clear of it, on either side: the verdict stands
    assert not floor_reaches([0.92, 0.93], [0.95, 1.07]) and floor_verdict([0.92, 0.93], [0.95, 1.07], True) is None
    assert not floor_reaches([1.12, 1.2], [0.95, 1.07]) and floor_verdict([1.12, 1.2], [0.95, 1.07], True) is None
    # a tie stays a tie whatever the copy read; an unsettled floor gives no verdict at all
    assert floor_verdict([0.95, 1.05], [0.96, 1.0], False) is None
    assert floor_verdict([0.5, 0.6], [0.85, 1.0], True) == floor_note([0.85, 1.0])
    assert not floor_reaches([], [1.0]) and not floor_reaches([1.0], [])


def test_a_p99_on_too_few_requests_says_so():
    assert p99_note(1500) == "1,500"
    assert p99_note(999) == "999 (< 1,000: p99 unresolved)"


def test_busy_time_of_the_machine_from_proc_stat():
    before = cpu_times()
    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:  # one core spinning: at least a share of the machine busy
        pass
    after = cpu_times()
    busy = busy_between(before, after)
    assert after[1] > before[1] and 0.5 / (os.cpu_count() or 1) <= busy <= 1.0  # one core of them, at least half the time
    assert math.isnan(busy_between(after, after))


def test_steal_is_read_from_proc_stat_and_a_stolen_segment_is_named():
    before = cpu_times()
    time.sleep(0.05)
    after = cpu_times()
    steal = steal_between(before, after)
    assert len(after) == 3 and 0.0 <= steal <= 1.0
    assert math.isnan(steal_between(after, after))
    # (busy, total, steal) jiffies: 30 of 1000 stolen is over the bound, 10 is not
    assert stolen(steal_between((0, 0, 0), (500, 1000, 30))) and not stolen(steal_between((0, 0, 0), (500, 1000, 10)))
    assert STEAL_MAX == 0.02 and not stolen(math.nan)


def test_segments_are_fixed_before_the_run_to_reach_the_p99_floor():
    # 460 requests/s in 2 s segments over 3 repetitions: the minimum already holds over 1,000 requests
    assert segments_for(460.0, 2.0, 3, minimum=6) == 6
    # 10/s: 1,000 requests over 3 repetitions need 17 segments of 2 s each
    n = segments_for(10.0, 2.0, 3, minimum=6)
    assert n == 17 and n * 2.0 * 10.0 * 3 >= MIN_P99_REQUESTS


def test_a_measurement_is_taken_again_while_the_hypervisor_steals():
    # (busy, total, steal) readings: the first try loses 100 of 1000 jiffies to steal, the second 5
    readings = iter([(0, 0, 0), (500, 1000, 100), (500, 1000, 100), (900, 2000, 105)])
    tries, pauses = [], []
    value, turn = while_ours(lambda: tries.append(1) or len(tries), read=lambda: next(readings), pause=pauses.append)
    assert value == 2 and turn.retried == 1 and not turn.stolen and len(pauses) == 1
    assert math.isclose(turn.steal, 0.005) and math.isclose(turn.busy, 0.4)
