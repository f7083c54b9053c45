"""Shared helpers for the tests that load the Triton backend model in-process (no server)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import json_format

from lazybatch.backend.settings import load_config
from lazybatch.backend.model import TritonPythonModel


def initialize_model(mdir: Path, cfg: Any = None, **params: str) -> TritonPythonModel:
    """``TritonPythonModel.initialize`` as Triton calls it, on ``mdir``'s config.pbtxt (or ``cfg``), with
    ``params`` set as config parameters; the caller finalizes it."""
    cfg = load_config(mdir / "config.pbtxt") if cfg is None else cfg
    for k, v in params.items():
        cfg.parameters[k].string_value = v
    m = TritonPythonModel()
    m.initialize({"model_config": json_format.MessageToJson(cfg), "model_repository": str(mdir),
                  "model_version": "1"})
    return m


def relu_split_mlp(root: Path, *, depth: int) -> tuple[Path, Path]:
    """A small MLP (16 -> 32 wide -> 8) and its stages cut after every Relu: (model, stage dir)."""
    import onnx

    from lazybatch.staging import make_mlp, split_model

    model = make_mlp(root / "mlp.onnx", in_dim=16, width=32, depth=depth, out_dim=8)
    relus = [i for i, n in enumerate(onnx.load(str(model)).graph.node) if n.op_type == "Relu"]
    return model, split_model(model, root / "stages", cut_after=relus)
