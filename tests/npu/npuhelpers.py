"""Small ONNX graphs and split models for the NPU tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _init(name: str, shape: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.zeros(shape, dtype=np.float32), name)


def save(model: onnx.ModelProto, path: Path) -> Path:
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def conv_mlp(path: Path, *, batch: str | int = "batch", extra_op: str | None = None) -> Path:
    """x[B,3,10,10] -Conv(4 filters 3x3, pad 1)-> Relu -> Flatten -> MatMul W[400,16] -> Softmax (-> extra_op)."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Flatten", ["r"], ["f"], name="flatten", axis=1),
        helper.make_node("MatMul", ["f", "fc"], ["m"], name="fc"),
        helper.make_node("Softmax", ["m"], ["y"], name="softmax", axis=-1),
    ]
    out = "y"
    if extra_op:
        nodes.append(helper.make_node(extra_op, ["y"], ["z"], name="extra"))
        out = "z"
    g = helper.make_graph(nodes, "conv_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 10, 10])],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, [batch, 16])],
                          [_init("w", [4, 3, 3, 3]), _init("fc", [400, 16])])
    return save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def attention(path: Path, *, seq: int = 16, heads: int = 2, dh: int = 8) -> Path:
    """q[B,H,S,dh] @ k[B,H,dh,S] -> Softmax -> @ v[B,H,S,dh]: attention's two batched matmuls."""
    nodes = [helper.make_node("MatMul", ["q", "k"], ["s"], name="scores"),
             helper.make_node("Softmax", ["s"], ["p"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"], name="context")]
    vi = lambda n, shp: helper.make_tensor_value_info(n, TensorProto.FLOAT, shp)  # noqa: E731
    g = helper.make_graph(nodes, "attn", [vi("q", ["batch", heads, seq, dh]), vi("k", ["batch", heads, dh, seq]),
                                          vi("v", ["batch", heads, seq, dh])], [vi("y", ["batch", heads, seq, dh])])
    return save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
