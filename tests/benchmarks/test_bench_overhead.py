"""bench_overhead's turns: every route measured once per turn, in an order that changes, so no route always follows
the same one (a fixed rotation put the route after t1 2.7% under t1 on the MLP)."""

from __future__ import annotations

import numpy as np

from benchmarks import bench_overhead
from benchmarks.harness.inprocess import Answered

bo = bench_overhead


class _Stats:
    inline_requests = 0


class _Inline:
    """A runtime stand-in that answers inline and logs the order of the calls it sees."""

    inline = True

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log, self.stats = name, log, _Stats()
        self.route = self  # the runtime's inline route (InlineRoute.run) is this fake's run
        self.respond = Answered()  # as the benchmark builds its runtimes

    def run(self, requests):
        self.log.append(self.name)
        self.stats.inline_requests += 1
        return [{}]

    def settled_stats(self):
        return self.stats


class _Whole:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def run(self, stage, feeds):
        self.log.append("whole")
        return {}


def test_each_route_once_per_turn_in_changing_orders():
    log: list[str] = []
    runtimes = {"a": _Inline("a", log), "b": _Inline("b", log)}
    fig = bo.one_round(_Whole(log), runtimes, np.zeros((1, 4), np.float32), 40, np.random.default_rng(0))
    turns = [log[i:i + 4] for i in range(0, len(log), 4)]  # t1, t1 again, a, b
    assert len(turns) == 40
    assert all(sorted(t) == ["a", "b", "whole", "whole"] for t in turns)
    # the route just before "a" is not always the same one
    before_a = {t[t.index("a") - 1] for t in turns if t.index("a") > 0}
    assert len(before_a) >= 2
    assert fig["a_inline_share"] == 1.0 and fig["b_inline_share"] == 1.0
    assert {"t1_ms", "t1_again_cost", "a_ms", "a_cost", "b_ms", "b_cost"} <= set(fig)
