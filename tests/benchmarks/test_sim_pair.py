"""The pair replayed on the simulator (benchmarks/sim_pair.py): the served arrivals on each model's latency table,
Triton's batcher under plain processor sharing against lazybatch's CPU share under weighted sharing."""

from __future__ import annotations

import math
from pathlib import Path

from benchmarks.sim_pair import SIM_OF, Tables, simulate
from tests.colocation_helpers import linear_table


def _tables(tmp_path: Path) -> Tables:
    """Two models as `repo default --pair` lays them out: <name>/config.pbtxt and <name>/1/latency.json."""
    paths = {}
    for kind, table in (("small", linear_table(2, 0.5e-3, "small")), ("large", linear_table(4, 2.5e-3, "large"))):
        folder = tmp_path / kind / "1"
        folder.mkdir(parents=True)
        (tmp_path / kind / "config.pbtxt").write_text(f'name: "{kind}"\nmax_batch_size: 64\n')
        paths[kind] = table.save(folder / "latency.json")
    return Tables(paths)


def test_the_share_keeps_the_small_model_fast_where_plain_sharing_does_not(tmp_path):
    """The large model busy (60% of the device) beside the small one (30%): under plain processor sharing each of
    the small model's jobs runs at half speed whenever the large one runs; under the share's weights (the large one
    at nice 10 while the small one is active) it runs almost alone. Every served configuration the page names has a
    simulated counterpart but the pinned one (a partition the simulator has no model of)."""
    tables = _tables(tmp_path)
    rates = {"small": 300.0, "large": 60.0}
    slas = {"small": 10.0, "large": 100.0}
    plain = simulate(tables, "triton_0us", rates, 10.0, 0, slas)
    shared = simulate(tables, "eager_shared", rates, 10.0, 0, slas)
    for out in (plain, shared):
        assert all(math.isfinite(out[k]["avg_ms"]) and out[k]["p99_ms"] >= out[k]["avg_ms"] for k in rates)
    assert shared["small"]["avg_ms"] < 0.8 * plain["small"]["avg_ms"]
    assert shared["small"]["p99_ms"] < plain["small"]["p99_ms"]
    # the same policy (Triton's batcher) with the large model's stub at a nice by hand: only the weights differ, and
    # what they buy the small model, the large one pays
    hand = simulate(tables, "hand_nice", rates, 10.0, 0, slas)
    assert hand["small"]["avg_ms"] < 0.8 * plain["small"]["avg_ms"]
    assert hand["large"]["avg_ms"] > plain["large"]["avg_ms"]
    # the same seed replays the same arrivals: a second replay is identical
    assert simulate(tables, "triton_0us", rates, 10.0, 0, slas) == plain
    assert "triton_0us_pinned" not in SIM_OF and {"triton_0us", "triton_0us_twin", "eager_shared"} <= set(SIM_OF)
