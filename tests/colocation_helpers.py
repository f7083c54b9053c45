"""Tables and runs the co-location tests share (batcher/device.py, lazybatch/simulator/colocated.py)."""

from __future__ import annotations

from typing import Sequence

from lazybatch.batcher import LatencyTable, ModelGraph, StageType
from lazybatch.batcher.decisions import DecisionLog
from lazybatch.batcher.policies.spec import parse_policy
from lazybatch.batcher.request import Request
from lazybatch.simulator.colocated import Tenant


def linear_table(n: int, unit: float, name: str = "m", max_batch: int = 64) -> LatencyTable:
    """``n`` static stages of ``unit`` seconds at batch 1, ``b x unit`` at batch b: batching buys nothing, so a
    policy runs one request at a time and a backlog stays a backlog."""
    graph = ModelGraph(name, [(f"s{i}", StageType.STATIC) for i in range(n)])
    return LatencyTable(graph, [1, max_batch], [[unit, unit * max_batch] for _ in range(n)])


def flat(n: int, unit: float, name: str = "m", max_batch: int = 64) -> LatencyTable:
    """``n`` static stages of ``unit`` seconds at every batch size (batching is free)."""
    graph = ModelGraph(name, [(f"s{i}", StageType.STATIC) for i in range(n)])
    return LatencyTable(graph, [1, max_batch], [[unit, unit] for _ in range(n)])


def periodic(n: int, gap: float, sla: float, start: float = 0.0, priority: int = 0) -> list[Request]:
    return [Request(i, start + i * gap, sla=sla, priority=priority) for i in range(n)]


def tenant(name: str, table: LatencyTable, reqs: Sequence[Request], policy: str = "eager", *, weight: float = 1.0,
           priority: int = 0, log: bool = False, **kw) -> Tenant:
    return Tenant(name, table, parse_policy(policy).build(), list(reqs), weight=weight, priority=priority,
                  log=DecisionLog() if log else DecisionLog(capacity=1, enabled=False), **kw)
