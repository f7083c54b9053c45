"""The vector unit: element-wise ops, pooling, softmax, normalization, data movement.

TPU-like NPUs run these beside the array on a SIMD unit as wide as the array (``lanes``, 128 by default), one
operation per lane per cycle. Each op type has an operation count per element (a transcendental costs a few, a
softmax reads its row twice and does max, subtract, exp, sum and divide). These counts are estimates; the ops they
price are a small share of the models' time (see docs/npu.md). Inference BatchNormalization costs nothing: compilers
fold it into the preceding convolution's weights and bias.
"""

from __future__ import annotations

from .config import NPUConfig
from .cost import Cost, finish

#: operations per output element (per input element for reductions, see ``REDUCE_OPS``)
ELEMENTWISE_OPS: dict[str, float] = {
    "Add": 1, "Sub": 1, "Mul": 1, "Div": 1, "Relu": 1, "LeakyRelu": 2, "PRelu": 2, "Clip": 2, "Max": 1, "Min": 1,
    "Neg": 1, "Abs": 1, "Where": 1, "Equal": 1, "Less": 1, "LessOrEqual": 1, "Greater": 1, "GreaterOrEqual": 1,
    "Not": 1, "And": 1, "Or": 1, "Xor": 1, "Cast": 1, "Sqrt": 4, "Reciprocal": 4, "Pow": 4, "Exp": 4, "Log": 4,
    "Sigmoid": 4, "Tanh": 4, "Erf": 4, "Gelu": 6, "HardSigmoid": 2, "HardSwish": 3, "Softplus": 5, "Mod": 2,
    "Floor": 1, "Ceil": 1, "Round": 1, "Sign": 1, "BatchNormalization": 0, "InstanceNormalization": 8,
    "Softmax": 5, "LogSoftmax": 6, "LayerNormalization": 8, "SkipLayerNormalization": 9, "Dropout": 0,
}
#: reductions: operations per input element
REDUCE_OPS: dict[str, float] = {"ReduceMean": 1, "ReduceSum": 1, "ReduceMax": 1, "ReduceMin": 1, "ReduceL2": 2,
                                "ReduceSumSquare": 2, "ReduceProd": 1, "ArgMax": 1, "ArgMin": 1,
                                "GlobalAveragePool": 1, "GlobalMaxPool": 1, "CumSum": 1}
#: pure data movement: one move per output element
MOVE_OPS = {"Transpose", "Concat", "Gather", "GatherElements", "GatherND", "Slice", "Split", "Pad", "Expand",
            "Tile", "ScatterND", "ScatterElements", "OneHot", "Resize", "Upsample", "DepthToSpace",
            "SpaceToDepth", "TopK", "NonZero", "Trilu", "CastLike"}
#: no work on the device: views, shape arithmetic, constants
FREE_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Shape", "Size", "Constant",
            "ConstantOfShape", "Range", "EyeLike"}


def vector_cost(ops: float, cfg: NPUConfig, *, dram_bytes: float = 0.0, touched_bytes: float = 0.0,
                unknown: list[str] | None = None) -> Cost:
    """``ops`` element operations on the vector unit; ``touched_bytes`` is SRAM traffic (inputs read, output written)."""
    cycles = -(-int(round(ops)) // cfg.lanes) if ops > 0 else 0
    return finish(cfg, vector_cycles=cycles, vector_ops=ops, dram_bytes=dram_bytes, sram_bytes=touched_bytes,
                  unknown=unknown)


def pool_ops(out_elems: int, kernel: int) -> float:
    """A pooling window of ``kernel`` elements costs kernel - 1 compares/adds per output, plus a scale for averages."""
    return out_elems * max(kernel, 1)
