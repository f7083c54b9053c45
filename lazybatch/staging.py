"""Small ONNX helpers the serving side needs on its own: a batchable test MLP, a batchable ResNet-50 from the onnx
package's light model zoo, and a plain cut-point splitter that writes a ``lazybatch.stages/1`` directory.

The project's full exporter/splitter (``lazybatch split``, branch ``onnx``) proves every split equal to the whole
graph; this splitter is the fallback ``lazybatch repo add`` uses while that one is not importable: it cuts the
topologically sorted graph only where exactly the tensors crossing the cut are carried, so each stage is the exact
subgraph and the composition runs the same operators on the same inputs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from lazybatch.batcher.errors import ConfigError

IR_VERSION = 8  # onnxruntime 1.31 reads at most IR 13; older runtimes need lower


def _onnx() -> Any:
    import onnx

    return onnx


def make_heavy(path: Path, *, rows: int = 1024, dim: int = 512, depth: int = 4, seed: int = 3) -> Path:
    """A compute-bound model (batching does not pay): x [batch, dim] is broadcast to [batch, rows, dim], then
    ``depth`` MatMul+Relu layers and a mean over the rows. About 40 ms per sample on one core: its capacity is a few
    dozen requests/s, so a Python client can offer 5x that."""
    onnx = _onnx()
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(np.array([1], np.int64), "ax1"),
             numpy_helper.from_array((0.1 * rng.standard_normal((rows, dim))).astype(np.float32), "pos")]
    nodes = [helper.make_node("Unsqueeze", ["x", "ax1"], ["xu"]), helper.make_node("Add", ["xu", "pos"], ["h"])]
    prev = "h"
    for i in range(depth):
        inits.append(numpy_helper.from_array((rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32),
                                             f"w{i}"))
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        prev = f"r{i}"
    nodes.append(helper.make_node("ReduceMean", [prev, "ax1"], ["y"], keepdims=0))
    graph = helper.make_graph(nodes, "heavy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", dim])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", dim])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def make_mlp(path: str | Path, *, in_dim: int = 16, width: int = 32, depth: int = 4, out_dim: int = 8,
             seed: int = 0, opset: int = 13) -> Path:
    """A batchable MLP (MatMul/Add/Relu, a skip connection into the last layer) for tests and examples."""
    onnx = _onnx()
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    prev, prev_dim = "x", in_dim
    first_hidden = None
    for i in range(depth):
        d_out = out_dim if i == depth - 1 else width
        w = (rng.standard_normal((prev_dim, d_out)) / np.sqrt(prev_dim)).astype(np.float32)
        b = (0.1 * rng.standard_normal(d_out)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"mm{i}"]),
                  helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"a{i}"])]
        out = f"a{i}"
        if i < depth - 1:
            nodes.append(helper.make_node("Relu", [out], [f"h{i}"]))
            out = f"h{i}"
            if i == 0:
                first_hidden = out
            elif i == depth - 2 and first_hidden is not None and first_hidden != out:
                nodes.append(helper.make_node("Add", [out, first_hidden], [f"skip{i}"]))
                out = f"skip{i}"
        prev, prev_dim = out, d_out
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", in_dim])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", out_dim])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="lazybatch")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(p))
    return p


def batchable_light_model(name: str, path: str | Path, *, seed: int = 0) -> Path:
    """The onnx package's ``light_<name>`` (fixed batch 1, weights as ConstantOfShape) made servable: random He-style
    weights as initializers, a symbolic batch dimension, and the classifier's Reshape made batch-agnostic."""
    onnx = _onnx()
    from onnx import numpy_helper

    src = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"
    if not src.exists():
        raise ConfigError(f"the onnx package has no light model {name!r} ({src})")
    m = onnx.load(str(src))
    g = m.graph
    rng = np.random.default_rng(seed)
    consts = {n.output[0]: n for n in g.node if n.op_type == "ConstantOfShape"}
    inits = {i.name: i for i in g.initializer}
    role: dict[str, tuple[str, int]] = {}
    for n in g.node:
        for k, inp in enumerate(n.input):
            if inp in consts:
                role[inp] = (n.op_type, k)
    new_inits = []
    for out, node in consts.items():
        shape = tuple(int(v) for v in numpy_helper.to_array(inits[node.input[0]]).reshape(-1))
        op, k = role.get(out, ("", 0))
        if op == "Conv" and k == 1:
            fan_in = int(np.prod(shape[1:]))
            arr = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        elif op == "BatchNormalization":
            arr = {1: np.ones(shape), 2: 0.01 * rng.standard_normal(shape), 3: np.zeros(shape),
                   4: np.ones(shape)}.get(k, np.zeros(shape))
            if k == 1:
                arr = arr * 0.5  # keeps activations bounded through 16 residual blocks
        elif op == "Gemm" and k == 1:
            arr = rng.standard_normal(shape) / np.sqrt(shape[-1])
        else:
            arr = np.zeros(shape)
        new_inits.append(numpy_helper.from_array(arr.astype(np.float32), out))
    keep = [n for n in g.node if n.op_type != "ConstantOfShape"]
    used = {i for n in keep for i in n.input}
    for n in keep:
        if n.op_type == "Reshape":
            shape_name = n.input[1]
            arr = numpy_helper.to_array(inits[shape_name]).copy()
            arr[0] = -1 if arr.size == 2 else arr[0]
            if arr.size == 2:
                arr = np.array([-1, int(numpy_helper.to_array(inits[shape_name]).prod())], dtype=np.int64)
            new_inits.append(numpy_helper.from_array(arr.astype(np.int64), shape_name))
    for name_, init in inits.items():
        if name_ in used and all(x.name != name_ for x in new_inits):
            new_inits.append(init)
    del g.node[:]
    g.node.extend(keep)
    del g.initializer[:]
    g.initializer.extend(new_inits)
    init_names = {i.name for i in new_inits}
    real_inputs = [i for i in g.input if i.name not in init_names and i.name not in consts and i.name in used]
    del g.input[:]
    g.input.extend(real_inputs)
    for vi in [*g.input, *g.output]:
        d0 = vi.type.tensor_type.shape.dim[0]
        d0.Clear()
        d0.dim_param = "batch"
    del g.value_info[:]
    m.ir_version = max(m.ir_version, 4)
    onnx.checker.check_model(m)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(p))
    return p


