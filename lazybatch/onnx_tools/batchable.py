"""Make a model with a fixed batch of 1 batchable: symbolic batch dimension in inputs/outputs, Reshape shapes that
copy the batch dimension (0) instead of hard-coding 1.

Anything that would silently fold the batch dimension away is refused with the node's name, because a stage that
runs at batch 8 must give the same per-row answer as at batch 1 (``lazybatch split --verify`` checks exactly that).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from lazybatch.batcher.errors import ConfigError

BATCH = "batch"


def real_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in graph.initializer}
    return [i for i in graph.input if i.name not in inits]


def _dynamic_dims(vi: onnx.ValueInfoProto) -> None:
    """Turn negative ``dim_value`` (Paddle2ONNX and other exporters write -1 for a dynamic dimension, which
    onnxruntime accepts) into an unknown dimension: onnx shape inference and checker treat -1 as a real size, and
    stage files written with it would say a tensor has -1 elements along that axis."""
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return
    for d in vi.type.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value < 0:
            d.Clear()


def _set_batch_dim(vi: onnx.ValueInfoProto, what: str, fixes: list[str]) -> None:
    tt = vi.type.tensor_type
    if not tt.HasField("shape") or len(tt.shape.dim) == 0:
        raise ConfigError(f"{what} {vi.name!r} has no dimensions (a scalar or unknown rank); lazybatch needs the "
                          "batch as the first dimension of every model input and output: re-export the model with "
                          "an explicit batch dimension")
    d0 = tt.shape.dim[0]
    if d0.HasField("dim_value") and d0.dim_value >= 0:  # a negative value (-1) is dynamic, as a dim_param is
        if d0.dim_value != 1:
            raise ConfigError(f"{what} {vi.name!r} has a fixed first dimension {d0.dim_value}; lazybatch treats "
                              "dimension 0 as the batch: re-export with a dynamic batch dimension (or batch 1, "
                              "which split makes dynamic)")
        fixes.append(f"{what} {vi.name}: batch dimension 1 -> '{BATCH}'")
    elif d0.HasField("dim_value"):
        fixes.append(f"{what} {vi.name}: batch dimension {d0.dim_value} -> '{BATCH}'")
    _dynamic_dims(vi)
    d0.Clear()
    d0.dim_param = BATCH


def _const_tensors(graph: onnx.GraphProto) -> set[str]:
    const = {t.name for t in graph.initializer}
    for node in graph.node:
        ins = [i for i in node.input if i]
        if node.op_type.startswith("Random") or any(a.type in (onnx.AttributeProto.GRAPH,
                                                               onnx.AttributeProto.GRAPHS) for a in node.attribute):
            continue
        if all(i in const for i in ins):
            const.update(o for o in node.output if o)
    return const


def make_batchable(model: onnx.ModelProto) -> list[str]:
    """Rewrite ``model`` in place; returns a human-readable list of what was changed."""
    g = model.graph
    fixes: list[str] = []
    inits = {t.name: t for t in g.initializer}
    # initializers listed as inputs (IR < 4 style) would be exposed as Triton inputs: drop them from the inputs
    if any(i.name in inits for i in g.input):
        keep = [i for i in g.input if i.name not in inits]
        del g.input[:]
        g.input.extend(keep)
        fixes.append("initializers removed from the graph inputs")
    if model.ir_version < 4:
        model.ir_version = 4
    for vi in g.input:
        _set_batch_dim(vi, "input", fixes)
    del g.value_info[:]  # stale shapes with a hard batch of 1; re-inferred below
    const = _const_tensors(g)
    # where does the batch sit? Only a Reshape whose input starts with the batch can fold it away; others (the
    # sequence-first layout inside PyTorch's attention, say) are none of our business
    for _ in range(len(g.node) + 1):  # a fixed Reshape exposes the batch to the Reshapes after it: repeat
        lead = {name: (dims[0] if dims else None)
                for name, (_, dims) in shape_table(infer_shapes(model)).items()}
        changed = False
        for node in g.node:
            if node.op_type != "Reshape" or node.input[0] in const:
                continue
            shape_name = node.input[1]
            if shape_name not in inits:
                continue  # computed from Shape(...) at run time: already follows the batch
            arr = numpy_helper.to_array(inits[shape_name]).astype(np.int64)
            if arr.ndim != 1 or arr.size == 0:
                continue
            allowzero = any(a.name == "allowzero" and a.i == 1 for a in node.attribute)
            first = int(arr[0])
            d0 = lead.get(node.input[0])
            if first == -1 or (first == 0 and not allowzero):
                continue
            if d0 != BATCH and not (d0 is None and first == 1):
                continue  # the input does not start with the batch (or we cannot tell and nothing hints at it)
            if first == 1:
                new = arr.copy()
                if allowzero:
                    if (arr == -1).any():
                        raise ConfigError(f"Reshape node {node.name!r} has allowzero=1 and shape {arr.tolist()} "
                                          "with a fixed batch of 1 and a -1 elsewhere; re-export the model with a "
                                          "dynamic batch")
                    new[0] = -1
                else:
                    new[0] = 0
                new_name = f"{shape_name}__batchable"
                if new_name not in inits:
                    t = numpy_helper.from_array(new, new_name)
                    g.initializer.append(t)
                    inits[new_name] = t
                node.input[1] = new_name
                changed = True
                fixes.append(f"Reshape {node.name}: shape {arr.tolist()} -> {new.tolist()}")
                continue
            raise ConfigError(f"Reshape node {node.name!r} reshapes activation {node.input[0]!r} to the fixed "
                              f"shape {arr.tolist()}, which folds the batch dimension into other dimensions; make "
                              "the shape start with 0 (copy the batch) or -1, or re-export the model with a dynamic "
                              "batch dimension (torch.onnx.export(..., dynamic_axes={'input': {0: 'batch'}}))")
        if not changed:
            break
    for vi in g.output:  # after the Reshape scan: a folding Reshape is the more useful thing to name
        _set_batch_dim(vi, "output", fixes)
    return fixes


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shape inference that tolerates ops onnx cannot infer (their shapes then stay unknown)."""
    try:
        return onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # inference is best effort: the verify step is the real proof
        return model


def shape_table(model: onnx.ModelProto) -> dict[str, tuple[int, list[int | str | None] | None]]:
    """tensor name -> (elem_type, dims) with ints, dim_param strings, or None for unknown; dims None = rank unknown."""
    out: dict[str, tuple[int, list[int | str | None] | None]] = {}
    g = model.graph
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            continue
        dims: list[int | str | None] | None = None
        if tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or None)
                    for d in tt.shape.dim]
        out[vi.name] = (tt.elem_type, dims)
    for t in g.initializer:
        out[t.name] = (t.data_type, list(t.dims))
    return out
