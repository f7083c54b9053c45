"""Mixed traffic replayed on a virtual clock: several classes of callers (deadline and priority) on one model's latency
table, per-class results, the same policies as served (docs/results/mixed.md).

Loads are fractions of the table's batch-1 rate (as in loads_on_table.py). Each request is drawn into a class with
the classes' shares (lazybatch.traffic.assign, the draw `lazybatch load --class` makes); it carries its class's SLA
and priority level. Triton's batcher is graph:N with its queue ordered by priority level; its queue timeouts are not
modelled (a request past its deadline still runs), which can only flatter it on the bulk class's throughput.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

import numpy as np

from lazybatch.batcher.decisions import DecisionLog
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.lengths import LengthHistogram
from lazybatch.batcher.policies.spec import parse_policy
from lazybatch.batcher.request import Request, Status
from lazybatch.traffic import TrafficClass, assign

from . import workload
from .engine import Simulation
from .loads_on_table import _histogram, single_request_ms

POLICIES = {"eager": "eager:urgency=true", "graph_0ms": "graph:0", "graph_5ms": "graph:5", "graph_20ms": "graph:20"}


def class_results(reqs: Sequence[Request], names: Sequence[str], span_s: float) -> dict[str, dict[str, float]]:
    """avg/p99 latency (ms, answered requests), violation rate ((late + not answered OK) / sent) and throughput
    (answered OK per second over ``span_s``) per class; ``names[i]`` is request i's class."""
    out: dict[str, dict[str, float]] = {}
    for name in dict.fromkeys(names):
        mine = [r for r, n in zip(reqs, names) if n == name]
        ok = [r for r in mine if r.status is Status.OK]
        lat = np.array([r.latency for r in ok]) * 1e3
        late = sum(1 for r in ok if r.finish > r.deadline)
        out[name] = {"sent": len(mine), "ok": len(ok),
                     "avg_ms": float(lat.mean()) if lat.size else math.nan,
                     "p99_ms": float(np.percentile(lat, 99)) if lat.size else math.nan,
                     "violations": (late + len(mine) - len(ok)) / len(mine) if mine else math.nan,
                     "throughput": len(ok) / span_s if span_s > 0 else math.nan}
    return out


def simulate_mixed(table: LatencyTable, loads: Sequence[float], classes: Sequence[TrafficClass], *,
                   max_batch_size: int, policies: dict[str, str] | None = None, seeds: int = 3,
                   requests: int = 1000, histogram: LengthHistogram | None = None,
                   t1_ms: float | None = None) -> dict[str, Any]:
    """Every policy at every load; per class the mean over seeds of ``class_results``. Classes' ``sla_ms`` are
    absolute (the caller scales them by t1, e.g. 2 x t1 for interactive)."""
    hist = _histogram(table, histogram)
    t1 = (t1_ms if t1_ms is not None else single_request_ms(table, hist)) / 1e3
    cells = []
    for load in loads:
        for name, text in (policies or POLICIES).items():
            runs = []
            for seed in range(seeds):
                arrivals = workload.poisson(load / t1, requests, seed, graph=table.graph, lengths=hist)
                which = assign(classes, len(arrivals), seed)
                reqs = [Request(i, a.time, sla=None if classes[c].sla_ms is None else classes[c].sla_ms / 1e3,
                                priority=classes[c].priority, enc_steps=a.enc_steps, dec_steps=a.dec_steps)
                        for i, (a, c) in enumerate(zip(arrivals, which))]
                policy = parse_policy(text).build(max_batch_size=max_batch_size, length_histogram=hist)
                Simulation(table, policy, log=DecisionLog(capacity=1, enabled=False)).run(reqs)
                span = max(r.finish for r in reqs if r.finish is not None) - reqs[0].arrival
                runs.append(class_results(reqs, [classes[c].name for c in which], span))
            per_class = {c.name: {k: statistics.fmean(r[c.name][k] for r in runs if c.name in r)
                                  for k in ("avg_ms", "p99_ms", "violations", "throughput")}
                         for c in classes}
            cells.append({"load": float(load), "policy": name, "classes": per_class})
    return {"t1_ms": t1 * 1e3, "classes": [c.as_dict() for c in classes], "seeds": seeds, "requests": requests,
            "cells": cells}
