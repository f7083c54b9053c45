"""A served experiment replayed on a virtual clock: the same scheduler and the model's own latency table, at the same
loads, with no serving cost.

Why: a real-server figure mixes what a policy decides with what serving costs (the backend's per-stage hand-off,
Python, a CPU shared with the load generator). Replaying the loads on the table the policies read separates the two.
A goal that the simulated policy misses is beyond the algorithm on this model and hardware, however lean the
implementation; a goal it meets and the server misses is lost to serving cost. benchmarks/bench_default.py puts
both on its results page.

Loads are fractions of the table's own batch-1 rate (1 / t1, t1 the mean latency of a request served alone on the
virtual clock), as the server's loads are fractions of its measured batch-1 rate; SLA targets are the same multiples
of that t1.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

from lazybatch.batcher.decisions import DecisionLog
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.lengths import LengthHistogram
from lazybatch.batcher.policies.spec import parse_policy
from lazybatch.formats.histograms import shipped_histogram

from . import paper_tables, workload
from .engine import Simulation
from .metrics import measure

# Simulated counterparts of the served policies: graph:N is Triton's dynamic batcher with max_queue_delay N ms
# (batcher/policies/graph_batching.py), which the benchmarks serve as triton_<N*1000>us (graph_<N>ms for seq2seq).
# lazy_benefit is lazy with preempt=benefit (batcher/policies/lazy.py); seq2seq models, where that rule does not
# apply, leave it out.
POLICIES: dict[str, str] = {"lazy": "lazy", "lazy_benefit": "lazy:preempt=benefit", "oracle": "oracle",
                            "serial": "serial", "graph_0ms": "graph:0", "graph_5ms": "graph:5", "graph_20ms": "graph:20"}
BASELINES = ("graph_0ms", "graph_5ms", "graph_20ms")
VARIANTS = ("lazy_benefit",)  # lazy with a knob set: not one of "all policies" when lazy is judged


@dataclass
class LoadsOnTable:
    """What each policy achieved at each load, averaged over seeds (one row per load and policy)."""

    t1_ms: float
    mu: float  # requests/s, 1 / t1
    sla_multiples: list[float]
    sched_multiple: float
    max_batch_size: int
    seeds: int
    requests: int
    cells: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"t1_ms": self.t1_ms, "mu": self.mu, "sla_multiples": self.sla_multiples,
                "sched_multiple": self.sched_multiple, "max_batch_size": self.max_batch_size, "seeds": self.seeds,
                "requests": self.requests, "cells": self.cells}

    def cell(self, load: float, policy: str) -> dict[str, Any] | None:
        for c in self.cells:
            if c["policy"] == policy and abs(c["load"] - load) < 1e-9:
                return c
        return None


def _histogram(table: LatencyTable, histogram: LengthHistogram | None) -> LengthHistogram | None:
    if not table.graph.is_seq2seq:
        return None
    return histogram if histogram is not None else LengthHistogram.load(shipped_histogram())


def single_request_ms(table: LatencyTable, histogram: LengthHistogram | None = None, *, n: int = 200,
                      seed: int = 0) -> float:
    """Mean latency of a request served alone (serial, arrivals far apart), lengths drawn as under load."""
    hist = _histogram(table, histogram)
    spread = [workload.Arrival(a.time, a.enc_steps, a.dec_steps)
              for a in workload.poisson(1.0, n, seed, graph=table.graph, lengths=hist)]
    gap = 1e3 * sum(table.single) * max(1, max(max(a.enc_steps, a.dec_steps) for a in spread))
    arrivals = [workload.Arrival(i * gap, a.enc_steps, a.dec_steps) for i, a in enumerate(spread)]
    reqs = workload.requests(arrivals, gap)
    Simulation(table, parse_policy("serial").build(max_batch_size=1), log=DecisionLog(1, enabled=False)).run(reqs)
    return statistics.fmean(r.finish - r.arrival for r in reqs) * 1e3


def simulate_loads(table: LatencyTable, loads: Sequence[float], *, max_batch_size: int,
                   sla_multiples: Sequence[float] = (2, 5, 10), sched_multiple: float = 5,
                   policies: dict[str, str] | None = None, seeds: int = 3, requests: int = 1000,
                   histogram: LengthHistogram | None = None, t1_ms: float | None = None) -> LoadsOnTable:
    """Every policy at every load (fractions of 1/t1) on ``table``: seeded Poisson arrivals, each request carrying
    the ``sched_multiple`` x t1 deadline, violations counted at every ``sla_multiples`` x t1. ``t1_ms``: the
    caller's ``single_request_ms`` of this table and histogram, when it needed it first."""
    hist = _histogram(table, histogram)
    t1 = (t1_ms if t1_ms is not None else single_request_ms(table, hist)) / 1e3
    out = LoadsOnTable(t1_ms=t1 * 1e3, mu=1.0 / t1, sla_multiples=[float(m) for m in sla_multiples],
                       sched_multiple=float(sched_multiple), max_batch_size=max_batch_size, seeds=seeds,
                       requests=requests)
    slas = [m * t1 for m in sla_multiples]
    for load in loads:
        for name, text in (policies or POLICIES).items():
            if table.graph.is_seq2seq and "preempt=benefit" in text:
                continue
            runs = []
            for seed in range(seeds):
                arrivals = workload.poisson(load / t1, requests, seed, graph=table.graph, lengths=hist)
                reqs = workload.requests(arrivals, sched_multiple * t1)
                policy = parse_policy(text).build(max_batch_size=max_batch_size, length_histogram=hist)
                log = DecisionLog(capacity=1, enabled=False)
                sim = Simulation(table, policy, log=log)
                sim.run(reqs)
                runs.append(measure(reqs, sla_targets=slas, batch_hist=sim.batch_hist, stage_execs=sim.stage_execs,
                                    decisions=log.counts))
            out.cells.append({
                "load": float(load), "policy": name, "rate": load / t1,
                "avg_ms": statistics.fmean(m.avg_latency for m in runs) * 1e3,
                "p99_ms": statistics.fmean(m.p99_latency for m in runs) * 1e3,
                "throughput": statistics.fmean(m.throughput for m in runs),
                "mean_batch": statistics.fmean(m.mean_batch for m in runs),
                "violations": {f"{mult:g}x": statistics.fmean(m.violations[s] for m in runs)
                               for mult, s in zip(sla_multiples, slas)},
            })
    return out


def from_dict(data: dict[str, Any]) -> LoadsOnTable:
    return LoadsOnTable(**data)
