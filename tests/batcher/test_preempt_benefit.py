"""lazy:preempt=benefit: a preemption must also lower the summed latency it predicts from the latency table.

Eight stages of 1 ms at batch 1 and 1.2 ms at batch 2 (batching nearly free). A second request arriving early in
the first one's pass is worth preempting for (both finish sooner than one after the other); one arriving during stage 6
of 8 is not: finishing the first (2 ms) and then running the second (8 ms) beats preempting (6 ms for the second
to catch up, then 2.4 ms together, with the first waiting all along).
"""

from __future__ import annotations

import pytest

from lazybatch.batcher import LatencyTable, ModelGraph, Request, StageType
from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.lengths import LengthHistogram
from lazybatch.batcher.policies.spec import parse_policy
from lazybatch.formats.histograms import shipped_histogram
from lazybatch.simulator import paper_tables, workload
from lazybatch.simulator.engine import Simulation

MS = 1e-3


def _table() -> LatencyTable:
    graph = ModelGraph("nearly_free", [(f"s{i}", StageType.STATIC) for i in range(8)])
    return LatencyTable(graph, [1, 2], [[1 * MS, 1.2 * MS] for _ in range(8)])


def _serve(policy: str, second_at: float) -> list[float]:
    reqs = [Request(0, 0.0, sla=1.0), Request(1, second_at, sla=1.0)]
    Simulation(_table(), parse_policy(policy).build(max_batch_size=2)).run(reqs)
    return [(r.finish - r.arrival) / MS for r in reqs]


def test_the_paper_rule_preempts_late_and_the_benefit_rule_does_not():
    slack = _serve("lazy", 5.5 * MS)  # the deadline allows it, so the slack test preempts at stage 6
    assert slack == pytest.approx([6 + 6 + 2.4, 6 + 6 + 2.4 - 5.5])
    benefit = _serve("lazy:preempt=benefit", 5.5 * MS)  # the first finishes, then the second runs alone
    assert benefit == pytest.approx([8, 8 + 8 - 5.5])
    assert sum(benefit) < sum(slack)


@pytest.mark.parametrize("policy", ["lazy:preempt=benefit", "oracle:preempt=benefit"])
def test_the_benefit_rule_still_preempts_early(policy):
    # at stage 1 of 8: the second catches up in 1 ms and both ride the cheap batch (7 x 1.2 ms)
    assert _serve(policy, 0.5 * MS) == pytest.approx([1 + 1 + 8.4, 1 + 1 + 8.4 - 0.5])


def test_the_rule_is_checked_and_named():
    with pytest.raises(ConfigError, match="preempt must be one of slack, benefit"):
        parse_policy("lazy:preempt=sometimes").build(max_batch_size=8)
    p = parse_policy("lazy:preempt=Benefit").build(max_batch_size=2)
    Simulation(_table(), p)
    assert p.preempt == "benefit" and "preempt=benefit" in p.describe()
    assert parse_policy("lazy").build().preempt == "slack"


def test_seq2seq_models_keep_the_slack_rule():
    table, hist = paper_tables.gnmt(), LengthHistogram.load(shipped_histogram())
    done = {}
    for policy in ("lazy", "lazy:preempt=benefit"):
        reqs = workload.requests(workload.poisson(200.0, 200, 1, graph=table.graph, lengths=hist), 0.5)
        Simulation(table, parse_policy(policy).build(max_batch_size=16, length_histogram=hist)).run(reqs)
        done[policy] = [r.finish for r in reqs]
    assert done["lazy"] == done["lazy:preempt=benefit"]