def _np_dtype(elem_type: int) -> str:
    from onnx import helper

    return str(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)))


_TRITON = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "float64": "TYPE_FP64", "int64": "TYPE_INT64",
           "int32": "TYPE_INT32", "int8": "TYPE_INT8", "uint8": "TYPE_UINT8", "bool": "TYPE_BOOL"}


def _shape(vi: Any) -> list[Any]:
    out: list[Any] = []
    for d in vi.type.tensor_type.shape.dim:
        out.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or -1))
    return out


def split_model(model_path: str | Path, out_dir: str | Path, *, max_stages: int | None = None,
                name: str | None = None, cut_after: Sequence[int] | None = None) -> Path:
    """Cut ``model_path`` into stages; write stage files + manifest.json.

    Cut points are where exactly one computed tensor crosses (model inputs may cross too), spaced evenly down to
    ``max_stages``; ``cut_after`` (node indices) forces cuts anywhere, several tensors crossing included.
    """
    onnx = _onnx()
    from onnx import helper, shape_inference

    src = Path(model_path)
    model = onnx.load(str(src))
    try:
        model = shape_inference.infer_shapes(model)
    except Exception as e:  # shape inference is needed to type the stage boundaries
        raise ConfigError(f"ONNX shape inference failed: {e}", source=str(src)) from None
    g = model.graph
    init_names = {i.name for i in g.initializer}
    inputs = [i for i in g.input if i.name not in init_names]
    if not inputs:
        raise ConfigError("the model has no inputs", source=str(src))
    nodes = list(g.node)  # ONNX requires topological order
    n = len(nodes)
    if n == 0:
        raise ConfigError("the model has no nodes", source=str(src))
    types = {vi.name: vi for vi in [*g.input, *g.value_info, *g.output]}
    graph_outputs = [o.name for o in g.output]
    last_consumer: dict[str, int] = {}
    producer: dict[str, int] = {}
    for i, node in enumerate(nodes):
        for t in node.input:
            if t and t not in init_names:
                last_consumer[t] = i
        for t in node.output:
            producer[t] = i
    for o in graph_outputs:
        last_consumer[o] = n
    # live[i]: tensors (not initializers) produced at or before node i (or model inputs) and read after node i
    model_in = [i.name for i in inputs]
    cuts: list[tuple[int, list[str]]] = []
    for i in range(n - 1):
        live = [t for t, last in last_consumer.items() if last > i and (producer.get(t, -1) <= i)
                and (t in producer or t in model_in)]
        crossing = [t for t in live if t in producer]
        if len(crossing) == 1 and all(t in types for t in live):
            cuts.append((i, live))
    # evenly spaced cut points (by node count) up to max_stages
    chosen = list(cuts)
    if cut_after is not None:
        bad = [c for c in cut_after if not 0 <= c < n - 1]
        if bad:
            raise ConfigError(f"cut_after {bad} outside 0..{n - 2}", field="cut_after")
        chosen = [(c, []) for c in sorted(set(cut_after))]
    if max_stages is not None and len(chosen) + 1 > max_stages and chosen:
        k = max_stages - 1
        picks = []
        for j in range(1, k + 1):
            target = j * n / (k + 1)
            best = min(chosen, key=lambda c: abs(c[0] - target))
            if best not in picks:
                picks.append(best)
        chosen = sorted(picks)
    bounds = [c[0] for c in chosen] + [n - 1]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model_name = name or src.stem
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    stages_meta = []
    start = 0
    inits = {i.name: i for i in g.initializer}
    for si, end in enumerate(bounds):
        part = nodes[start:end + 1]
        produced = {t for nd in part for t in nd.output}
        needed = []
        for nd in part:
            for t in nd.input:
                if t and t not in init_names and t not in produced and t not in needed:
                    needed.append(t)
        outs = [t for t in dict.fromkeys(t for nd in part for t in nd.output)
                if last_consumer.get(t, -1) > end or t in graph_outputs]
        s_inits = [inits[t] for t in dict.fromkeys(t for nd in part for t in nd.input if t in init_names)]
        vin = [types[t] for t in needed]
        vout = [types[t] for t in outs]
        sub = helper.make_graph(part, f"{model_name}_stage_{si:03d}", vin, vout, s_inits)
        sm = helper.make_model(sub, opset_imports=list(model.opset_import), producer_name="lazybatch")
        sm.ir_version = model.ir_version
        fname = f"stage_{si:03d}.onnx"
        onnx.save(sm, str(out / fname))
        stages_meta.append({
            "index": si, "name": f"stage_{si:03d}", "file": fname, "type": "STATIC",
            "inputs": [{"name": t, "dtype": _np_dtype(types[t].type.tensor_type.elem_type),
                        "shape": ["batch", *_shape(types[t])[1:]],
                        "from": "model" if t in model_in else next(
                            k for k, m in enumerate(stages_meta) if t in [o["name"] for o in m["outputs"]])}
                       for t in needed],
            "outputs": [{"name": t, "dtype": _np_dtype(types[t].type.tensor_type.elem_type),
                         "shape": ["batch", *_shape(types[t])[1:]]} for t in outs],
        })
        start = end + 1

    def top(vi: Any) -> dict[str, Any]:
        dt = _np_dtype(vi.type.tensor_type.elem_type)
        return {"name": vi.name, "dtype": dt, "data_type": _TRITON.get(dt, "TYPE_FP32"),
                "dims": [d if isinstance(d, int) and d > 0 else -1 for d in _shape(vi)[1:]]}

    manifest = {"format": "lazybatch.stages/1", "model": model_name, "source": src.name, "opset": int(opset),
                "splitter": "lazybatch.staging.split_model (cut points)",
                "inputs": [top(i) for i in inputs], "outputs": [top(o) for o in g.output], "stages": stages_meta}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return out
