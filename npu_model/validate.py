"""Our cycle counts against SCALE-Sim's, layer by layer, and the cost of one query against one SCALE-Sim run.

Used by ``lazybatch npu validate`` and ``benchmarks/bench_npu.py``. Identical layer shapes give identical cycle
counts in both simulators, so each distinct shape is simulated once and weighted by its number of occurrences in
the network total.
"""

from __future__ import annotations

import timeit
from dataclasses import asdict, dataclass
from typing import Sequence

from tqdm import tqdm

from .config import NPUConfig
from .systolic import ConvLayer, array_cycles, conv_cost


@dataclass
class LayerCheck:
    name: str
    shape: str
    count: int
    dataflow: str
    ours: int
    scalesim: int
    error_pct: float
    query_us: float
    scalesim_s: float

    @property
    def time_ratio(self) -> float:
        return self.query_us * 1e-6 / self.scalesim_s if self.scalesim_s else float("nan")


def query_seconds(layer: ConvLayer, cfg: NPUConfig, dataflow: str, *, repeat: int = 2000) -> float:
    """Mean wall time of one latency query (one layer, batch 1): cycles, traffic, roofline and energy."""
    return timeit.timeit(lambda: conv_cost(layer, cfg, 1, dataflow=dataflow), number=repeat) / repeat


def check_layers(layers: Sequence[tuple[ConvLayer, int]], cfg: NPUConfig, dataflows: Sequence[str], *,
                 progress: bool = True) -> list[LayerCheck]:
    from .scalesim_ref import run_layer

    out = []
    bar = tqdm(total=len(layers) * len(dataflows), desc="SCALE-Sim", unit="layer", disable=not progress)
    for df in dataflows:
        for layer, count in layers:
            ref = run_layer(layer, cfg, dataflow=df)
            ours = array_cycles(layer.gemm(1), cfg, df)
            err = (ours - ref.cycles) / ref.cycles * 100 if ref.cycles else float("inf")
            shape = f"{layer.h}x{layer.w}x{layer.c} k{layer.r}x{layer.s}/{layer.stride} -> {layer.m}"
            out.append(LayerCheck(layer.name, shape, count, df, ours, ref.cycles, err,
                                  query_seconds(layer, cfg, df) * 1e6, ref.seconds))
            bar.update(1)
    bar.close()
    return out


def summarize(checks: Sequence[LayerCheck]) -> dict[str, dict[str, float]]:
    """Per dataflow: worst per-layer |error|, network error (occurrence-weighted), worst and median time ratio."""
    out: dict[str, dict[str, float]] = {}
    for df in sorted({c.dataflow for c in checks}):
        cs = [c for c in checks if c.dataflow == df]
        ours = sum(c.ours * c.count for c in cs)
        ref = sum(c.scalesim * c.count for c in cs)
        ratios = sorted(c.time_ratio for c in cs)
        out[df] = {"layers": len(cs), "network_layers": sum(c.count for c in cs),
                   "worst_layer_error_pct": max(abs(c.error_pct) for c in cs),
                   "network_error_pct": (ours - ref) / ref * 100, "network_cycles_ours": ours,
                   "network_cycles_scalesim": ref, "worst_time_ratio": ratios[-1],
                   "median_time_ratio": ratios[len(ratios) // 2],
                   "scalesim_seconds": sum(c.scalesim_s for c in cs)}
    return out


def markdown(checks: Sequence[LayerCheck]) -> str:
    lines = ["| layer | shape (padded HxWxC, kernel/stride -> filters) | x | dataflow | ours (cycles) | SCALE-Sim | "
             "error % | query (us) | SCALE-Sim (s) | time ratio |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in checks:
        lines.append(f"| {c.name} | {c.shape} | {c.count} | {c.dataflow} | {c.ours} | {c.scalesim} | "
                     f"{c.error_pct:+.3f} | {c.query_us:.1f} | {c.scalesim_s:.2f} | 1/{1 / c.time_ratio:,.0f} |")
    return "\n".join(lines)


def as_rows(checks: Sequence[LayerCheck]) -> list[dict]:
    return [dict(asdict(c), time_ratio=c.time_ratio) for c in checks]
