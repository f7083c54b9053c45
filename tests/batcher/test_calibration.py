"""The monotone fit of latency tables, robust profiling (rounds, medians, fit) and online recalibration."""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import pytest

from lazybatch.batcher import ConfigError, LatencyTable, ModelGraph, StageType
from lazybatch.batcher.calibration import OnlineCalibrator
from lazybatch.batcher.latency_table import isotonic, monotone_row

MS = 1e-3


def _table(rows, sizes=(1, 2, 4, 8), **kw) -> LatencyTable:
    g = ModelGraph("m", [(f"s{i}", StageType.STATIC) for i in range(len(rows))])
    return LatencyTable(g, list(sizes), [[v * MS for v in r] for r in rows], provenance="test", **kw)


def _dense_is_monotone(t: LatencyTable, tol: float = 1e-12) -> bool:
    for row in t.dense:
        for b in range(2, len(row)):
            if row[b] < row[b - 1] - tol or row[b] / b > row[b - 1] / (b - 1) + tol:
                return False
    return True


# ---------------------------------------------------------------------------------------------- monotone fit
def test_isotonic_spreads_a_spike_over_the_sizes_it_contradicts():
    fit = isotonic([1.0, 2.0, 10.0, 3.0, 4.0])
    assert fit[:2] == [1.0, 2.0]
    assert fit[2:] == pytest.approx([17 / 3] * 3)  # (10 + 3 + 4) / 3: pooled, not dropped
    assert sum(fit) == pytest.approx(20.0)  # PAV keeps the (equally weighted) total
    assert all(a <= b for a, b in zip(fit, fit[1:]))
    assert isotonic([3.0, 1.0]) == [2.0, 2.0]
    assert isotonic([1.0, 1.0, 5.0]) == [1.0, 1.0, 5.0]
    assert isotonic([4.0, 1.0], weights=[3.0, 1.0]) == [3.25, 3.25]
    assert isotonic([]) == []
    with pytest.raises(ValueError):
        isotonic([1.0, 2.0], weights=[1.0])


def test_monotone_row_clamps_per_sample_cost():
    # 3.0 at batch 2 costs 1.5 per sample, more than batch 1's 1.0: clamped to 2.0, and batch 4 follows
    assert monotone_row([1, 2, 4], [1.0, 3.0, 4.0]) == [1.0, 2.0, 4.0]
    assert monotone_row([1, 2, 4], [1.0, 1.5, 6.0]) == [1.0, 1.5, 3.0]
    assert monotone_row([1, 3], [1.0, 3.5]) == [1.0, 3.0]  # the factor is b_k / b_{k-1}, not 2
    # isotonic first, then the clamp: a dip and an over-linear step in one row
    fit = monotone_row([1, 2, 4, 8], [2.0, 1.0, 5.0, 6.0])
    assert fit == pytest.approx([1.5, 1.5, 3.0, 6.0])
    with pytest.raises(ValueError, match="increase"):
        monotone_row([2, 1], [1.0, 1.0])


def test_monotone_keeps_a_monotone_table_and_fits_a_spiky_one():
    good = _table([[1, 1.5, 2.5, 4.0], [0.3, 0.3, 0.4, 0.8]], meta={"source": "x"})
    assert good.is_monotone()
    fitted = good.monotone()
    assert fitted is not good
    assert fitted.measured == good.measured and fitted.dense == good.dense
    assert fitted.provenance == "test" and fitted.meta == {"source": "x", "monotone_fit": True}
    assert good.meta == {"source": "x"}  # the original is left alone

    spiky = _table([[1, 1.5, 9.0, 4.0], [0.3, 0.2, 0.4, 2.0]])
    assert not spiky.is_monotone()
    f = spiky.monotone()
    assert f.is_monotone() and _dense_is_monotone(f)
    assert f.measured[0] == pytest.approx([MS, 1.5 * MS, 3 * MS, 6 * MS])  # (9+4)/2 = 6.5 pooled, then clamped
    assert f.measured[1] == pytest.approx([0.25 * MS, 0.25 * MS, 0.4 * MS, 0.8 * MS])
    assert spiky.measured[0][2] == pytest.approx(9 * MS)
    back = LatencyTable.from_dict(json.loads(json.dumps(f.to_dict())))
    assert back.meta["monotone_fit"] is True and back.measured == f.measured


