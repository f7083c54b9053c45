"""The CPU share's cost benchmark on real members (two processes of one share): what it counts is there, and its
page judges the figure by the one rule. Its figure itself is the benchmark's (docs/results/cpu_share_cost.md)."""

from __future__ import annotations

import pytest

from benchmarks import bench_cpu_share_cost as bench
from benchmarks.harness.verdict import VERDICTS
from lazybatch.backend.os_weights import Privileges
from lazybatch.batcher.cpu_rank import NICE_STEPS


@pytest.mark.skipif(not Privileges.probe().cap_sys_nice,
                    reason="needs CAP_SYS_NICE to lower the large member and put it back (CI runs as root)")
def test_one_repetition_counts_the_looks_syscalls_and_requests_of_both_members():
    small, large = bench.one_rep(1.5, {"small": 60.0, "large": 30.0}, {"small": 2, "large": 6}, seed=0,
                                 pool_workers=2)
    assert small["name"] == "small" and large["name"] == "large"
    assert small["requests"] > 20 and large["requests"] > 10
    assert small["looks"] >= 5 and len(small["look_cpu_us"]) == small["looks"] and small["look_cpu_s"] > 0
    # the large one yielded to the small one: lowered (its threads set once each), the small one never touched
    assert NICE_STEPS[1] in large["nices"] and large["syscalls"] >= large["threads"] and large["lowered_s"] > 0.5
    assert small["nices"] == [0] and small["syscalls"] == 0 and small["refused"] == large["refused"] == 0
    # the parked pool: once the other member is seen active, both workers unparked and parked again around every
    # request, each syscall timed (before that first look, nothing is parked); the watcher may also park an idle
    # pool when it first sees the other member (a parking no request ended with): every parking is undone once
    for m in (small, large):
        assert m["pool_workers"] == 2 and m["park_syscalls"] == 4 * m["parks"] and m["park_s"] > 0
        assert m["parked_requests"] <= m["parks"] <= m["parked_requests"] + 3
        assert m["parked_requests"] >= 0.5 * m["requests"]
    cpu = sum(m["look_cpu_s"] + m["note_active_s"] + m["park_s"] for m in (small, large))
    data = {"meta": {"command": "python -m benchmarks.bench_cpu_share_cost", "commit": "abc1234", "data": "x.json",
                     "t1_ms": 5.0, "rates": {"small": 60.0, "large": 30.0}, "threads": {"small": 2, "large": 6},
                     "reps": 1, "seconds": 1.5, "pool_workers": 2},
            "reps": [{"members": [small, large], "cost_per_request_us": cpu / 100 * 1e6,
                      "fraction_of_t1": cpu / 100 / 5e-3, "syscalls_per_request": 0.1, "note_active_us": 1.0,
                      "park_us": 2.0, "park_syscalls_per_request": 4.0}]}
    text = bench.markdown(data)
    verdict = [line for line in text.splitlines() if line.startswith("| share CPU per request / ")]
    assert len(verdict) == 1 and verdict[0].rstrip(" |").rsplit("| ", 1)[1] in VERDICTS, text
