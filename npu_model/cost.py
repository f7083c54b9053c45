"""The answer to one timing query: cycles, time, utilization, traffic and energy, summable over nodes and stages."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from .config import NPUConfig
from .energy import EnergyModel


@dataclass
class Cost:
    """Cost of running something once on the NPU.

    ``cycles`` is the modelled latency: per node max(compute, DRAM transfer) plus one exposed memory latency when the
    node touches DRAM (double buffering hides the latency of every later tile). ``compute_cycles`` counts the
    systolic array's busy cycles (the number SCALE-Sim reports) plus the vector unit's.
    """

    cycles: float = 0.0
    compute_cycles: float = 0.0
    array_cycles: float = 0.0
    vector_cycles: float = 0.0
    memory_cycles: float = 0.0
    macs: float = 0.0
    vector_ops: float = 0.0
    dram_bytes: float = 0.0
    sram_bytes: float = 0.0
    energy_pj: float = 0.0
    nodes: int = 0
    unknown_ops: list[str] = field(default_factory=list)

    def __add__(self, other: "Cost") -> "Cost":
        out = Cost()
        for f in fields(Cost):
            a, b = getattr(self, f.name), getattr(other, f.name)
            setattr(out, f.name, a + b)
        return out

    def __iadd__(self, other: "Cost") -> "Cost":
        for f in fields(Cost):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    @property
    def bound(self) -> str:
        return "memory" if self.memory_cycles > self.compute_cycles else "compute"

    def seconds(self, cfg: NPUConfig) -> float:
        return self.cycles / cfg.freq_hz

    def microseconds(self, cfg: NPUConfig) -> float:
        return self.cycles / cfg.freq_hz * 1e6

    def utilization(self, cfg: NPUConfig) -> float:
        """Fraction of the array's MAC slots doing useful work over the modelled latency."""
        return self.macs / (self.cycles * cfg.rows * cfg.cols) if self.cycles else 0.0

    def summary(self, cfg: NPUConfig) -> dict[str, float | int | str | list[str]]:
        return {"cycles": round(self.cycles), "us": self.microseconds(cfg), "compute_cycles": round(self.compute_cycles),
                "array_cycles": round(self.array_cycles), "vector_cycles": round(self.vector_cycles),
                "memory_cycles": round(self.memory_cycles), "bound": self.bound,
                "utilization": self.utilization(cfg), "macs": int(self.macs), "dram_bytes": int(self.dram_bytes),
                "sram_bytes": int(self.sram_bytes), "energy_uj": self.energy_pj * 1e-6, "nodes": self.nodes,
                "unknown_ops": sorted(set(self.unknown_ops))}


def finish(cfg: NPUConfig, *, array_cycles: float = 0.0, vector_cycles: float = 0.0, macs: float = 0.0,
           vector_ops: float = 0.0, dram_bytes: float = 0.0, sram_bytes: float = 0.0,
           unknown: list[str] | None = None) -> Cost:
    """Combine compute and DRAM transfer of one node with the roofline rule and price its energy."""
    compute = array_cycles + vector_cycles
    memory = dram_bytes / cfg.bytes_per_cycle
    cycles = max(compute, memory) + (cfg.mem_latency_cycles if dram_bytes > 0 else 0)
    energy = EnergyModel.for_dtype(cfg.dtype_bytes).energy_pj(macs, vector_ops, sram_bytes, dram_bytes)
    return Cost(cycles=cycles, compute_cycles=compute, array_cycles=array_cycles, vector_cycles=vector_cycles,
                memory_cycles=memory, macs=macs, vector_ops=vector_ops, dram_bytes=dram_bytes,
                sram_bytes=sram_bytes, energy_pj=energy, nodes=1, unknown_ops=list(unknown or []))
