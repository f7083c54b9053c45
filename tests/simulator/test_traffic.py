"""Traffic classes (lazybatch/traffic.py) and the mixed-traffic replay (lazybatch/simulator/mixed.py)."""

from __future__ import annotations

import pytest

from lazybatch.batcher.errors import ConfigError
from lazybatch.simulator.mixed import simulate_mixed
from lazybatch.traffic import TrafficClass, assign, parse_class, parse_classes

from tests.batcher.test_urgency import table


def test_a_class_spec_reads_name_share_sla_and_priority():
    assert parse_class("interactive:0.2:20:1") == TrafficClass("interactive", 0.2, 20.0, 1)
    assert parse_class("bulk:0.8:none") == TrafficClass("bulk", 0.8, None, 0)


@pytest.mark.parametrize("spec, words", [
    ("interactive:0.2", "NAME:SHARE:SLA_MS"),
    ("a:b:c:d:e", "NAME:SHARE:SLA_MS"),
    (":0.2:20", "name"),
    ("x y:0.2:20", "name"),
    ("i:lots:20", "share 'lots' is not a number"),
    ("i:0:20", "share must be in (0, 1]"),
    ("i:1.5:20", "share must be in (0, 1]"),
    ("i:0.2:fast", "SLA 'fast' is not a number"),
    ("i:0.2:-5", "SLA must be a positive"),
    ("i:0.2:20:high", "priority 'high' is not an integer"),
    ("i:0.2:20:-1", "priority must be >= 0"),
])
def test_a_bad_class_spec_is_refused_by_what_is_wrong(spec, words):
    with pytest.raises(ConfigError, match=None) as e:
        parse_class(spec)
    assert words in str(e.value)


def test_classes_must_differ_by_name_and_share_all_requests():
    with pytest.raises(ConfigError, match="add up to 1, got 0.9"):
        parse_classes(["a:0.2:20", "b:0.7:200"])
    with pytest.raises(ConfigError, match="a given twice"):
        parse_classes(["a:0.5:20", "a:0.5:200"])
    with pytest.raises(ConfigError, match="at least one"):
        parse_classes([])
    assert len(parse_classes(["a:0.2:20:1", "b:0.8:200:2"])) == 2


def test_assignment_follows_the_shares_and_the_seed():
    classes = parse_classes(["a:0.2:20", "b:0.8:200"])
    x = assign(classes, 5000, seed=3)
    assert x == assign(classes, 5000, seed=3) and x != assign(classes, 5000, seed=4)
    assert abs(x.count(0) / 5000 - 0.2) < 0.03


def test_mixed_replay_reports_each_class_and_urgency_saves_the_interactive_class():
    """A CPU-like table (a sample added to a batch costs half a run), 8 stages: 20% interactive (SLA 2 x t1,
    level 1), 80% bulk (SLA 20 x t1, level 2) at 90% load. Triton's batcher (graph:0, queue ordered by level)
    makes interactive requests wait for the running batch; eager lets them in at the next boundary."""
    t1 = 8.0
    classes = [TrafficClass("interactive", 0.2, 2 * t1, 1), TrafficClass("bulk", 0.8, 20 * t1, 2)]
    res = simulate_mixed(table(0.5), [0.9], classes, max_batch_size=8, policies={"eager": "eager:urgency=true", "graph_0ms":
                         "graph:0"}, seeds=2, requests=600, t1_ms=t1)
    cells = {c["policy"]: c["classes"] for c in res["cells"]}
    assert set(cells["eager"]) == {"interactive", "bulk"}
    assert cells["eager"]["interactive"]["violations"] * 3 < cells["graph_0ms"]["interactive"]["violations"]
    assert cells["eager"]["bulk"]["throughput"] > 0.9 * cells["graph_0ms"]["bulk"]["throughput"]
