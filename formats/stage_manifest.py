"""The stage folder's contract (``manifest.json`` beside one ONNX file per stage), read by everyone who reads one.

``lazybatch split`` writes it (``onnx_tools/manifest.py`` builds the JSON); the backend, the offline tools
(verify, profile) and the repository tools all load it here, so a folder one accepts the others accept. Every field
is documented in docs/formats.md under "Stage manifest".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.graph import ModelGraph, Stage, StageType

from .dtypes import NUMPY_TO_TRITON, TRITON_TO_NUMPY

FORMAT = "lazybatch.stages/1"


@dataclass(frozen=True)
class TensorSpec:
    """A model-level input or output: Triton-style dims (no batch dimension; -1 is "any")."""

    name: str
    dtype: np.dtype
    dims: tuple[int, ...]
    # per-sample sizes split ran the model at, for the -1 dims (manifest ``example_dims``): what warm-up and
    # profiling feed, since a 1 there (a 1x1 image) fails in many models; not part of the tensor's identity
    example: tuple[int, ...] | None = field(default=None, compare=False)

    @property
    def data_type(self) -> str:
        return NUMPY_TO_TRITON[self.dtype]


@dataclass(frozen=True)
class StageInput:
    name: str
    source: int | None  # None: a model input; else the index of the stage that produces it


@dataclass
class StageSpec:
    index: int
    name: str
    file: str
    type: StageType
    inputs: list[StageInput]
    outputs: list[str]


@dataclass
class Manifest:
    model: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    stages: list[StageSpec]
    source: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    def graph(self) -> ModelGraph:
        return ModelGraph(self.model, [Stage(s.index, s.name, s.type) for s in self.stages])


def _dtype(value: Any, where: str, source: str) -> np.dtype:
    if isinstance(value, str) and value.upper() in TRITON_TO_NUMPY:
        return TRITON_TO_NUMPY[value.upper()]
    try:
        dt = np.dtype(value)
    except TypeError:
        raise ConfigError(f"unknown dtype {value!r}", field=where, source=source) from None
    if dt not in NUMPY_TO_TRITON:
        raise ConfigError(f"dtype {dt} is not supported by the backend", field=where, source=source)
    return dt


def _tensor(entry: Any, where: str, source: str) -> TensorSpec:
    if not isinstance(entry, Mapping) or "name" not in entry:
        raise ConfigError("expected an object with name, dtype and dims", field=where, source=source)
    dtype = _dtype(entry.get("data_type") or entry.get("dtype"), f"{where}.dtype", source)
    dims = entry.get("dims")
    if not isinstance(dims, list) or not all(isinstance(d, int) for d in dims):
        raise ConfigError("dims must be a list of integers (no batch dimension; -1 for any)", field=f"{where}.dims",
                          source=source)
    ex = entry.get("example_dims")
    example = (tuple(int(d) for d in ex) if isinstance(ex, list) and len(ex) == len(dims)
               and all(isinstance(d, int) and d > 0 for d in ex) else None)
    return TensorSpec(str(entry["name"]), dtype, tuple(dims), example)


def load_manifest(stage_dir: str | Path) -> Manifest:
    """Read and check ``stage_dir/manifest.json``: every stage input comes from the model or an earlier stage, every
    model output from a stage, and every stage file is there. The one loader of a stage folder: the offline tools
    (verify, profile) read ``raw``, the backend the typed fields."""
    d = Path(stage_dir)
    path = d / "manifest.json"
    src = str(path)
    if not path.is_file():
        raise ConfigError(f"{str(d)!r} has no manifest.json; pass a directory written by `lazybatch split` (or "
                          "`lazybatch repo add`)", source=src)
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read the stage manifest: {e.strerror}; re-run `lazybatch split`",
                          source=src) from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"not valid JSON ({e.msg} at line {e.lineno}); re-run `lazybatch split`",
                          source=src) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise ConfigError(f"unsupported format {found!r}; expected {FORMAT!r}: re-run `lazybatch split`",
                          field="format", source=src)
    inputs = [_tensor(t, f"inputs[{i}]", src) for i, t in enumerate(data.get("inputs") or [])]
    outputs = [_tensor(t, f"outputs[{i}]", src) for i, t in enumerate(data.get("outputs") or [])]
    if not inputs or not outputs:
        raise ConfigError("the manifest needs at least one input and one output", field="inputs/outputs", source=src)
    model_inputs = {t.name for t in inputs}
    produced: dict[str, int] = {}
    stages: list[StageSpec] = []
    for i, st in enumerate(data.get("stages") or []):
        where = f"stages[{i}]"
        if not isinstance(st, Mapping) or "file" not in st:
            raise ConfigError("each stage needs at least file, inputs and outputs", field=where, source=src)
        if st.get("index", i) != i:
            raise ConfigError(f"stages must be listed in order; found index {st.get('index')} at position {i}",
                              field=f"{where}.index", source=src)
        sins: list[StageInput] = []
        for j, t in enumerate(st.get("inputs") or []):
            name = str(t["name"])
            frm = t.get("from", "model")
            if frm == "model":
                if name not in model_inputs:
                    raise ConfigError(f"input {name!r} is said to come from the model, which has no such input",
                                      field=f"{where}.inputs[{j}]", source=src)
                sins.append(StageInput(name, None))
            else:
                if not isinstance(frm, int) or not 0 <= frm < i or produced.get(name) != frm:
                    raise ConfigError(f"input {name!r} comes from {frm!r}, which is not an earlier stage that "
                                      "produces it", field=f"{where}.inputs[{j}]", source=src)
                sins.append(StageInput(name, frm))
        outs = [str(t["name"]) for t in st.get("outputs") or []]
        if not outs:
            raise ConfigError("a stage needs at least one output", field=f"{where}.outputs", source=src)
        for o in outs:
            produced[o] = i
        stages.append(StageSpec(i, str(st.get("name", f"stage_{i:03d}")), str(st["file"]),
                                StageType.parse(st.get("type", "STATIC"), field=f"{where}.type", source=src),
                                sins, outs))
    if not stages:
        raise ConfigError("the manifest lists no stages", field="stages", source=src)
    for o in outputs:
        if o.name not in produced:
            raise ConfigError(f"model output {o.name!r} is produced by no stage", field="outputs", source=src)
    for s in stages:
        if not (d / s.file).is_file():
            raise ConfigError(f"stage file {s.file!r} is missing; re-run `lazybatch split`", source=src)
    return Manifest(str(data.get("model", d.name)), inputs, outputs, stages, data.get("source"), dict(data))
