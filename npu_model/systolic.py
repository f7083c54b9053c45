"""Mapping a GEMM (and so a convolution, in its im2col view) onto the systolic array, with SRAM-aware tiling.

A GEMM ``C[M, N] = A[M, K] @ B[K, N]`` (``groups`` independent copies for grouped/depthwise convolution and for
attention's batched matmuls). For a convolution, M = batch * output pixels, K = kernel window * input channels per
group, N = filters per group; A is the (never materialised) im2col matrix of the input feature map, B the filters.

Compute cycles follow the fold model SCALE-Sim 3.0.0 implements (``compute/systolic_compute_{os,ws}.py``), for an
R x C array:

* Output stationary: each PE owns one output; a fold covers R output rows and C output columns and streams the K
  reduction through, then drains: ``ceil(M/R) * ceil(N/C) * (K + R + C - 2)`` cycles.
* Weight stationary: each PE holds one weight; a fold covers R reduction rows and C output columns, spends R cycles
  loading weights, streams the M input rows through and drains: ``ceil(K/R) * ceil(N/C) * (2R + C + M - 2)``.

SCALE-Sim reports the index of the last busy cycle, one less than these counts. With ``weight_prefetch`` (WS only,
off by default) the next weight tile loads while the current one computes, as in TPU v1:
``R + ceil(K/R) * ceil(N/C) * max(M, R) + R + C - 2``.

DRAM traffic: weights (B, when it is a parameter) stream from DRAM once per use; activations stay in the
activation SRAM between layers when input and output fit together, else they go to DRAM and back. When an operand
does not fit its SRAM (half of it when double buffered) the GEMM is tiled, and one operand is re-fetched once per
tile of the other; the cheaper of the two loop orders is taken.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import NPUConfig
from .cost import Cost, finish


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Gemm:
    """``groups`` independent GEMMs of shape M x K x N; ``b_is_weight``: B comes from the weight SRAM/DRAM.

    ``a_bytes`` is the size of the A operand as stored (for a convolution the input feature map, smaller than its
    im2col matrix); 0 means M * K elements.
    """

    m: int
    k: int
    n: int
    groups: int = 1
    b_is_weight: bool = True
    a_elems: int = 0

    @property
    def macs(self) -> int:
        return self.groups * self.m * self.k * self.n


def array_cycles(g: Gemm, cfg: NPUConfig, dataflow: str | None = None) -> int:
    """Busy cycles of the systolic array for this GEMM (the fold model above)."""
    df = dataflow or cfg.dataflow
    r, c = cfg.rows, cfg.cols
    if g.m <= 0 or g.k <= 0 or g.n <= 0:
        return 0
    if df == "os":
        per = cdiv(g.m, r) * cdiv(g.n, c) * (g.k + r + c - 2)
    elif cfg.weight_prefetch:
        # the next tile's R-cycle load hides behind the current tile's M input rows; one load and one drain remain
        per = r + cdiv(g.k, r) * cdiv(g.n, c) * max(g.m, r) + r + c - 2
    else:
        per = cdiv(g.k, r) * cdiv(g.n, c) * (2 * r + c + g.m - 2)
    return g.groups * per


def sram_bytes(g: Gemm, cfg: NPUConfig, dataflow: str | None = None) -> int:
    """Bytes read from and written to the SRAMs by the array (operand re-reads across folds included)."""
    df = dataflow or cfg.dataflow
    d = cfg.dtype_bytes
    a, b, o = g.m * g.k, g.k * g.n, g.m * g.n
    if df == "os":
        per = a * cdiv(g.n, cfg.cols) + b * cdiv(g.m, cfg.rows) + o
    else:  # weights read once; inputs once per column fold; partial sums once per row fold
        per = b + a * cdiv(g.n, cfg.cols) + o * cdiv(g.k, cfg.rows)
    return g.groups * per * d


def dram_bytes(g: Gemm, cfg: NPUConfig, *, activations_in_dram: bool | None = None) -> tuple[float, int]:
    """DRAM bytes of one GEMM and the number of tiles the SRAM capacity forces (1 when everything fits).

    ``activations_in_dram`` forces activations to (True) or keeps them off (False) DRAM; None decides by capacity.
    """
    d = cfg.dtype_bytes
    a = (g.a_elems or g.m * g.k * g.groups) * d
    o = g.m * g.n * g.groups * d
    b = g.k * g.n * g.groups * d
    if not g.b_is_weight:  # both operands are activations (attention): they share the activation SRAM
        spill = activations_in_dram if activations_in_dram is not None else a + b + o > cfg.act_sram_bytes
        if not spill:
            return 0.0, 1
        tiles = cdiv(a + b, cfg.act_tile_bytes)
        return float(a + b + o + (tiles - 1) * min(a, b)), tiles
    spill = activations_in_dram if activations_in_dram is not None else a + o > cfg.act_sram_bytes
    w_tiles = cdiv(b, cfg.wgt_tile_bytes)
    a_tiles = cdiv(a, cfg.act_tile_bytes)
    if not spill:
        # Activations live in the activation SRAM; weights stream once, tile by tile, whatever their size.
        return float(b), w_tiles
    weights_outer = b + a * w_tiles  # each weight tile sweeps all inputs (re-read per weight tile)
    inputs_outer = a + b * a_tiles  # each input tile meets all weights (weights re-read per input tile)
    return float(min(weights_outer, inputs_outer) + o), max(w_tiles, a_tiles)


def gemm_cost(g: Gemm, cfg: NPUConfig, *, dataflow: str | None = None,
              activations_in_dram: bool | None = None) -> Cost:
    """Latency, traffic and energy of one (grouped) GEMM on the array."""
    traffic, _ = dram_bytes(g, cfg, activations_in_dram=activations_in_dram)
    return finish(cfg, array_cycles=array_cycles(g, cfg, dataflow), macs=g.macs,
                  sram_bytes=sram_bytes(g, cfg, dataflow), dram_bytes=traffic)


@dataclass(frozen=True)
class ConvLayer:
    """A convolution as SCALE-Sim describes it: padded input H x W, kernel R x S, C channels, M filters, stride."""

    name: str
    h: int
    w: int
    r: int
    s: int
    c: int
    m: int
    stride: int = 1
    groups: int = 1

    @property
    def out_hw(self) -> tuple[int, int]:
        return (self.h - self.r) // self.stride + 1, (self.w - self.s) // self.stride + 1

    def gemm(self, batch: int = 1) -> Gemm:
        e, f = self.out_hw
        return Gemm(m=batch * e * f, k=self.r * self.s * (self.c // self.groups), n=self.m // self.groups,
                    groups=self.groups, b_is_weight=True, a_elems=batch * self.h * self.w * self.c // self.groups)


def conv_cost(layer: ConvLayer, cfg: NPUConfig, batch: int = 1, *, dataflow: str | None = None) -> Cost:
    """One latency query for a convolution layer at a batch size."""
    return gemm_cost(layer.gemm(batch), cfg, dataflow=dataflow)
