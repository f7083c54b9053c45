"""BatchMonitor / BatchDispatcher (seed 002): the monitor's choice, the dispatcher under a step change, the guard."""

from __future__ import annotations

import pytest

from lazybatch.batcher import (BatchLatencyModel, BatchMonitor, LatencyTable, MaxBatchUnderDeadline, ModelGraph,
                               Request, parse_policy)
from lazybatch.batcher.policies import preferred_batch_size
from lazybatch.simulator.engine import Simulation


def linear_table(a: float = 0.010, c: float = 0.002) -> LatencyTable:
    """One stage taking a + c*b seconds at batch size b: the regression fits it exactly."""
    sizes = list(range(1, 65))
    return LatencyTable(ModelGraph("lin", ["whole"]), sizes, [[a + c * b for b in sizes]])


def test_regression_fits_the_table_and_learns_online():
    m = BatchLatencyModel.from_table(linear_table())
    assert m.intercept == pytest.approx(0.010) and m.slope == pytest.approx(0.002)
    for _ in range(300):  # the device turns out twice as slow
        m.observe(8, 2 * (0.010 + 0.002 * 8))
        m.observe(32, 2 * (0.010 + 0.002 * 32))
    assert m.predict(8) == pytest.approx(2 * 0.026, rel=0.02)
    assert m.predict(32) == pytest.approx(2 * 0.074, rel=0.02)


@pytest.mark.parametrize("rate, expected", [
    (0.0, 1), (5.0, 1),  # 1 / T_1 = 1 / 12 ms = 83 requests/s already exceeds 5 requests/s
    (100.0, 2),  # 1/0.012 = 83 < 100; 2/0.014 = 143 > 100
    (400.0, 21),  # b / (0.01 + 0.002 b) > 400  <=>  b > 20
    (600.0, 64),  # above the asymptote 1/0.002 = 500 requests/s: the maximum
])
def test_monitor_choice_on_hand_computed_cases(rate, expected):
    assert preferred_batch_size(rate, BatchLatencyModel.from_table(linear_table()), 64) == expected


def test_dispatcher_follows_a_step_change_of_rate():
    """5 requests/s for 3 s, then 400 requests/s for 3 s: batches of 1, then of at least 21 after one window."""
    reqs, t, i = [], 0.0, 0
    while t < 3.0:
        reqs.append(Request(i, t, sla=1.0))
        t += 0.2
        i += 1
    t = 3.0
    while t < 6.0:
        reqs.append(Request(i, t, sla=1.0))
        t += 1 / 400
        i += 1
    policy = BatchMonitor(64, window=1.0, rate_sigma=0.0)  # Algorithm 1's raw count
    starts: list[tuple[float, int]] = []
    sim = Simulation(linear_table(), policy, on_job=lambda now, job: starts.append((now, job.batch_size)))
    sim.run(reqs)
    assert all(r.status.name == "OK" for r in reqs)
    assert [p for _, _, p in policy.history[:3]] == [1, 1, 1]  # windows ending at 1, 2, 3 s: 5 requests/s
    assert max(b for t0, b in starts if t0 < 3.0) == 1
    # the window ending at 4 s saw ~400 requests/s: from then on batches of the preferred size (20 or 21: the
    # rate measured in a 1 s window is 399..401) or more
    at4 = [(r, p) for a, r, p in policy.history if round(a, 6) == 4.0]
    assert at4 and abs(at4[0][0] - 400) <= 2 and at4[0][1] in (20, 21)
    later = [b for t0, b in starts if 4.1 < t0 < 5.9]
    assert later and min(later) >= 20
    # before the monitor noticed (3..4 s), batch size 1 could not keep up: the backlog went out in bigger batches
    assert max(b for t0, b in starts if 3.0 <= t0 < 4.0) > 1


@pytest.mark.parametrize("sla, release, reason", [
    (1.0, 0.010 + 0.002 * 16, "fill timeout"),  # the oldest waited T(16), the preferred batch's own time
    (0.03, 0.03 - 1.1 * (0.010 + 0.002 * 2), "deadline guard"),  # its deadline allows no more waiting
])
def test_preferred_size_is_a_hint_never_a_prerequisite(sla, release, reason):
    """The last window chose 16, but only two requests come: they go without the other fourteen."""
    policy = BatchMonitor(64, window=10.0)
    starts = []
    sim = Simulation(linear_table(), policy, on_job=lambda now, job: starts.append((now, len(job.requests))))
    policy.pbs = 16  # as if the previous window had seen a burst
    reqs = [Request(0, 0.0, sla=sla), Request(1, 0.005, sla=sla)]
    sim.run(reqs)
    assert starts == [(pytest.approx(release), 2)]
    assert all(r.finish <= r.deadline for r in reqs)
    assert reason in sim.scheduler.log.of("dispatch")[0].reason


def test_max_batch_under_deadline_waits_until_the_edge():
    reqs = [Request(0, 0.0, sla=0.1), Request(1, 0.01, sla=0.1)]
    sim = Simulation(linear_table(), MaxBatchUnderDeadline(64))
    starts = []
    sim.on_job = lambda now, job: starts.append((now, job.batch_size))
    sim.run(reqs)
    # it waits until deadline - 1.1 * T(2): 0.1 - 1.1 * 0.014 = 0.0846 s, then both go together
    assert starts == [(pytest.approx(0.1 - 1.1 * 0.014), 2)]
    assert all(r.finish <= r.deadline for r in reqs)


