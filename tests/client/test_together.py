"""Several models driven at once (client/together.py, `lazybatch load/perf --together`): the mix, the per-model
SLAs, the split of the aggregate rate, the seeds, and the aggregate row's arithmetic. No server: the real-server
runs are in tests/triton/test_together_server.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lazybatch.batcher.errors import ConfigError
from lazybatch.cli import main
from lazybatch.client.load import AGGREGATE, LoadResult, poisson_schedule
from lazybatch.client.report import format_table
from lazybatch.client.together import aggregate, model_seed, parse_mix, parse_sla, split_rate

MODELS = ["m1", "m2", "m3", "m4"]


def test_the_mix_defaults_to_equal_shares_and_reads_one_share_per_model():
    assert parse_mix(None, MODELS) == {m: 0.25 for m in MODELS}
    mix = parse_mix("m1=0.7, m2=0.1,m3=0.1,m4=0.1", MODELS)
    assert list(mix) == MODELS  # in the order of the models given, whatever the order of the mix
    assert mix == pytest.approx({"m1": 0.7, "m2": 0.1, "m3": 0.1, "m4": 0.1})
    assert parse_mix("m2=0.25,m1=0.75", ["m1", "m2"]) == {"m1": 0.75, "m2": 0.25}


@pytest.mark.parametrize("text, words", [
    ("m1=0.7,m2=0.2", "must add up to 1, got 0.9 (0.7 + 0.2)"),
    ("m1=0.7,m2=0.7", "must add up to 1, got 1.4"),
    ("m1=0.5", "missing: m2"),
    ("m1=0.5,m2=0.4,m9=0.1", "names m9, not among the models driven"),
    ("m1=half,m2=0.5", "not a number"),
    ("m1=0,m2=1", "must be in (0, 1]"),
    ("m1=0.5,m1=0.5", "given twice"),
    ("m1:0.5,m2:0.5", "MODEL=VALUE"),
])
def test_a_bad_mix_is_refused_by_what_is_wrong(text, words):
    with pytest.raises(ConfigError, match="--mix") as e:
        parse_mix(text, ["m1", "m2"])
    assert words in str(e.value)


def test_the_sla_is_one_for_all_or_one_per_model():
    assert parse_sla("100", MODELS) == {m: 100.0 for m in MODELS}
    assert parse_sla(50.0, ["a"]) == {"a": 50.0}
    assert parse_sla(None, ["a"]) == {"a": None} and parse_sla("none", ["a"]) == {"a": None}
    assert parse_sla("m1=20,m2=200", ["m1", "m2"]) == {"m1": 20.0, "m2": 200.0}
    for text, words in (("m1=20", "missing: m2"), ("m1=20,m2=-1", "SLA of m2 must be a positive"),
                        ("fast", "not a number"), ("m1=20,m2=200,m3=5", "names m3")):
        with pytest.raises(ConfigError, match="--sla-ms") as e:
            parse_sla(text, ["m1", "m2"])
        assert words in str(e.value)


def test_the_aggregate_rate_is_split_by_the_shares():
    rates = split_rate(100.0, parse_mix("m1=0.7,m2=0.1,m3=0.1,m4=0.1", MODELS))
    assert rates == pytest.approx({"m1": 70.0, "m2": 10.0, "m3": 10.0, "m4": 10.0})
    assert sum(rates.values()) == pytest.approx(100.0)
    with pytest.raises(ConfigError, match="positive"):
        split_rate(0.0, {"m1": 1.0})


def test_each_model_has_its_own_stream_the_same_on_every_run():
    seeds = [model_seed(0, k) for k in range(4)]
    assert len(set(seeds)) == 4 and seeds == [model_seed(0, k) for k in range(4)]
    assert model_seed(1, 0) not in seeds  # another run seed: other streams, not the neighbours' ones
    a, b = (poisson_schedule(50.0, 5.0, s, 10_000) for s in seeds[:2])
    assert a != b and len(a) == pytest.approx(250, rel=0.3)


def result(model: str, rate: float, lat_ms: list[float], *, sla: float | None, errors: int = 0, lost: int = 0,
           thr: float = 0.0) -> LoadResult:
    r = LoadResult(model, rate, 2.0, sla, 1, sent=len(lat_ms) + errors + lost, ok=len(lat_ms), errors=errors,
                   lost=lost, throughput=thr, send_rate=rate, start_unix=1000.0 + rate)
    r.latencies_ms = list(lat_ms)
    r.error_kinds = {"boom": errors} if errors else {}
    if lat_ms:
        r.avg_ms, r.p99_ms = float(np.mean(lat_ms)), float(np.percentile(lat_ms, 99))
    return r


def test_the_aggregate_row_sums_counts_and_pools_latencies_against_each_models_own_sla():
    small = result("small", 70.0, [1.0, 2.0, 30.0], sla=20.0, thr=68.0)  # one late against its 20 ms
    large = result("large", 30.0, [50.0, 150.0], sla=100.0, errors=1, lost=1, thr=29.0)  # one late, two failed
    agg = aggregate([small, large], 100.0)
    assert agg.model == AGGREGATE and agg.offered_rate == 100.0 and agg.sla_ms is None
    assert (agg.sent, agg.ok, agg.errors, agg.lost) == (7, 5, 1, 1)
    assert agg.sent == small.sent + large.sent and agg.ok == small.ok + large.ok
    assert agg.avg_ms == pytest.approx((1 + 2 + 30 + 50 + 150) / 5)
    assert agg.p50_ms == pytest.approx(30.0) and agg.max_ms == 150.0
    assert agg.p99_ms == pytest.approx(np.percentile([1, 2, 30, 50, 150], 99))
    # late: 30 > 20 (small), 150 > 100 (large), though 50 is under the large one's 100 and over the small one's 20;
    # failed: the large one's error and its lost request: (2 + 2) / 7
    assert agg.sla_violation_rate == pytest.approx((2 + 2) / 7)
    assert agg.throughput == pytest.approx(97.0) and agg.send_rate == pytest.approx(100.0)
    assert agg.error_kinds == {"boom": 1} and agg.start_unix == large.start_unix  # the earlier start
    assert aggregate([small, large]).offered_rate == 100.0  # default: the sum of the models' rates


def test_the_table_puts_the_aggregate_under_its_models_and_says_shares_and_ratios():
    small = result("small", 70.0, [1.0, 2.0, 3.0], sla=20.0, thr=70.0)
    large = result("large", 30.0, [50.0, 60.0], sla=100.0, thr=30.0)
    small.p99_alone_ms = small.p99_ms / 2
    rows = [small, large, aggregate([small, large], 100.0)]
    text = format_table(rows)
    body = text.splitlines()
    assert body[-1].startswith("(all)") or any(l.startswith("(all)") for l in body)
    together = text.split("together")[1].splitlines()
    small_line = next(l for l in together if l.startswith("small"))
    assert "0.70" in small_line and "20" in small_line and small_line.split()[-1] == "2.00"
    assert "nan" in next(l for l in together if l.startswith("large")).split()[-1]  # no alone run for it
    assert " each " in next(l for l in together if l.startswith(AGGREGATE))
    assert math.isnan(rows[-1].p99_alone_ms)


@pytest.mark.parametrize("argv, words", [
    (["load", "a", "b", "--rate", "10", "--together", "--mix", "a=0.6,b=0.6"], "must add up to 1"),
    (["load", "a", "b", "--rate", "10", "--mix", "a=0.5,b=0.5"], "add --together"),
    (["load", "a", "--rate", "10", "--alone"], "add --together"),
    (["load", "a", "b", "--rate", "10", "--sla-ms", "a=5"], "missing: b"),
    (["perf", "a", "b", "--rates", "10", "--together", "--mix", "a=0.2,b=0.3"], "must add up to 1"),
    (["perf", "a", "b", "--rates", "10", "--mix", "a=0.5,b=0.5"], "add --together"),
])
def test_the_commands_refuse_a_bad_mix_before_sending_anything(argv, words, capsys):
    # no server at this address: the error must come before any connection is tried
    assert main([*argv, "--url", "127.0.0.1:1"]) == 2
    assert words in capsys.readouterr().err
