"""The NPU's configuration: array, clock, SRAM, DRAM and data width, defaulting to the LazyBatching paper's Table I.

Table I (seed 001, section V): 128x128 systolic array at 700 MHz, 8 MB activation SRAM and 4 MB weight SRAM,
8 memory channels, 100-cycle memory latency, 360 GB/s. The paper does not give the data width; a TPU-like
inference NPU (TPU v1, the paper's reference [40]) computes in 8-bit integers, and SCALE-Sim counts 1-byte words,
so ``dtype_bytes`` defaults to 1.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from lazybatch.batcher.errors import ConfigError

MiB = 1024 * 1024
DATAFLOWS = ("os", "ws")


@dataclass(frozen=True)
class NPUConfig:
    """A systolic-array NPU. Sizes in bytes, bandwidth in bytes/s, clock in Hz."""

    rows: int = 128
    cols: int = 128
    freq_hz: float = 700e6
    act_sram_bytes: int = 8 * MiB
    wgt_sram_bytes: int = 4 * MiB
    mem_channels: int = 8
    mem_latency_cycles: int = 100
    dram_bw_bytes_s: float = 360e9
    dataflow: str = "ws"  # TPU-like: weight stationary
    dtype_bytes: int = 1
    vector_lanes: int = 0  # 0: as many lanes as the array has columns (TPU v1's activation pipeline)
    double_buffer: bool = True  # half of each SRAM is being filled while the other half is computed on
    # WS only: load the next weight tile into the array while the current one computes (TPU v1's double-buffered
    # weight registers). Off by default: SCALE-Sim, which the model is validated against, loads weights serially.
    weight_prefetch: bool = False

    def __post_init__(self) -> None:
        for name in ("rows", "cols", "act_sram_bytes", "wgt_sram_bytes", "mem_channels", "dtype_bytes"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"must be a positive integer, got {v!r}", field=name)
        for name in ("freq_hz", "dram_bw_bytes_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"must be a positive number, got {v!r}", field=name)
        if not isinstance(self.mem_latency_cycles, int) or self.mem_latency_cycles < 0:
            raise ConfigError(f"must be a non-negative integer, got {self.mem_latency_cycles!r}",
                              field="mem_latency_cycles")
        if not isinstance(self.vector_lanes, int) or self.vector_lanes < 0:
            raise ConfigError(f"must be a non-negative integer, got {self.vector_lanes!r}", field="vector_lanes")
        for name in ("double_buffer", "weight_prefetch"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"must be true or false, got {getattr(self, name)!r}", field=name)
        if self.dataflow not in DATAFLOWS:
            raise ConfigError(f"unknown dataflow {self.dataflow!r}; use 'os' (output stationary) or 'ws' "
                              "(weight stationary)", field="dataflow")
        if self.dtype_bytes not in (1, 2, 4):
            raise ConfigError(f"data width must be 1, 2 or 4 bytes, got {self.dtype_bytes}", field="dtype_bytes")

    # ---------------------------------------------------------------- derived
    @property
    def lanes(self) -> int:
        return self.vector_lanes or self.cols

    @property
    def bytes_per_cycle(self) -> float:
        """DRAM bytes per NPU cycle (360 GB/s at 700 MHz: about 514)."""
        return self.dram_bw_bytes_s / self.freq_hz

    @property
    def act_tile_bytes(self) -> int:
        return self.act_sram_bytes // 2 if self.double_buffer else self.act_sram_bytes

    @property
    def wgt_tile_bytes(self) -> int:
        return self.wgt_sram_bytes // 2 if self.double_buffer else self.wgt_sram_bytes

    def replace(self, **changes: Any) -> "NPUConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str | None = None) -> "NPUConfig":
        """Build from a JSON object; unknown keys are refused so that a typo is not silently ignored."""
        if not isinstance(data, Mapping):
            raise ConfigError("an NPU configuration must be a JSON object", source=source)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown keys {unknown}; known: {sorted(known)}", field=unknown[0], source=source)
        try:
            return cls(**dict(data))
        except ConfigError as e:
            raise e.at(source) from None
        except TypeError as e:  # pragma: no cover - dataclass signature errors
            raise ConfigError(str(e), source=source) from None


def parse_array(text: str) -> tuple[int, int]:
    """'128x128' -> (128, 128)."""
    parts = str(text).lower().replace(" ", "").split("x")
    try:
        rows, cols = (int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"array size must look like 128x128, got {text!r}", field="array") from None
    if rows < 1 or cols < 1:
        raise ConfigError(f"array dimensions must be positive, got {text!r}", field="array")
    return rows, cols


TABLE_I = NPUConfig()
