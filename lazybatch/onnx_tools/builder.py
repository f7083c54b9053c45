"""A tiny graph builder over onnx.helper: seeded weights, unique names, one call per operator.

Why not PyTorch: the default install must export models without it, and building the graph directly keeps the
batch dimension symbolic everywhere (Reshape shapes use 0 = "copy this dimension").
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from . import IR_VERSION

OPSET = 17  # LayerNormalization needs 17; onnxruntime 1.30+ covers it
FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64

Dim = int | str | None


class GraphBuilder:
    """Accumulates nodes, initializers, inputs and outputs; ``op`` returns the output name(s)."""

    def __init__(self, name: str, seed: int = 0) -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.input_ranges: dict[str, list[int]] = {}
        self._used: set[str] = set()
        self._consts: dict[tuple, str] = {}

    # ------------------------------------------------------------------ names
    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self._used:
            k += 1
            name = f"{base}_{k}"
        self._used.add(name)
        return name

    # ------------------------------------------------------------------ graph I/O
    def input(self, name: str, elem_type: int, shape: Sequence[Dim], value_range: tuple[int, int] | None = None) -> str:
        self._used.add(name)
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        if value_range is not None:
            self.input_ranges[name] = [int(value_range[0]), int(value_range[1])]
        return name

    def output(self, tensor: str, name: str, elem_type: int, shape: Sequence[Dim]) -> str:
        """Expose ``tensor`` as graph output ``name`` (through Identity when the names differ)."""
        if tensor != name:
            self._used.add(name)
            self.nodes.append(helper.make_node("Identity", [tensor], [name], name=self.fresh(f"{name}_id")))
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    # ------------------------------------------------------------------ constants and weights
    def const(self, array: np.ndarray | Sequence[Any], name: str = "c", dtype: Any = None) -> str:
        arr = np.asarray(array, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes()) if arr.size <= 64 else None
        if key is not None and key in self._consts:
            return self._consts[key]
        nm = self.fresh(name)
        self.initializers.append(numpy_helper.from_array(arr, nm))
        if key is not None:
            self._consts[key] = nm
        return nm

    def i64(self, values: Sequence[int], name: str = "shape") -> str:
        return self.const(np.asarray(values, dtype=np.int64), name)

    def weight(self, name: str, shape: Sequence[int], fan_in: int | None = None, gain: float = 1.0) -> str:
        """He-style random weight: variance ``gain / fan_in`` keeps activations of deep random nets finite."""
        fan = fan_in if fan_in is not None else int(np.prod(shape[1:])) if len(shape) > 1 else int(shape[0])
        w = self.rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(np.sqrt(gain / max(fan, 1)))
        return self.const(w, name)

    def bias(self, name: str, n: int, scale: float = 0.01) -> str:
        return self.const((self.rng.standard_normal(n) * scale).astype(np.float32), name)

    def fill(self, name: str, shape: Sequence[int], value: float) -> str:
        return self.const(np.full(tuple(shape), value, dtype=np.float32), name)

    # ------------------------------------------------------------------ operators
    def op(self, op_type: str, inputs: Sequence[str], n_out: int = 1, name: str | None = None,
           **attrs: Any) -> Any:
        base = name or op_type.lower()
        node_name = self.fresh(base)
        outs = [self.fresh(f"{node_name}_out{i}" if n_out > 1 else f"{node_name}_out") for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=node_name, **attrs))
        return outs[0] if n_out == 1 else outs

    def linear(self, x: str, d_in: int, d_out: int, name: str, bias: bool = True, gain: float = 1.0) -> str:
        """x @ W (+ b) with W of shape [d_in, d_out]; works for any leading dims."""
        y = self.op("MatMul", [x, self.weight(f"{name}.weight", [d_in, d_out], fan_in=d_in, gain=gain)],
                    name=f"{name}.matmul")
        if bias:
            y = self.op("Add", [y, self.bias(f"{name}.bias", d_out)], name=f"{name}.add")
        return y

    def layer_norm(self, x: str, d: int, name: str) -> str:
        return self.op("LayerNormalization", [x, self.fill(f"{name}.gamma", [d], 1.0),
                                              self.fill(f"{name}.beta", [d], 0.0)],
                       name=name, axis=-1, epsilon=1e-5)

    # ------------------------------------------------------------------ model
    def model(self, metadata: Mapping[str, Any] | None = None, doc: str = "") -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="lazybatch", doc_string=doc)
        model.ir_version = IR_VERSION
        meta = dict(metadata or {})
        meta.setdefault("lazybatch.model", self.name)
        if self.input_ranges:
            meta["lazybatch.input_ranges"] = self.input_ranges
        for k, v in meta.items():
            entry = model.metadata_props.add()
            entry.key = k
            entry.value = v if isinstance(v, str) else json.dumps(v)
        return model