# ---------------------------------------------------------------------------------------------- profiling
@pytest.fixture(scope="module")
def mlp_stages(tmp_path_factory) -> Path:
    pytest.importorskip("onnxruntime")
    import onnx

    from lazybatch.staging import make_mlp, split_model

    root = tmp_path_factory.mktemp("mlp")
    model = make_mlp(root / "mlp.onnx", in_dim=16, width=32, depth=3, out_dim=8)
    relus = [i for i, n in enumerate(onnx.load(str(model)).graph.node) if n.op_type == "Relu"]
    return split_model(model, root / "stages", cut_after=relus)


@pytest.fixture(scope="module")
def mlp_split(tmp_path_factory) -> Path:
    """The same kind of model through `lazybatch split` (a directory `lazybatch profile` reads)."""
    pytest.importorskip("onnxruntime")
    from lazybatch.cli import main
    from lazybatch.staging import make_mlp

    root = tmp_path_factory.mktemp("mlp_split")
    model = make_mlp(root / "mlp.onnx", in_dim=16, width=32, depth=3, out_dim=8)
    assert main(["split", str(model), "--out", str(root / "stages")]) == 0
    return root / "stages"


def test_stage_runner_profile_uses_rounds_median_and_fit(mlp_stages, monkeypatch):
    """A fake clock: every stage 'takes' a fixed non-monotone time, and a burst of load (50x) covers the second
    third of all timed runs. Interleaved, that is one round of every cell, which the median rejects; timed back to
    back it would be every run of a third of the cells. The table must show the medians, fitted monotone, and
    say so in meta."""
    from lazybatch.backend import stages as stages_mod
    from lazybatch.backend.stages import StageRunner

    runner = StageRunner(mlp_stages, execution_provider="cpu")
    base = {1: 1.0, 2: 3.0, 4: 2.5, 8: 5.0}  # ms: batch 2 over-linear, batch 4 a dip
    clock = [0.0]
    state = {"round_of": {}, "visits": []}
    real_run = runner.run

    def run(stage, feeds, *, owned=False):
        out = real_run(stage, feeds, owned=owned)
        b = next(iter(feeds.values())).shape[0]
        if owned:  # the timed runs (warm-up runs are not owned)
            rnd = state["round_of"].get((stage, b), 0)
            state["round_of"][(stage, b)] = rnd + 1
            n_cells = 4 * runner.n_stages
            busy = n_cells <= len(state["visits"]) < 2 * n_cells
            state["visits"].append((rnd, stage, b))
            clock[0] += base[b] * MS * (50.0 if busy else 1.0)
        return out

    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(stages_mod, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    table = runner.profile([1, 2, 4, 8], reps=1)
    assert table.meta["profile"] == {"rounds": 3, "reps": 1, "statistic": "median", "monotone_fit": True}
    assert table.meta["monotone_fit"] is True
    # interleaved: every cell's first run comes before any cell's second
    rounds_in_order = [r for r, _, _ in state["visits"]]
    assert rounds_in_order == sorted(rounds_in_order) and len(rounds_in_order) == 3 * 4 * runner.n_stages
    for row in table.measured:  # medians 1, 3, 2.5, 5 ms -> isotonic 1, 2.75, 2.75, 5 -> clamp 1, 2, 2.75, 5
        assert row == pytest.approx([1 * MS, 2 * MS, 2.75 * MS, 5 * MS])
    assert table.is_monotone()

    state["round_of"].clear()
    state["visits"].clear()
    t2 = runner.profile([1, 2, 4, 8], reps=5, rounds=2)
    assert t2.meta["profile"]["rounds"] == 2 and t2.meta["profile"]["reps"] == 3
    assert len(state["visits"]) == 2 * 3 * 4 * runner.n_stages


def test_profile_dir_meta_and_burst_rejection(mlp_split, monkeypatch):
    from lazybatch.onnx_tools import profile as prof

    calls: list[tuple[int, int]] = []
    base = {1: 1.0, 2: 1.5, 4: 2.0}
    chain_stages = [len(json.loads((mlp_split / "manifest.json").read_text())["stages"])]

    def fake_stage_times(chain, k, stage_in, warmup, repeat):
        b = next(iter(stage_in.values())).shape[0]
        n_cells = 3 * chain_stages[0]
        burst = 40.0 if n_cells <= len(calls) < 2 * n_cells else 1.0  # the second third of the calls is busy
        calls.append((k, b))
        return [base[b] * MS * burst] * repeat

    monkeypatch.setattr(prof, "_stage_times", fake_stage_times)
    table = prof.profile_dir(mlp_split, batch_sizes=[1, 2, 4], repeat=3, warmup=0, progress=False)
    assert table.meta["profile"] == {"rounds": 3, "reps": 1, "statistic": "median", "monotone_fit": True}
    assert table.meta["repeat"] == 3 and table.meta["monotone_fit"] is True
    n = table.graph.n
    # round-major order: (stage, batch) cells of round 0, then round 1, ...
    assert calls[:n * 3] == [(k, b) for b in (1, 2, 4) for k in range(n)]
    assert len(calls) == 3 * 3 * n
    for row in table.measured:
        assert row == pytest.approx([MS, 1.5 * MS, 2 * MS])  # the 40x round is rejected by the median
    w = table.meta["whole_graph_latency_s"]
    assert len(w) == 3 and all(a <= b for a, b in zip(w, w[1:]))
    assert all(y / 2 <= x * (1 + 1e-12) for x, y in zip(w, w[1:]))  # per-sample fit on the whole graph too
    assert len(table.meta["overhead_ratio"]) == 3
    with pytest.raises(ConfigError, match="rounds"):
        prof.profile_dir(mlp_split, batch_sizes=[1], rounds=0, progress=False)


# ---------------------------------------------------------------------------------------------- calibration
def _cal_table() -> LatencyTable:
    # stage 0: room for a 2x slowdown at batch 4 alone (1,2,2,4 -> 1,2,4,4 still fits both constraints);
    # stage 1: flat; stage 2: flat, never observed in these tests
    return _table([[1, 2, 2, 4], [1, 1, 1, 1], [0.5, 0.5, 0.5, 0.5]])


def test_calibrator_converges_to_a_slowdown_at_one_batch_size_only():
    t = _cal_table()
    cal = OnlineCalibrator(t)
    prof = [row[:] for row in t.dense]
    for _ in range(100):
        for b in (1, 2, 4, 8):
            cal.observe(0, b, prof[0][b] * (2.0 if b == 4 else 1.0))
    row = t.dense[0]
    assert row[4] == pytest.approx(2 * prof[0][4], rel=1e-3)
    for b in (1, 2, 8):  # the other sizes keep their own ratio (1.0)
        assert row[b] == pytest.approx(prof[0][b], rel=1e-3)
    assert row[3] == pytest.approx((row[2] + row[4]) / 2)  # linear between profiled sizes
    ratios = cal.as_dict()["stages"][0]["ratio"]
    assert ratios == pytest.approx([1.0, 1.0, 2.0, 1.0], rel=1e-3)
    assert cal.profiled[0] == prof[0]  # the profile itself is never rewritten
    assert t.measured[0] == pytest.approx([MS, 2 * MS, 2 * MS, 4 * MS])  # nor what save() writes


def test_observe_span_is_the_loop_of_observe_it_replaces():
    """A whole-graph pass observed in one call (an inline pass in execute) leaves the calibrator exactly as the
    per-stage loop did: each stage gets the time in proportion to its table time, with the same clamps, counters
    and due rewrites."""
    import random

    rng = random.Random(3)
    a, b = _cal_table(), _cal_table()
    one, loop = OnlineCalibrator(a, refresh_every=7), OnlineCalibrator(b, refresh_every=7)
    for _ in range(60):
        batch = rng.choice((1, 2, 3, 4, 8))
        start = rng.randrange(0, 3)
        stop = rng.randrange(start + 1, 4)
        took = sum(b.dense[s][batch] for s in range(start, stop)) * rng.choice((0.1, 0.9, 1.7, 40.0))
        due_loop = False
        total = sum(b.dense[s][batch] for s in range(start, stop))
        for s in range(start, stop):
            due_loop |= loop.observe(s, batch, took * b.dense[s][batch] / total, refresh=False)
        due_one = one.observe_span(start, stop, batch, took, refresh=False)
        assert due_one == due_loop
        if due_one:
            one.refresh()
            loop.refresh()
        assert one.runs == loop.runs and one.observations == loop.observations
        for x, y in zip(one.ratio, loop.ratio):  # the same arithmetic, in another order: equal to rounding
            assert [v is None for v in x] == [v is None for v in y]
            assert [v for v in x if v is not None] == pytest.approx([v for v in y if v is not None], rel=1e-12)
        for x, y in zip(a.dense, b.dense):
            assert x == pytest.approx(y, rel=1e-12)
    assert one.version == loop.version > 0
    assert one.observe_span(0, 3, 9, 1.0) is False and one.ignored == 3  # batch outside the table: ignored
    with pytest.raises(ValueError):
        one.observe_span(2, 2, 1, 1.0)


def test_observe_span_of_several_runs_is_those_runs_one_by_one():
    """``runs=k`` with the runs' mean time is exactly k single observations of that time (the moving average
    taken k steps towards the same ratio): the backend applies an interval's inline passes per batch size."""
    a, b = _cal_table(), _cal_table()
    one, loop = OnlineCalibrator(a, refresh_every=1000), OnlineCalibrator(b, refresh_every=1000)
    for batch, took, k in ((1, 0.004, 5), (4, 0.02, 1), (2, 0.5, 12), (1, 0.001, 3)):
        due_one = one.observe_span(0, 3, batch, took, refresh=False, runs=k)
        due_loop = False
        for _ in range(k):
            due_loop |= loop.observe_span(0, 3, batch, took, refresh=False)
        assert due_one == due_loop
        assert one.runs == loop.runs and one.observations == loop.observations
        for x, y in zip(one.ratio, loop.ratio):
            assert [v is None for v in x] == [v is None for v in y]
            assert [v for v in x if v is not None] == pytest.approx([v for v in y if v is not None], rel=1e-9)
    assert one.observe_span(0, 3, 9, 1.0, runs=4) is False and one.ignored == 12  # outside the table: all ignored


def test_calibrator_never_compounds():
    t = _cal_table()
    cal = OnlineCalibrator(t)
    prof = [row[:] for row in t.dense]
    for _ in range(200):
        cal.observe(1, 2, prof[1][2] * 3.0)
    assert t.dense[1][2] == pytest.approx(3 * prof[1][2], rel=1e-3)
    # back to the profiled time: the ratio returns to 1 and the row to the profile (not to 3x of 3x)
    for _ in range(300):
        cal.observe(1, 2, prof[1][2])
    cal.refresh()
    assert cal.ratio[1][1] == pytest.approx(1.0, rel=1e-6)
    assert t.dense[1] == pytest.approx(prof[1], rel=1e-6)


def test_unobserved_cells_take_the_stage_mean_then_the_model_mean():
    t = _cal_table()
    cal = OnlineCalibrator(t, weight=1.0)  # weight 1: the ratio is the last observation, to check the arithmetic
    assert cal.observe(1, 1, 1.2 * MS) is True  # moved 20%: rewritten at once
    assert cal.observe(1, 8, 1.6 * MS) is True
    assert cal.stage_ratio(1) == pytest.approx(1.4)
    row = t.dense[1]
    assert row[1] == pytest.approx(1.2 * MS) and row[8] == pytest.approx(1.6 * MS)
    assert row[2] == pytest.approx(1.4 * MS) and row[4] == pytest.approx(1.4 * MS)  # never observed: stage mean
    assert row[6] == pytest.approx(1.5 * MS)
    # stage 2 was never observed: the model-wide scale (runs x profiled seconds weighted), here also 1.4
    assert cal.scale == pytest.approx(1.4)
    assert t.dense[2][1] == pytest.approx(0.5 * 1.4 * MS) and t.dense[2][8] == pytest.approx(0.5 * 1.4 * MS)
    # stage 0 as well; the per-stage fallback beats the model one once the stage has runs
    assert t.dense[0][4] == pytest.approx(2 * 1.4 * MS)
    cal.observe(0, 1, 1.0 * MS)
    cal.refresh()
    assert t.dense[0][4] == pytest.approx(2 * MS)


def test_scale_weights_by_runs_and_profiled_time():
    t = _table([[1, 1, 1, 1], [4, 4, 4, 4]])
    cal = OnlineCalibrator(t, weight=1.0)
    assert cal.scale == 1.0  # nothing observed
    cal.observe(0, 1, 2 * MS)  # ratio 2 on a 1 ms cell
    cal.observe(1, 1, 4 * MS)  # ratio 1 on a 4 ms cell
    assert cal.scale == pytest.approx((1 * 2 + 4 * 1) / 5)
    cal.observe(0, 1, 2 * MS)  # a second run of the first cell: twice its weight
    assert cal.scale == pytest.approx((2 * 1 * 2 + 4 * 1) / 6)


def test_refresh_updates_single_in_place_and_version():
    t = _cal_table()
    dense_rows, single = list(t.dense), t.single
    row0 = t.dense[0]
    cal = OnlineCalibrator(t, refresh_every=64)
    assert cal.version == 0
    # observations at the profiled time move nothing by 10%: no rewrite until the 64th
    results = [cal.observe(1, 1, MS) for _ in range(64)]
    assert results == [False] * 63 + [True] and cal.version == 1
    assert cal.observe(0, 1, 1.5 * MS) is False and cal.version == 1  # 1 -> 1.05: under 10%
    assert t.single[0] == pytest.approx(MS)
    assert cal.observe(0, 1, 3 * MS) is True and cal.version == 2  # 1.05 -> 1.245: rewritten at once
    assert cal.ratio[0][0] == pytest.approx(1.245)
    assert t.single is single and t.dense[0] is row0  # the same lists, new values
    assert all(a is b for a, b in zip(t.dense, dense_rows))
    assert t.single == [row[1] for row in t.dense]
    assert t.single[0] == pytest.approx(1.245 * MS)
    assert t.latency(0, 1) == pytest.approx(1.245 * MS)


def test_absurd_observations_are_clamped_or_ignored():
    t = _cal_table()
    cal = OnlineCalibrator(t)
    cal.observe(0, 1, 1000 * MS)  # 1000x: counted as 20x
    assert cal.ratio[0][0] == pytest.approx(1 + 0.1 * (20 - 1))
    assert t.dense[0][1] == pytest.approx(2.9 * MS)
    low = OnlineCalibrator(_cal_table())
    low.observe(1, 1, 1e-9)  # ~0: counted as 0.25x
    assert low.ratio[1][0] == pytest.approx(1 + 0.1 * (0.25 - 1))
    n, version = cal.observations, cal.version
    for stage, batch, sec in [(0, 0, MS), (0, 9, MS), (0, 1, -1.0), (0, 1, math.nan), (0, 1, math.inf)]:
        assert cal.observe(stage, batch, sec) is False
    assert cal.observations == n and cal.ignored == 5 and cal.version == version
    assert cal.ratio[0][0] == pytest.approx(2.9)
    with pytest.raises(ValueError, match="stage 3"):
        cal.observe(3, 1, MS)


def test_runs_count_for_the_profiled_size_at_or_below_and_rows_stay_monotone():
    t = _cal_table()
    cal = OnlineCalibrator(t, weight=1.0)
    assert [cal.bucket(b) for b in range(1, 9)] == [0, 1, 1, 2, 2, 2, 2, 3]
    cal.observe(0, 3, t.dense[0][3] * 1.5)  # batch 3: bucket 2, ratio against the profiled time at 3
    assert cal.ratio[0][1] == pytest.approx(1.5) and cal.runs[0] == [0, 1, 0, 0]
    cal.observe(0, 2, 2 * MS)  # bucket 2 back to 1.0
    cal.observe(0, 1, 3 * MS)  # 3x at batch 1 only: 3 ms at batch 1 against 2 ms at batch 2
    assert cal.ratios_in_force(0) == pytest.approx([3.0, 1.0, 5 / 3, 5 / 3])  # run-weighted stage mean
    # the rewrite re-applies the monotone fit: batch 1 and 2 pooled at 2.5 ms instead of a dip
    assert t.dense[0][1] == pytest.approx(2.5 * MS) and t.dense[0][2] == pytest.approx(2.5 * MS)
    assert t.dense[0][8] == pytest.approx(4 * 5 / 3 * MS)
    assert _dense_is_monotone(t)
    d = cal.as_dict()
    assert d["stages"][0]["runs"] == [1, 2, 0, 0] and d["batch_sizes"] == [1, 2, 4, 8]
    assert d["stages"][2]["ratio"] == [None] * 4 and d["version"] == cal.version == 3
    json.dumps(d)


def test_calibrator_argument_checks():
    t = _cal_table()
    for kw in ({"weight": 0.0}, {"refresh_every": 0}, {"min_ratio": 2.0}):
        with pytest.raises(ValueError):
            OnlineCalibrator(t, **kw)
