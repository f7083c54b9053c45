"""The LazyBatching paper's worked examples, replayed on the real scheduler with the simulator's virtual clock."""

from __future__ import annotations

import pytest

from lazybatch.batcher import (GraphBatching, LazyBatching, LengthHistogram, Request, SlackPredictor, StageType,
                               slack)
from lazybatch.batcher.decisions import DISPATCH, MERGE, PREEMPT
from lazybatch.simulator.engine import Simulation

from tests.simhelpers import flat_table


def run(table, policy, reqs):
    jobs = []
    sim = Simulation(table, policy, on_job=lambda t, job: jobs.append((t, job.stage, [r.id for r in job.requests])))
    sim.run(reqs)
    return sim, jobs


def test_fig10_push_preempt_merge(eight_nodes):
    """Section IV-B / Fig. 10: Req1 alone; Req2 arrives while Req1 runs node B; Req3 while Req2 runs node A.

    Entries are pushed at t=4 and t=5, merged at B (t=6) and at C (t=7); all three finish together after H.
    """
    reqs = [Request(1, 2.0, sla=100), Request(2, 3.5, sla=100), Request(3, 4.5, sla=100)]
    sim, jobs = run(eight_nodes, LazyBatching(), reqs)
    A, B, C, H = 0, 1, 2, 7
    assert jobs[:6] == [(2.0, A, [1]), (3.0, B, [1]), (4.0, A, [2]), (5.0, A, [3]), (6.0, B, [2, 3]),
                        (7.0, C, [1, 2, 3])]
    assert jobs[-1] == (12.0, H, [1, 2, 3])
    assert len(jobs) == 2 + 1 + 1 + 1 + 6
    assert [r.finish for r in reqs] == [13.0, 13.0, 13.0]

    log = [(d.time, d.kind, d.stage, d.batch_size) for d in sim.scheduler.log]
    assert log == [
        (2.0, DISPATCH, A, 1),  # t=2: entry {Req1, next node A} pushed
        (4.0, PREEMPT, C, 1),  # t=4: Req1 preempted with next node C ...
        (4.0, DISPATCH, A, 1),  # ... and {Req2, A} pushed
        (5.0, PREEMPT, B, 1),  # t=5: Req2 preempted with next node B ...
        (5.0, DISPATCH, A, 1),  # ... and {Req3, A} pushed
        (6.0, MERGE, B, 2),  # t=6: the two topmost entries are both at B: merged
        (7.0, MERGE, C, 3),  # t=7: {Req2, Req3} reach C, where Req1 waits: merged
    ]


def test_eq1_slack_example(eight_nodes):
    """Eq. 1: SLA 30, T_wait 2 (t=0 to 2), eight one-unit nodes A..H of execution -> slack 20."""
    pred = SlackPredictor(eight_nodes)
    exec_time = pred.single_input_exec_time()
    assert exec_time == 8
    assert slack(30, 2, [exec_time]) == 20
    # Eq. 2 with Req2 batched in: the conservative estimate adds its single-input time.
    assert slack(30, 2, [exec_time, exec_time]) == 12


def test_algorithm1_encoder_decoder_timesteps():
    table = flat_table(3, names=["embed", "enc", "dec"],
                       types=[StageType.STATIC, StageType.ENCODER, StageType.DECODER])
    # make the three stages distinguishable: 1, 2 and 3 units
    from lazybatch.batcher import LatencyTable
    t = LatencyTable(table.graph, [1, 64], [[1, 1], [2, 2], [3, 3]])
    pred = SlackPredictor(t, dec_timesteps=30)
    assert pred.single_input_exec_time(enc_steps=7) == 1 + 2 * 7 + 3 * 30
    # remaining time from the middle of the decoder loop: 5 decoder steps done, the 6th about to run
    assert pred.remaining(2, 5, 7) == 3 * (30 - 5)
    # past the predicted length, one more step is all that is assumed
    assert pred.remaining(2, 40, 7) == 3


def test_dec_timesteps_cover_90_percent_of_fig11_histogram():
    from lazybatch.formats.histograms import shipped_histogram
    h = LengthHistogram.load(shipped_histogram())
    assert h.fraction_at_most(19) == pytest.approx(0.70, abs=0.02)  # ~70% under 20 words
    assert h.fraction_at_most(30) == pytest.approx(0.90, abs=0.02)  # ~90% within 30
    assert h.coverage_length(0.9) == 30
    assert LazyBatching(length_histogram=h).dec_timesteps == 30
    assert LazyBatching(length_histogram=h, dec_timesteps_coverage=0.16).dec_timesteps < 12


@pytest.mark.parametrize("window, expected", [
    # (a) window 2: Req1 waits until t=2, Req2 until t=6, Req3 until t=14; batch size 1 each
    (2.0, [(2.0, [1]), (6.0, [2]), (14.0, [3])]),
    # (b) window 4: no larger batch (Req2 arrives just as Req1's window closes), and everyone starts later
    (4.0, [(4.0, [1]), (8.0, [2]), (16.0, [3])]),
    # (c) window 8: Req1 waits long enough for Req2: one batch of two
    (8.0, [(8.0, [1, 2]), (20.0, [3])]),
])
def test_fig4_graph_batching_timelines(window, expected):
    """Fig. 4: graph batching of a 3-unit graph with Req1 at t=0, Req2 at t=4, Req3 at t=12, for three windows.

    The figure itself is not in the text; these timelines follow its narrative: widening the window from 2 to 4
    only delays Req1 and Req2, while a wide enough window forms a larger batch.
    """
    table = flat_table(3)
    reqs = [Request(1, 0.0), Request(2, 4.0), Request(3, 12.0)]
    _, jobs = run(table, GraphBatching(max_batch_size=64, max_queue_delay=window), reqs)
    starts = [(t, ids) for t, stage, ids in jobs if stage == 0]
    assert starts == expected
    for t, ids in expected:
        for r in reqs:
            if r.id in ids:
                assert r.finish == t + 3


def test_graph_batching_window_zero_batches_what_is_queued():
    table = flat_table(2)
    reqs = [Request(i, t) for i, t in enumerate([0.0, 0.5, 1.0, 1.5, 2.5])]
    _, jobs = run(table, GraphBatching(max_batch_size=64, max_queue_delay=0.0), reqs)
    assert [(t, ids) for t, s, ids in jobs if s == 0] == [(0.0, [0]), (2.0, [1, 2, 3]), (4.0, [4])]


def test_graph_batching_preferred_and_max_batch_sizes():
    table = flat_table(1)
    reqs = [Request(i, 0.1 * i) for i in range(7)]
    # preferred size 4 dispatches as soon as four are queued, long before the 10-unit window expires
    _, jobs = run(table, GraphBatching(max_batch_size=64, max_queue_delay=10.0, preferred_batch_sizes=(4,)), reqs)
    # the last three never form a preferred batch: they go when the oldest one's window expires (0.4 + 10)
    assert [(round(t, 6), ids) for t, s, ids in jobs] == [(0.3, [0, 1, 2, 3]), (10.4, [4, 5, 6])]
    _, jobs = run(table, GraphBatching(max_batch_size=2, max_queue_delay=10.0), [Request(i, 0.0) for i in range(5)])
    assert [ids for _, _, ids in jobs] == [[0, 1], [2, 3], [4]]
