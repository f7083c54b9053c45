"""From ONNX to latency tables: the NPU-modelled counterpart of ``lazybatch profile``.

A target is a split directory (``manifest.json`` and one ONNX file per stage, from ``lazybatch split``) or a single
ONNX file (one stage holding the whole model). The table has one row per stage, typed as the manifest says
(STATIC / ENCODER / DECODER), and one column per batch size; the scheduler core and the simulator read it as they
read measured tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.graph import ModelGraph, StageType
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.formats.stage_manifest import load_manifest

from .config import NPUConfig
from .cost import Cost
from .onnx_front import OnnxModel

@dataclass
class StageModel:
    name: str
    type: StageType
    model: OnnxModel


def load_stages(target: str | Path) -> tuple[str, list[StageModel]]:
    """The stages of a split directory, or one stage for a single ONNX file."""
    p = Path(target)
    if p.is_dir():  # a split directory, read by the one stage-folder loader
        man = load_manifest(p)
        return man.model, [StageModel(st.name, st.type, OnnxModel(p / st.file, name=st.name)) for st in man.stages]
    if p.suffix.lower() != ".onnx":
        raise ConfigError("expected an .onnx file or a directory written by `lazybatch split`", source=str(p))
    model = OnnxModel(p)
    return model.name, [StageModel(model.name, StageType.STATIC, model)]


def stage_costs(stages: Sequence[StageModel], batch_sizes: Sequence[int], cfg: NPUConfig, *,
                strict: bool = False, progress: bool = False) -> list[list[Cost]]:
    """``costs[s][j]``: stage s at ``batch_sizes[j]``."""
    bar = tqdm(total=len(stages) * len(batch_sizes), desc="npu latency", unit="query", disable=not progress)
    out = []
    for st in stages:
        row = []
        for b in batch_sizes:
            row.append(st.model.cost(b, cfg, strict=strict))
            bar.update(1)
        out.append(row)
    bar.close()
    return out


def check_batch_sizes(batch_sizes: Sequence[int]) -> list[int]:
    sizes = list(batch_sizes)
    if not sizes or any(not isinstance(b, int) or b < 1 for b in sizes):
        raise ConfigError(f"batch sizes must be positive integers, got {sizes}", field="batch")
    if 1 not in sizes:
        raise ConfigError("batch size 1 is needed (the slack predictor uses single-input latencies)", field="batch")
    return sorted(set(sizes))


def latency_table(target: str | Path, batch_sizes: Sequence[int], cfg: NPUConfig, *, name: str | None = None,
                  strict: bool = False, progress: bool = False) -> tuple[LatencyTable, list[list[Cost]]]:
    """The NPU-modelled latency table of ``target`` and the per-stage costs behind it."""
    sizes = check_batch_sizes(batch_sizes)
    model_name, stages = load_stages(target)
    costs = stage_costs(stages, sizes, cfg, strict=strict, progress=progress)
    graph = ModelGraph(name or model_name, [(s.name, s.type) for s in stages])
    rows = [[max(c.seconds(cfg), 1e-12) for c in row] for row in costs]
    unknown = sorted({op for row in costs for c in row for op in c.unknown_ops})
    meta: dict[str, Any] = {
        "npu": cfg.to_dict(),
        "source": str(target),
        "cycles": [[round(c.cycles) for c in row] for row in costs],
        "energy_uj": [[c.energy_pj * 1e-6 for c in row] for row in costs],
        "dram_bytes": [[int(c.dram_bytes) for c in row] for row in costs],
        "unknown_ops": unknown,
    }
    prov = (f"lazybatch npu latency: analytical {cfg.rows}x{cfg.cols} systolic-array model ({cfg.dataflow.upper()}), "
            f"{cfg.freq_hz / 1e6:g} MHz, {cfg.act_sram_bytes / 2**20:g}+{cfg.wgt_sram_bytes / 2**20:g} MiB SRAM, "
            f"{cfg.dram_bw_bytes_s / 1e9:g} GB/s, {cfg.mem_latency_cycles}-cycle memory latency, "
            f"{cfg.dtype_bytes}-byte data, of {target}")
    return LatencyTable(graph, sizes, rows, provenance=prov, meta=meta), costs
