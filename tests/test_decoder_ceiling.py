"""benchmarks/probes/probe_decoder_ceiling.py: a request's run alone and the figures it derives from a replay."""

from __future__ import annotations

import json
from types import SimpleNamespace

from lazybatch.batcher import LatencyTable, ModelGraph, StageType
from benchmarks.harness import ROOT
from benchmarks.probes import probe_decoder_ceiling


def _seq2seq_table() -> LatencyTable:
    graph = ModelGraph("s2s", [("embed", StageType.STATIC), ("enc", StageType.ENCODER),
                               ("dec_a", StageType.DECODER), ("dec_b", StageType.DECODER)])
    return LatencyTable(graph, [1, 8], [[1.0, 2.0], [2.0, 3.0], [3.0, 4.0], [5.0, 9.0]])


def test_alone_counts_every_visit_at_batch_1() -> None:
    probe = probe_decoder_ceiling
    table = _seq2seq_table()
    # 1 static stage, 4 encoder steps of 2, 3 decoder steps of (3 + 5)
    assert probe.alone_s(table, SimpleNamespace(enc_steps=4, dec_steps=3)) == 1.0 + 4 * 2.0 + 3 * 8.0


def test_no_policy_beats_its_own_run_alone(tmp_path) -> None:
    """The ceiling the probe states rests on this: in a replay, every request's latency is at least its run alone."""
    probe = probe_decoder_ceiling
    out = tmp_path / "c.json"
    assert probe.main(["--table", str(ROOT / "benchmarks/tables/gnmt_latency_7e215ec.json"), "--loads", "0.7",
                       "--seeds", "1", "--requests", "60", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    cell = res["loads"]["0.7"]
    assert 0.0 < res["interactive_floor"] < 0.5
    for c in cell["policies"].values():
        assert c["latency_over_alone"] >= 1.0 - 1e-9
        assert c["wait_to_start_ms"] >= 0.0
    assert cell["ratio_best_triton_over_eager"] <= cell["ratio_ceiling_any_policy"] + 1e-9


def test_the_clairvoyant_policy_is_told_each_true_length() -> None:
    """The probe's join-or-wait ceiling must use every request's true output length, not the histogram's
    prediction: its decoder admission answers the steps left from ``dec_steps`` (this went silently stale once,
    when eager's parts moved into their own modules)."""
    from lazybatch.batcher import Request
    from lazybatch.batcher.lengths import LengthHistogram
    from lazybatch.batcher.scheduler import Scheduler

    from .test_eager import _HeldExecutor
    from .test_scheduler_core import ManualClock

    table = _seq2seq_table()
    hist = LengthHistogram([2], [1.0])  # predicts 2 steps for everyone
    pol = probe_decoder_ceiling.Clairvoyant(8, length_histogram=hist, join="benefit")
    Scheduler(table, pol, _HeldExecutor(), ManualClock())
    r = Request(0, 0.0, enc_steps=1, dec_steps=30)
    assert pol.decoder.steps_left(r, 0) == 30
    assert pol.decoder.steps_left(r, 29) == 1
    plain = probe_decoder_ceiling.EagerBatching(8, length_histogram=hist, join="benefit")
    Scheduler(table, plain, _HeldExecutor(), ManualClock())
    assert plain.decoder.steps_left(r, 0) != 30  # the servable rule predicts instead
