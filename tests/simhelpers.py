"""Shared helpers for the scheduler-core and simulator tests."""

from __future__ import annotations

from typing import Sequence

from lazybatch.batcher import LatencyTable, ModelGraph, StageType


def flat_table(n: int = 8, unit: float = 1.0, max_batch: int = 64, names: Sequence[str] | None = None,
               types: Sequence[StageType] | None = None) -> LatencyTable:
    """Every stage takes ``unit`` at every batch size: the paper's worked examples count in such time units."""
    names = list(names or [chr(ord("A") + i) for i in range(n)])
    types = list(types or [StageType.STATIC] * n)
    graph = ModelGraph("example", list(zip(names, types)))
    sizes = [1, max_batch] if max_batch > 1 else [1]
    return LatencyTable(graph, sizes, [[unit] * len(sizes) for _ in names])
