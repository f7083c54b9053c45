"""Analytical systolic-array NPU timing model (installed as ``lazybatch.npu_model``).

``NPUConfig`` (defaults: the LazyBatching paper's Table I), ``gemm_cost``/``conv_cost`` for one layer,
``OnnxModel`` for the nodes of an ONNX graph at any batch size, and ``latency_table`` for a split model's
stage x batch-size table. See docs/npu.md.
"""

from .config import TABLE_I, NPUConfig, parse_array
from .cost import Cost
from .systolic import ConvLayer, Gemm, array_cycles, conv_cost, gemm_cost

__all__ = ["TABLE_I", "NPUConfig", "parse_array", "Cost", "ConvLayer", "Gemm", "array_cycles", "conv_cost",
           "gemm_cost"]