def test_specs_and_labels():
    assert parse_policy("monitor:window_ms=500").build().window == 0.5
    assert parse_policy("monitor").label == "BatchMonitor" and parse_policy("adhoc").label == "AdHoc"
    assert parse_policy("deadline").label == "MaxBatchDeadline"
    assert parse_policy("adhoc").build().max_queue_delay == 0.0
    with pytest.raises(Exception, match="window must be a positive"):
        parse_policy("monitor:window_ms=0").build()
    assert parse_policy("monitor:rate_sigma=0").build().rate_sigma == 0.0
    assert parse_policy("monitor").build().rate_sigma == 1.0
    assert parse_policy("monitor:rate_sigma=2").label == "BatchMonitor(sigma2)"
    with pytest.raises(Exception, match="rate_sigma must be a number >= 0"):
        parse_policy("monitor:rate_sigma=-1").build()


@pytest.mark.parametrize("sigma, count, expected", [
    (0.0, 400, 21),  # the raw count: b / (0.01 + 0.002 b) > 400  <=>  b > 20
    (1.0, 400, 16),  # 400 - sqrt(400) = 380: b > 380 * 0.01 / (1 - 0.76) = 15.8
    (0.0, 100, 2),  # 1 / 0.012 = 83 < 100 <= 2 / 0.014 = 143
    (1.0, 100, 2),  # 100 - 10 = 90 is still above 83
    (2.0, 100, 1),  # 100 - 20 = 80 < 83: one at a time keeps up
])
def test_monitor_plans_for_the_rate_its_count_supports(sigma, count, expected):
    policy = BatchMonitor(64, window=1.0, rate_sigma=sigma)
    Simulation(linear_table(), policy)  # attaches: the regression comes from the table
    policy._close_window(1.0, float(count))
    assert policy.pbs == expected and policy.history[-1] == (1.0, float(count), expected)


def test_one_arrival_per_window_at_about_the_service_rate_is_not_batched():
    """A model served at about 1 request/s (VGG-19 on 2 CPU cores): windows of 1 s count 0, 1 or 2 arrivals. The
    raw count reads one arrival as 1 request/s > 1 / T_1 and makes the dispatcher wait for a second request; the
    supported rate does not."""
    table = linear_table(a=0.2, c=0.9)  # T_1 = 1.1 s: 0.91 requests/s at batch 1, 1.0 at batch 2, 1.09 at 64
    arrivals = [0.5, 1.5, 6.0, 7.0]  # 0.6 requests/s, but twice one arrival in consecutive windows
    idle_waits = {}  # time a request waited while the device was free
    for sigma in (0.0, 1.0):
        policy = BatchMonitor(64, window=1.0, rate_sigma=sigma)
        starts: list[tuple[float, int]] = []
        sim = Simulation(table, policy, on_job=lambda now, job: starts.append((now, len(job.requests))))
        reqs = [Request(i, t, sla=100.0) for i, t in enumerate(arrivals)]
        sim.run(reqs)
        assert all(r.status.name == "OK" for r in reqs)
        assert [n for _, n in starts] == [1, 1, 1, 1]
        free = 0.0
        idle_waits[sigma] = 0.0
        for (t0, _), arrival in zip(starts, arrivals):
            idle_waits[sigma] += t0 - max(arrival, free)
            free = t0 + 1.1
        if sigma == 1.0:
            assert {p for _, _, p in policy.history} == {1}
    assert idle_waits[1.0] == pytest.approx(0.0, abs=1e-9)
    assert idle_waits[0.0] > 1.0  # the raw count held requests back for a batch of 3 that never filled


class _JitteryDevice(Simulation):
    """What a real server adds to the latency table: timers that fire up to 10 ms late and jobs that take up to
    30% longer than the table says (docs/monitor.md: MaxBatchDeadline missed 9-43% of its deadlines there)."""

    def __init__(self, *args, seed: int = 0, **kw) -> None:
        super().__init__(*args, **kw)
        import numpy as np

        self.rng = np.random.default_rng(seed)

    def wake_time(self, when):
        return when + self.rng.uniform(0, 0.010)

    def run_time(self, job, table_s):
        return table_s * self.rng.uniform(1.0, 1.3)


@pytest.mark.parametrize("rate", [50, 100, 200])
def test_deadline_guard_learns_the_slip_of_a_real_device(rate):
    """Planning for exact predictions misses deadlines on a jittery device; the guard that plans as much earlier
    as recent batches slipped (95th percentile of the last 64) keeps them, and waits less on average too."""
    import numpy as np

    def run(learn: bool) -> tuple[float, float]:
        t = np.cumsum(np.random.default_rng(1).exponential(1 / rate, rate * 20))
        reqs = [Request(i, float(a), sla=0.1) for i, a in enumerate(t)]
        policy = MaxBatchUnderDeadline(64)
        policy.learn_slip = learn
        _JitteryDevice(linear_table(), policy).run(reqs)
        return (sum(r.finish > r.deadline for r in reqs) / len(reqs),
                float(np.mean([r.finish - r.arrival for r in reqs])))

    late_seed, avg_seed = run(False)
    late, avg = run(True)
    assert late_seed > 0.05, late_seed  # the seed's guard on this device
    assert late <= 0.01, late
    assert avg <= avg_seed
