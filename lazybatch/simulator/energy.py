"""Modelled energy of stage runs, for tables that carry it (``meta.energy_uj`` from the NPU model).

The NPU model prices every stage run (one stage at one batch size) in microjoules: MACs, vector ops, SRAM and DRAM
bytes times per-operation constants (docs/npu.md). A simulated run sums that over the stage runs it executed, so
"energy per request" is the *modelled dynamic* energy the batches cost, divided by the completed requests. Static
(leakage, idle) power is not modelled: an idle NPU costs nothing here, so the figure rewards batching (fewer
weight fetches per request) and never penalises waiting. Nothing is measured.
"""

from __future__ import annotations

import math
from typing import Any

from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.latency_table import LatencyTable

META_KEY = "energy_uj"  # meta[META_KEY][stage][j]: microjoules of one run of that stage at batch_sizes[j]


def _densify(sizes: tuple[int, ...], row: list[float]) -> list[float]:
    out = [0.0] * (sizes[-1] + 1)
    for k, b in enumerate(sizes):
        out[b] = row[k]
        if k + 1 < len(sizes):
            b1, v0, v1 = sizes[k + 1], row[k], row[k + 1]
            for x in range(b + 1, b1):
                out[x] = v0 + (v1 - v0) * (x - b) / (b1 - b)
    return out


def stage_energy(table: LatencyTable) -> list[list[float]] | None:
    """``dense[s][b]``: joules of one run of stage s at batch size b, linearly interpolated between the table's
    batch sizes (as its latencies are); None when the table carries no energy (measured tables)."""
    raw: Any = table.meta.get(META_KEY)
    if raw is None:
        return None
    where = f"meta.{META_KEY}"
    sizes = table.batch_sizes
    if not isinstance(raw, list) or len(raw) != table.graph.n:
        raise ConfigError(f"{where} must be a list with one row per stage ({table.graph.n}), got "
                          f"{len(raw) if isinstance(raw, list) else type(raw).__name__}", field=where,
                          source=table.name)
    dense = []
    for s, row in enumerate(raw):
        if not isinstance(row, list) or len(row) != len(sizes):
            raise ConfigError(f"{where}[{s}] must hold one value per batch size {list(sizes)}", field=where,
                              source=table.name)
        for v in row:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"{where}[{s}]: energies must be finite numbers >= 0 (microjoules), got {v!r}",
                                  field=where, source=table.name)
        dense.append(_densify(sizes, [float(v) * 1e-6 for v in row]))
    return dense


def per_request(energy_j: float | None, completed: int) -> tuple[float, float]:
    """(millijoules per completed request, completed requests per joule); NaN where not modelled."""
    if energy_j is None or completed <= 0 or energy_j <= 0:
        return float("nan"), float("nan")
    return energy_j / completed * 1e3, completed / energy_j
