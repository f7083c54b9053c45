"""Hand-built graphs for the tests: third-party-style models (batch 1, opset 9) and broken ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def save(model: onnx.ModelProto, path: Path, ir: int = 7) -> Path:
    model.ir_version = ir
    onnx.save(model, str(path))
    return path


def shared_weight_mlp(path: Path) -> Path:
    """Opset 9, batch 1, two inputs, two outputs, one weight used by three layers (shared by several stages)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.25).astype(np.float32), "W")
    nodes = [
        helper.make_node("MatMul", ["a", "W"], ["m1"], name="mm1"),
        helper.make_node("Relu", ["m1"], ["h1"], name="relu1"),
        helper.make_node("MatMul", ["h1", "W"], ["m2"], name="mm2"),
        helper.make_node("Add", ["m2", "b"], ["s"], name="add_b"),
        helper.make_node("Relu", ["s"], ["h2"], name="relu2"),
        helper.make_node("MatMul", ["h2", "W"], ["out2"], name="mm3"),
    ]
    g = helper.make_graph(nodes, "shared_mlp",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 16]),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 16])],
                          [helper.make_tensor_value_info("h1", TensorProto.FLOAT, [1, 16]),
                           helper.make_tensor_value_info("out2", TensorProto.FLOAT, [1, 16])], [w])
    return save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)]), path, ir=4)


def _one_input(nodes: list, out_shape: list, inits: list | None = None, opset: int = 13,
               in_shape: list | None = None) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape or [1, 4, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], inits or [])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def checker_rejects(path: Path) -> Path:
    """A node reads a tensor nothing produces: onnx.checker rejects the graph."""
    return save(_one_input([helper.make_node("Relu", ["nowhere"], ["y"], name="bad_relu")], [1, 4, 2]), path)


def with_if(path: Path) -> Path:
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 4, 2])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 4, 2])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="positive"),
             helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)]
    zero = numpy_helper.from_array(np.float32(0.0), "zero")
    return save(_one_input(nodes, [1, 4, 2], [zero]), path)


def with_loop(path: Path) -> Path:
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Relu", ["v_in"], ["v_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1, 4, 2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1, 4, 2])])
    inits = [numpy_helper.from_array(np.int64(3), "trips"), numpy_helper.from_array(np.array(True), "cond")]
    nodes = [helper.make_node("Loop", ["trips", "cond", "x"], ["y"], name="repeat", body=body)]
    return save(_one_input(nodes, [1, 4, 2], inits), path)


def reshape_folds_batch(path: Path) -> Path:
    shape = numpy_helper.from_array(np.array([8], dtype=np.int64), "flat")
    nodes = [helper.make_node("Reshape", ["x", "flat"], ["r"], name="flatten_all"),
             helper.make_node("Relu", ["r"], ["y"], name="relu")]
    return save(_one_input(nodes, [8], [shape]), path)


def concat_fixed_batch(path: Path) -> Path:
    """Concatenates a constant with a batch of 1 along axis 2: fine at batch 1, broken at batch 8."""
    c = numpy_helper.from_array(np.ones((1, 4, 2), dtype=np.float32), "pad")
    nodes = [helper.make_node("Concat", ["x", "pad"], ["y"], name="append_pad", axis=2)]
    return save(_one_input(nodes, [1, 4, 4], [c]), path)


def old_opset(path: Path) -> Path:
    return save(_one_input([helper.make_node("Relu", ["x"], ["y"], name="relu")], [1, 4, 2], opset=8), path, ir=3)


def passthrough_output(path: Path) -> Path:
    """An output that is just the input: no stage computes it."""
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 2]),
                           helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 2])])
    return save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)


def shape_computed_flatten(path: Path) -> Path:
    """PyTorch-export style: the flatten shape is computed from Shape(x) at run time (dynamic batch already)."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((64, 5)) * 0.1).astype(np.float32), "w2")
    w3 = numpy_helper.from_array((rng.standard_normal((5, 5)) * 0.3).astype(np.float32), "w3")
    consts = [numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
              numpy_helper.from_array(np.array([0], dtype=np.int64), "axes0"),
              numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus1")]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Shape", ["r"], ["s"], name="shape"),
        helper.make_node("Gather", ["s", "zero"], ["n"], name="batch_of", axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"], name="as_list"),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], name="target_shape", axis=0),
        helper.make_node("Reshape", ["r", "target"], ["flat"], name="flatten"),
        helper.make_node("MatMul", ["flat", "w2"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["h2"], name="relu2"),
        helper.make_node("MatMul", ["h2", "w3"], ["y"], name="fc2"),
    ]
    g = helper.make_graph(nodes, "dyn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], [w1, w2, w3] + consts)
    return save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
