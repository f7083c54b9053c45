"""The parts the default policy holds (batcher/policies/eager/), one at a time: the arrival-rate estimate, the
work-conserving base, the preemption rule, urgency classes and the decoder admission. The policy's behaviour as a
whole is in tests/batcher/test_eager.py, test_urgency.py, test_decode_admission.py and test_preempt_benefit.py."""

from __future__ import annotations

import math

import pytest

from lazybatch.batcher.graph import ModelGraph, StageType
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.policies.eager import (BACK_TO_BACK_S, RATE_MIN_PASSES, RATE_WINDOW_MIN_S, ArrivalRates,
                                              DecoderAdmission, EagerBatching, PreemptionRule, UrgencyRule,
                                              WorkConserving)
from lazybatch.batcher.policies.lazy import Entry
from lazybatch.batcher.request import Request
from lazybatch.batcher.lengths import LengthHistogram
from lazybatch.formats.histograms import shipped_histogram
from lazybatch.simulator import paper_tables
from lazybatch.simulator.engine import Simulation

MS = 1e-3
SIZES = [1, 2, 4, 8]


def table(per_sample: float, n: int = 8) -> LatencyTable:
    g = ModelGraph("t", [(f"s{i}", StageType.STATIC) for i in range(n)])
    return LatencyTable(g, SIZES, [[(1 + per_sample * (b - 1)) * MS for b in SIZES] for _ in range(n)])


def attached(tab: LatencyTable, **kw) -> EagerBatching:
    pol = EagerBatching(max_batch_size=8, **kw)
    Simulation(tab, pol)
    return pol


def test_the_policy_holds_one_of_each_part_and_a_decoder_admission_only_for_loops():
    static = attached(table(0.0))
    assert isinstance(static.rates, ArrivalRates) and isinstance(static.idle, WorkConserving)
    assert isinstance(static.preemption, PreemptionRule) and isinstance(static.urgent, UrgencyRule)
    assert static.decoder is None and static.whole[1] == pytest.approx(8 * MS)
    loops = attached(paper_tables.gnmt(), length_histogram=LengthHistogram.load(shipped_histogram()))
    assert isinstance(loops.decoder, DecoderAdmission) and loops.decoder.curves is not None
    assert "admission=curves" in loops.describe() and "admission" not in static.describe()


def test_rates_window_and_floor_follow_the_table():
    rates = ArrivalRates()
    rates.table_changed(8 * MS)
    assert rates.window == max(RATE_WINDOW_MIN_S, 64 * 8 * MS) and rates.floor == RATE_MIN_PASSES * 8 * MS
    assert rates.rate(0.0) == 0.0 and rates.busy_fraction(0.0) == 0.0  # nothing seen yet
    rates.arrived(0.0, busy=False)
    rates.arrived(0.001, busy=True)
    assert len(rates.arrivals) == 2 and list(rates.busy_arrivals) == [0.001]
    rates.job_ran(0.010, 0.010)
    assert rates.busy_rate(0.010) == pytest.approx(1 / 0.064)  # one busy arrival over the floor (8 passes)
    rates.inline_ran(0.010 + BACK_TO_BACK_S / 2, 0.020, 3)  # handed over back to back: queued while busy
    assert len(rates.busy_arrivals) == 4 and rates.last_end == 0.020
    rates.inline_ran(0.5, 0.51, 2)  # long after: idle-time arrivals
    assert len(rates.busy_arrivals) == 4 and len(rates.arrivals) == 7


def test_rates_keep_only_their_window_where_every_request_runs_inline():
    """Where every request runs inline, nothing asks rate() (the scheduler's question): the arrivals are trimmed
    by busy_rate (inline_batch's) all the same, so that a stub serving for days holds a window, not every arrival."""
    rates = ArrivalRates()
    rates.table_changed(1 * MS)  # a window of 64 ms
    t = 0.0
    for i in range(20_000):  # 20 s of passes of 1 ms, one request each, back to back
        rates.inline_ran(t, t + MS, 1)
        t += MS
        if i % 2 == 0:
            rates.busy_rate(t)
    window = rates.window / MS
    kept = (len(rates.arrivals), len(rates.busy_arrivals), len(rates.busy_end))
    assert max(kept) <= window + 2, kept
    assert rates.busy_rate(t) == pytest.approx(1 / MS, rel=0.05)  # one arrival per ms of busy time


def test_work_conserving_base_starts_everything_unless_smaller_batches_pay():
    free = attached(table(0.0))
    assert free.idle.batch_size(0.0, 4) == 4 and free.idle.batch_size(0.0, 20) == 8  # up to max_batch_size
    linear = attached(table(1.0))  # a batch costs a run per sample: one at a time is the lower mean, load allowing
    assert linear.idle.batch_size(0.0, 4) == 1


def test_preemption_gain_of_the_worked_example():
    """8 stages of 1 ms at any batch size; one newcomer at stage 1 of a running request, nothing else: without,
    7 + (7 + 8) = 22 ms summed (mean 11); with, both leave after 1 + 7 ms (mean 8)."""
    pol = attached(table(0.0))
    no, yes, saving = pol.preemption.gain(1, 1, 1, 0, 0.0)
    assert no == pytest.approx(11 * MS) and yes == pytest.approx(8 * MS) and saving == pytest.approx(6 * MS)
    assert pol.preemption.stop_benefit(0.0, 0, 1) == pol.graph.n  # nothing queued or arriving: no boundary pays


def test_urgency_budget_cut_and_keeping_apart():
    pol = attached(table(0.25), urgency=True)
    assert pol.urgent.budget() is None and pol.urgent.cut(0.0, 0, 1) == pol.graph.n  # one class: no cut
    pol.urgent.observe(0.0, (2, 1.0))
    pol.urgent.observe(0.0, (1, 0.016))
    assert pol.urgent.budget() == 0.016
    # room 16 - 1.25 x 8 = 6 ms: a job of one runs at most 6 stages of 1 ms
    assert pol.urgent.cut(0.0, 0, 1) == 6
    a = Entry(3, [Request(0, 0.0, sla=0.0063)], 0.0, 0.0063)
    assert pol.urgent.keeps_apart(0.0, a, 5)  # merged with 4 (2 ms a stage) it misses 6.3 ms; alone (5 ms) it keeps it
    # merged with one: 5 x 1.25 ms = 6.25 ms is on time by the bare table, not with the margin for its error
    # (x URGENT_ALONE = 7.8 ms): kept apart; with a deadline of 8 ms the margin fits and they merge
    assert pol.urgent.keeps_apart(0.0, a, 2)
    roomy = Entry(3, [Request(1, 0.0, sla=0.008)], 0.0, 0.008)
    assert not pol.urgent.keeps_apart(0.0, roomy, 2)


def test_decoder_admission_lengths_and_summed_decode():
    pol = attached(paper_tables.gnmt(), dec_timesteps=5, join="benefit")
    adm = pol.decoder
    assert adm.histogram is None and adm.steps_left(Request(0, 0.0), 2) == 3 and adm.steps_left(Request(0, 0.0), 9) == 1
    step = adm.dec_step
    total, span = adm.decode_together([2, 4])
    assert span == pytest.approx(2 * step[2] + 2 * step[1])
    assert total == pytest.approx(2 * step[2] + span)
    assert math.isfinite(total)
