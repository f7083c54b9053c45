"""Energy per operation and per byte moved: order-of-magnitude estimates, not measurements.

Source: M. Horowitz, "Computing's Energy Problem (and what we can do about it)", ISSCC 2014, keynote figures for a
45 nm process at 0.9 V:
  * 8-bit integer multiply 0.2 pJ, add 0.03 pJ; 16-bit float multiply 1.1 pJ, add 0.4 pJ; 32-bit float
    multiply 3.7 pJ, add 0.9 pJ. A multiply-accumulate is counted as one multiply plus one add.
  * SRAM read of 64 bits from a 1 MB array: about 100 pJ, i.e. 12.5 pJ per byte (our SRAMs are 4 and 8 MB, built
    from banks of about that size).
  * DRAM access of 64 bits: 1.3-2.6 nJ; we take 2.0 nJ, i.e. 250 pJ per byte.
Newer processes are several times cheaper per operation; the ratios (DRAM >> SRAM >> MAC) are what matter for
comparing batch sizes and dataflows, and those hold across nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

#: dtype bytes -> (multiply pJ, add pJ), Horowitz ISSCC 2014 (45 nm)
ARITH_PJ: dict[int, tuple[float, float]] = {1: (0.2, 0.03), 2: (1.1, 0.4), 4: (3.7, 0.9)}
SRAM_PJ_PER_BYTE = 100.0 / 8  # 64-bit read from a 1 MB SRAM
DRAM_PJ_PER_BYTE = 2000.0 / 8  # 64-bit DRAM access, midpoint of 1.3-2.6 nJ


@dataclass(frozen=True)
class EnergyModel:
    """Per-event energies in picojoules for one data width."""

    mac_pj: float
    vector_op_pj: float
    sram_byte_pj: float = SRAM_PJ_PER_BYTE
    dram_byte_pj: float = DRAM_PJ_PER_BYTE

    @classmethod
    def for_dtype(cls, dtype_bytes: int) -> "EnergyModel":
        mul, add = ARITH_PJ[dtype_bytes]
        return cls(mac_pj=mul + add, vector_op_pj=add)

    def energy_pj(self, macs: float, vector_ops: float, sram_bytes: float, dram_bytes: float) -> float:
        return (macs * self.mac_pj + vector_ops * self.vector_op_pj + sram_bytes * self.sram_byte_pj
                + dram_bytes * self.dram_byte_pj)
