"""The shared device's starvation guarantee (batcher/device.py): whenever member i is granted the device while
member j waits, vt_i <= vt_j + lag (vt: device time / weight). A hot model at 5x its share, of a more urgent
priority level (so that it would win every decision without the bound), cannot keep a cold one off the device
beyond that bound: while both are backlogged each gets its weighted share within lag plus one job."""

from __future__ import annotations

import math

from lazybatch.batcher.device import WAITING, SharedDevice
from lazybatch.simulator.colocated import ColocatedSimulation

from tests.colocation_helpers import linear_table, periodic, tenant

LAG = 0.02
UNIT = 1e-3  # each model's stage, batch 1; batching buys nothing (linear tables), so the policy runs one at a time


class CheckedDevice(SharedDevice):
    """Asserts the guarantee at every grant, and records each member's longest wait."""

    grants_checked = 0

    def _choose(self):
        waiting = [m for m in self.members if m.state == WAITING]
        winner = super()._choose()
        if winner is not None:
            vmin = min(m.vt for m in waiting)
            assert winner.vt <= vmin + self.lag + 1e-12, (winner, [(m.name, m.vt) for m in waiting])
            self.grants_checked += 1
        return winner


def _run(lag: float, hot_weight: float = 1.0):
    hot_table, cold_table = linear_table(2, UNIT, "hot"), linear_table(2, UNIT, "cold")
    # hot: 2.5x the device (5x its equal share), priority 0; cold: 60% of the device (over its share), priority 1
    hot = tenant("hot", hot_table, periodic(1250, 0.8e-3, 0.1), "eager:max_batch_size=1", weight=hot_weight)
    cold = tenant("cold", cold_table, periodic(300, 3.33e-3, 0.1), "eager:max_batch_size=1", priority=1)
    device = CheckedDevice(lag=lag)
    window = 0.99  # both are backlogged until the hot arrivals end (1 s)
    used = {"hot": 0.0, "cold": 0.0}

    def on_job(now, model, job):  # a job may span stages (batcher/device.py, rule 3): batch 1, UNIT per stage
        if now < window:
            used[("hot", "cold")[model]] += min(UNIT * (job.stop - job.stage), window - now)

    sim = ColocatedSimulation([hot, cold], device=device, on_job=on_job)
    sim.run()
    return sim, device, used, window


def test_a_hot_model_cannot_starve_a_cold_one():
    sim, device, used, window = _run(LAG)
    assert device.grants_checked > 1000
    share = used["cold"] / (used["hot"] + used["cold"])
    # equal weights: half the device each while both wait, within (lag + one job) over the window
    assert abs(share - 0.5) <= (LAG + 2 * UNIT) / window
    cold = {s["model"]: s for s in device.stats()}["cold"]
    # a member that waits is granted once the other has run lag (+ one job of each) beyond it
    assert cold["wait_max_s"] <= 2 * LAG + 3 * UNIT + 1e-9
    assert all(r.status is not None for t in sim.tenants for r in t.requests)


def test_without_the_bound_the_hot_model_starves_the_cold_one():
    """The same run with an unbounded lag: the more urgent level holds the cold model off the device for as long
    as the hot one is backlogged: the bound is what protects it."""
    sim, device, used, window = _run(math.inf)
    cold = {s["model"]: s for s in device.stats()}["cold"]
    assert cold["wait_max_s"] > 0.5 and used["cold"] < 0.05 * window


def test_weights_set_the_shares():
    sim, device, used, window = _run(LAG, hot_weight=3.0)
    share = used["hot"] / (used["hot"] + used["cold"])
    assert abs(share - 0.75) <= (3 * LAG + 2 * UNIT) / window
