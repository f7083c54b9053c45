"""ONNX front end: the cost of every node of a graph at a batch size, from onnx shape inference.

The batch is set on the graph inputs (their symbolic first dimension), then ``onnx.shape_inference`` fills in every
tensor's shape. Large initializers are replaced by typed graph inputs before inference, so a 700 MB model is not
serialised once per batch size; small ones (shape constants that Reshape and friends read) are kept.

Ops the model does not know are priced as one vector operation per output element and listed in
``Cost.unknown_ops`` (``strict=True`` refuses them instead). Every node's cost depends only on its own shapes, so a
stage's cost is the sum of its nodes' and the whole model's the sum of its stages'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import onnx
from onnx import helper, shape_inference

from lazybatch.batcher.errors import ConfigError

from .config import NPUConfig
from .cost import Cost
from .systolic import Gemm, gemm_cost
from .vector import ELEMENTWISE_OPS, FREE_OPS, MOVE_OPS, REDUCE_OPS, pool_ops, vector_cost

KEEP_INITIALIZER_ELEMS = 64  # initializers up to this size keep their values (shape constants)
WEIGHT_MIN_ELEMS = 1024  # initializers at least this big count as weights streamed from DRAM
GEMM_OPS = {"Conv", "Gemm", "MatMul", "LSTM", "GRU", "RNN"}

Shape = tuple[int, ...]


def _numel(shape: Sequence[int] | None) -> int:
    return math.prod(shape) if shape else (1 if shape == () else 0)


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


@dataclass
class NodeInfo:
    """A node with the shapes shape inference gave its inputs and outputs (None where unknown)."""

    name: str
    op: str
    inputs: list[Shape | None]
    outputs: list[Shape | None]
    input_is_init: list[bool]
    attrs: onnx.NodeProto


class OnnxModel:
    """An ONNX graph, loaded once; ``nodes(batch)`` gives its nodes with inferred shapes at that batch size."""

    def __init__(self, model: onnx.ModelProto | str | Path, *, name: str | None = None) -> None:
        if not isinstance(model, onnx.ModelProto):
            path = Path(model)
            if not path.exists():
                raise ConfigError(f"no such ONNX file: {path}", field="model")
            try:
                model = onnx.load(str(path), load_external_data=False)
            except Exception as e:  # onnx raises DecodeError and friends
                raise ConfigError(f"cannot read ONNX model: {e}", source=str(path)) from None
            name = name or path.stem
        self.name = name or model.graph.name or "model"
        self._skeleton, self.init_shapes = _skeleton(model)
        inits = set(self.init_shapes)
        self.batch_inputs = [vi.name for vi in self._skeleton.graph.input
                             if vi.name not in inits and _first_dim_symbolic(vi)]
        self._cache: dict[int, list[NodeInfo]] = {}

    def nodes(self, batch: int) -> list[NodeInfo]:
        if not isinstance(batch, int) or batch < 1:
            raise ConfigError(f"batch size must be a positive integer, got {batch!r}", field="batch")
        if batch not in self._cache:
            if batch != 1 and not self.batch_inputs:
                raise ConfigError(f"{self.name}: no graph input has a symbolic batch dimension, so the model runs "
                                  "at batch 1 only; `lazybatch split` writes a batchable copy (model.onnx)",
                                  field="batch")
            self._cache[batch] = _infer(self._skeleton, self.init_shapes, self.batch_inputs, batch)
        return self._cache[batch]

    def cost(self, batch: int, cfg: NPUConfig, *, strict: bool = False) -> Cost:
        total = Cost()
        for nd in self.nodes(batch):
            total += node_cost(nd, cfg, strict=strict)
        return total

    def node_costs(self, batch: int, cfg: NPUConfig, *, strict: bool = False) -> list[tuple[NodeInfo, Cost]]:
        return [(nd, node_cost(nd, cfg, strict=strict)) for nd in self.nodes(batch)]


def _first_dim_symbolic(vi: onnx.ValueInfoProto) -> bool:
    t = vi.type.tensor_type
    if not t.HasField("shape") or not t.shape.dim:
        return False
    d0 = t.shape.dim[0]
    return not d0.HasField("dim_value")


def _skeleton(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, Shape]]:
    """A copy of ``model`` whose big initializers are typed graph inputs (shape inference needs no weight bytes)."""
    g = model.graph
    init_shapes: dict[str, Shape] = {}
    kept, as_inputs = [], []
    for t in g.initializer:
        shape = tuple(int(d) for d in t.dims)
        init_shapes[t.name] = shape
        if _numel(shape) <= KEEP_INITIALIZER_ELEMS and (t.raw_data or t.int64_data or t.float_data or t.int32_data):
            kept.append(t)
        else:
            as_inputs.append(helper.make_tensor_value_info(t.name, t.data_type, list(shape)))
    graph = helper.make_graph(list(g.node), g.name, list(g.input) + as_inputs, list(g.output), kept,
                              value_info=[])
    sk = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    for f in model.functions:
        sk.functions.append(f)
    return sk, init_shapes


def _infer(skeleton: onnx.ModelProto, init_shapes: dict[str, Shape], batch_inputs: Iterable[str],
           batch: int) -> list[NodeInfo]:
    m = onnx.ModelProto()
    m.CopyFrom(skeleton)
    names = set(batch_inputs)
    for vi in m.graph.input:
        if vi.name in names:
            d0 = vi.type.tensor_type.shape.dim[0]
            d0.ClearField("dim_param")
            d0.dim_value = batch
    try:
        inferred = shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
    except Exception as e:
        raise ConfigError(f"onnx shape inference failed at batch {batch}: {e}", field="model") from None
    shapes: dict[str, Shape | None] = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.output) + list(inferred.graph.value_info):
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            shapes[vi.name] = tuple(int(d.dim_value) for d in t.shape.dim)
        else:
            shapes.setdefault(vi.name, None)
    for t in inferred.graph.initializer:
        shapes[t.name] = tuple(int(d) for d in t.dims)
    inits = set(init_shapes)
    out = []
    for i, nd in enumerate(inferred.graph.node):
        out.append(NodeInfo(nd.name or f"{nd.op_type}_{i}", nd.op_type, [shapes.get(x) if x else None for x in nd.input],
                            [shapes.get(y) if y else None for y in nd.output], [x in inits for x in nd.input], nd))
    return out


# ---------------------------------------------------------------------------------------------- per-op costs
def _need(nd: NodeInfo, *shapes: Shape | None) -> None:
    if any(s is None for s in shapes):
        raise ConfigError(f"node {nd.name!r} ({nd.op}): shape inference left a shape unknown; the model needs "
                          "static shapes apart from the batch dimension", field="model")


def _weight_bytes(nd: NodeInfo, cfg: NPUConfig, skip: Iterable[int] = ()) -> int:
    """Parameter bytes a node reads from DRAM (initializer inputs big enough to be weights)."""
    total = 0
    for k, (is_init, shp) in enumerate(zip(nd.input_is_init, nd.inputs)):
        if is_init and k not in skip and shp is not None and _numel(shp) >= WEIGHT_MIN_ELEMS:
            total += _numel(shp) * cfg.dtype_bytes
    return total


def _conv(nd: NodeInfo, cfg: NPUConfig) -> Cost:
    x, w, y = nd.inputs[0], nd.inputs[1], nd.outputs[0]
    _need(nd, x, w, y)
    group = int(_attr(nd.attrs, "group", 1))
    n = x[0]
    m, cg = w[0], w[1]
    kernel = _numel(w[2:])
    out_pix = _numel(y[2:])
    g = Gemm(m=n * out_pix, k=cg * kernel, n=m // group, groups=group, b_is_weight=True,
             a_elems=_numel(x) // group)
    # a bias rides on the accumulator drain; its few bytes are not counted
    return gemm_cost(g, cfg)


def _gemm(nd: NodeInfo, cfg: NPUConfig) -> Cost:
    a, b, y = nd.inputs[0], nd.inputs[1], nd.outputs[0]
    _need(nd, a, b, y)
    ta, tb = int(_attr(nd.attrs, "transA", 0)), int(_attr(nd.attrs, "transB", 0))
    m, k = (a[1], a[0]) if ta else (a[0], a[1])
    n = b[0] if tb else b[1]
    return gemm_cost(Gemm(m=m, k=k, n=n, b_is_weight=nd.input_is_init[1]), cfg)


def _matmul(nd: NodeInfo, cfg: NPUConfig) -> Cost:
    a, b, y = nd.inputs[0], nd.inputs[1], nd.outputs[0]
    _need(nd, a, b, y)
    if len(a) == 1:
        a = (1,) + tuple(a)
    if len(b) == 1:
        b = tuple(b) + (1,)
    k, n = b[-2], b[-1]
    if nd.input_is_init[1] or len(b) == 2:
        # x[..., K] @ W[K, N]: every leading dimension of A is a GEMM row, the weights are loaded once
        return gemm_cost(Gemm(m=_numel(a[:-1]), k=k, n=n, b_is_weight=nd.input_is_init[1]), cfg)
    # batched matmul (attention's Q K^T and P V): one GEMM per broadcast batch index
    groups = _numel(y[:-2])
    return gemm_cost(Gemm(m=a[-2], k=k, n=n, groups=groups, b_is_weight=False), cfg)


def _recurrent(nd: NodeInfo, cfg: NPUConfig) -> Cost:
    """ONNX LSTM/GRU/RNN: per timestep one GEMM of [x, h] against the stacked gate weights, then the gate math."""
    x, w, r = nd.inputs[0], nd.inputs[1], nd.inputs[2]
    _need(nd, x, w, r)
    layout = int(_attr(nd.attrs, "layout", 0))
    seq, batch = (x[1], x[0]) if layout else (x[0], x[1])
    dirs, gates_h, inp = w
    hidden = r[2]
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[nd.op]
    step = gemm_cost(Gemm(m=batch, k=inp + hidden, n=gates_h, groups=dirs, b_is_weight=True), cfg)
    cost = Cost()
    for _ in range(seq):
        cost += step
    cost += vector_cost(seq * dirs * batch * hidden * gates * 4, cfg)
    cost.nodes = 1
    return cost


def node_cost(nd: NodeInfo, cfg: NPUConfig, *, strict: bool = False) -> Cost:
    """Cost of one node (its shapes already inferred)."""
    op = nd.op
    if op == "Conv":
        return _conv(nd, cfg)
    if op == "Gemm":
        return _gemm(nd, cfg)
    if op == "MatMul":
        return _matmul(nd, cfg)
    if op in ("LSTM", "GRU", "RNN"):
        return _recurrent(nd, cfg)
    out = nd.outputs[0] if nd.outputs else None
    if op in FREE_OPS:
        c = Cost()
        c.nodes = 1
        return c
    d = cfg.dtype_bytes
    in_elems = sum(_numel(s) for s, init in zip(nd.inputs, nd.input_is_init) if s is not None and not init)
    out_elems = sum(_numel(s) for s in nd.outputs if s is not None)
    if op in ("Gather",) and nd.input_is_init[0]:
        # embedding lookup: only the gathered rows come from DRAM
        _need(nd, out)
        return vector_cost(out_elems, cfg, dram_bytes=out_elems * d, touched_bytes=2 * out_elems * d)
    touched = (in_elems + out_elems) * d
    spill = touched if touched > cfg.act_sram_bytes else 0
    dram = _weight_bytes(nd, cfg) + spill
    if op in ELEMENTWISE_OPS:
        _need(nd, out)
        return vector_cost(ELEMENTWISE_OPS[op] * out_elems, cfg, dram_bytes=dram, touched_bytes=touched)
    if op in REDUCE_OPS:
        _need(nd, nd.inputs[0])
        return vector_cost(REDUCE_OPS[op] * _numel(nd.inputs[0]), cfg, dram_bytes=dram, touched_bytes=touched)
    if op in ("MaxPool", "AveragePool", "LpPool"):
        _need(nd, out)
        kernel = _numel(tuple(_attr(nd.attrs, "kernel_shape", [1])))
        return vector_cost(pool_ops(_numel(out), kernel), cfg, dram_bytes=dram, touched_bytes=touched)
    if op in MOVE_OPS:
        return vector_cost(out_elems, cfg, dram_bytes=dram, touched_bytes=touched)
    if strict:
        raise ConfigError(f"node {nd.name!r}: the NPU model has no cost for op type {op!r} (without --strict it "
                          "is priced as one vector operation per output element and reported)", field="model")
    return vector_cost(out_elems, cfg, dram_bytes=dram, touched_bytes=touched, unknown=[op])
