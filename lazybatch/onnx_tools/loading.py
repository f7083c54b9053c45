"""Load a user's ONNX file and refuse, with a reason and a remedy, what the splitter cannot handle."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from lazybatch.batcher.errors import ConfigError

MIN_OPSET = 9
CONTROL_FLOW = {"If", "Loop", "Scan"}


@dataclass
class LoadedModel:
    model: onnx.ModelProto
    path: Path
    external_data: bool

    @property
    def opset(self) -> int:
        return default_opset(self.model)


def default_opset(model: onnx.ModelProto) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 0


def load_model(path: str | Path) -> LoadedModel:
    """Parse, check and load (with external data) an ONNX file, or raise ConfigError saying what to do."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{str(p)!r} does not exist or is not a file; pass the path of an .onnx model "
                          "(e.g. one written by `lazybatch export`)")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as e:  # protobuf raises DecodeError, RuntimeWarning-ish errors, UnicodeDecodeError...
        raise ConfigError(f"{str(p)!r} is not an ONNX model (protobuf parse failed: {type(e).__name__}); pass a "
                          "file saved with onnx.save or exported with torch.onnx.export / `lazybatch export`") from None
    if model.ir_version == 0 or not model.graph.node:
        raise ConfigError(f"{str(p)!r} is not an ONNX model (no IR version or no graph nodes); pass a file saved "
                          "with onnx.save or exported with `lazybatch export`")
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    try:
        onnx.checker.check_model(str(p))  # path form: handles external data and models over 2 GiB
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"onnx.checker rejects {str(p)!r}: {first}; fix or re-export the model (run "
                          "`python -c \"import onnx; onnx.checker.check_model('MODEL.onnx')\"` for the full "
                          "report)") from None
    opset = default_opset(model)
    if opset < MIN_OPSET:
        raise ConfigError(f"{str(p)!r} uses opset {opset}; lazybatch needs opset {MIN_OPSET} or newer: convert it "
                          "with onnx.version_converter.convert_version(model, 13)")
    for node in model.graph.node:
        if node.op_type in CONTROL_FLOW:
            # Refused rather than kept whole inside one stage: an If takes one branch for the whole batch (its
            # condition is a single value), so rows batched together would change each other's results, and a
            # Loop/Scan body is a graph of its own that cannot be cut between layers (docs/onnx.md).
            raise ConfigError(f"node {node.name or '(unnamed)'!r} is a {node.op_type}: graphs with control flow "
                              "(If/Loop/Scan) cannot be cut into layer stages, and an If picks one branch for a "
                              "whole batch; export the model with loops unrolled and the branch it takes fixed "
                              "(or its step as its own graph, as `lazybatch export gnmt` does), or serve it "
                              "unsplit with Triton's onnxruntime backend")
    if external:
        try:
            onnx.load_external_data_for_model(model, str(p.parent))
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read the external data of {str(p)!r} ({e}); keep the .data file(s) next to "
                              "the model under the names it was saved with") from None
    return LoadedModel(model, p, external)


def fold_constant_nodes(graph: onnx.GraphProto) -> None:
    """Turn Constant nodes into initializers so that every constant is one thing the splitter can copy."""
    keep = []
    for node in graph.node:
        if node.op_type == "Constant" and len(node.output) == 1:
            attr = {a.name: a for a in node.attribute}
            arr = None
            if "value" in attr:
                arr = numpy_helper.to_array(attr["value"].t)
            elif "value_float" in attr:
                arr = np.array(attr["value_float"].f, dtype=np.float32)
            elif "value_floats" in attr:
                arr = np.array(list(attr["value_floats"].floats), dtype=np.float32)
            elif "value_int" in attr:
                arr = np.array(attr["value_int"].i, dtype=np.int64)
            elif "value_ints" in attr:
                arr = np.array(list(attr["value_ints"].ints), dtype=np.int64)
            if arr is not None:
                graph.initializer.append(numpy_helper.from_array(arr, node.output[0]))
                continue
        keep.append(node)
    del graph.node[:]
    graph.node.extend(keep)
