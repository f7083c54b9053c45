"""The stage manifest (``manifest.json``) as ``lazybatch split`` writes it: the contract between the splitter and the
Triton backend, read back by ``lazybatch.formats.stage_manifest`` (the one loader both use).

Every field is documented in docs/formats.md under "Stage manifest". Shapes keep the batch as the string "batch"
in position 0; Triton-style ``dims`` drop it and write -1 for any other dimension that is not fixed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import onnx

from lazybatch.formats.stage_manifest import FORMAT
from lazybatch.formats.stage_manifest import load_manifest as read_stage_folder

from .dtypes import numpy_name, triton_name
from .plan import HEAVY, Plan

__all__ = ["FORMAT", "build_manifest", "input_ranges", "load_manifest", "triton_io"]


def input_ranges(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Declared value ranges of integer inputs (token ids, lengths) from the export's metadata."""
    for p in model.metadata_props:
        if p.key == "lazybatch.input_ranges":
            return json.loads(p.value)
    return {}


def _model_name(model: onnx.ModelProto, source: str) -> str:
    for p in model.metadata_props:
        if p.key == "lazybatch.model":
            return p.value
    return Path(source).stem


def _shape(plan: Plan, name: str) -> list[Any] | None:
    dims = plan.shapes.get(name, (0, None))[1]
    return None if dims is None else list(dims)


def triton_io(plan: Plan, name: str, ranges: Mapping[str, list[int]],
              examples: Mapping[str, Sequence[int]] | None = None) -> dict[str, Any]:
    """A model input or output, Triton style; ``example_dims`` (per-sample sizes for the -1 dims, see probe.py)
    where the splitter ran the model at chosen sizes."""
    et, dims = plan.shapes.get(name, (0, None))
    entry: dict[str, Any] = {"name": name, "dtype": numpy_name(et), "data_type": triton_name(et),
                             "dims": [d if isinstance(d, int) and d > 0 else -1 for d in (dims or [None, None])[1:]]}
    if name in ranges:
        entry["range"] = list(ranges[name])
    if examples and name in examples and -1 in entry["dims"]:
        entry["example_dims"] = [int(d) for d in examples[name]]
    return entry


def build_manifest(plan: Plan, stage_io: list[tuple[list[str], list[str]]], model: onnx.ModelProto, *,
                   source: str, seq2seq: Mapping[str, Any] | None, granularity: Mapping[str, Any],
                   fixes: list[str], external_data: bool, opset: int, whole_model: str,
                   version: str, examples: Mapping[str, Sequence[int]] | None = None) -> dict[str, Any]:
    g = model.graph
    ranges = input_ranges(model)
    graph_inputs = [triton_io(plan, vi.name, ranges, examples) for vi in g.input]
    graph_outputs = [triton_io(plan, vi.name, ranges) for vi in g.output]
    producer_stage = {t: k for k, (_, outs) in enumerate(stage_io) for t in outs}
    consumers: dict[str, list[int]] = {}
    for k, (ins, _) in enumerate(stage_io):
        for t in ins:
            consumers.setdefault(t, []).append(k)
    model_outputs = {vi.name for vi in g.output}
    stages = []
    for k, (ins, outs) in enumerate(stage_io):
        pos = plan.stages[k]
        nodes = [plan.active[i] for i in pos]
        stages.append({
            "index": k, "name": f"stage_{k:03d}", "file": f"stage_{k:03d}.onnx", "type": plan.stage_types[k].value,
            "inputs": [{"name": t, "dtype": numpy_name(plan.shapes.get(t, (0,))[0]), "shape": _shape(plan, t),
                        "from": producer_stage.get(t, "model")} for t in ins],
            "outputs": [{"name": t, "dtype": numpy_name(plan.shapes.get(t, (0,))[0]), "shape": _shape(plan, t),
                         "to": consumers.get(t, []), "model_output": t in model_outputs} for t in outs],
            "num_nodes": len(nodes),
            "flops": int(sum(plan.flops[i] for i in pos)),
            "heavy_ops": sum(1 for nd in nodes if nd.op_type in HEAVY),
            "first_node": nodes[0].name, "last_node": nodes[-1].name,
            "cut_width": plan.widths[k],
        })
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "model": _model_name(model, source),
        "source": source,
        "opset": opset,
        "created_by": f"lazybatch split {version}",
        "whole_model": whole_model,
        "external_data": external_data,
        "inputs": graph_inputs,
        "outputs": graph_outputs,
        "graph_inputs": graph_inputs,
        "graph_outputs": graph_outputs,
        "stages": stages,
        "granularity": {k: v for k, v in granularity.items() if v is not None} or {"default": True},
        "max_stages": plan.max_stages,
        "batch_fixes": fixes,
        "verify": None,  # filled by --verify; null means "not verified"
    }
    if seq2seq:
        manifest.update(_seq2seq_section(seq2seq, plan, graph_inputs))
    return manifest


def _seq2seq_section(spec: Mapping[str, Any], plan: Plan, graph_inputs: list[dict[str, Any]]) -> dict[str, Any]:
    sec = json.loads(json.dumps(spec))
    enc = [k for k, st in enumerate(plan.stages) if plan.part[st[0]] == 0]
    dec = [k for k, st in enumerate(plan.stages) if plan.part[st[0]] == 1]
    sec["encoder"]["stages"] = enc
    sec["decoder"]["stages"] = dec
    for part in ("encoder", "decoder"):
        for s in sec[part]["state"]:
            if s.get("init") == "start_token_id":
                s["init"] = sec["start_token_id"]
    by_name = {e["name"]: e for e in graph_inputs}
    # What a client of the served model sends and gets; the top-level inputs/outputs stay the graph's own, so
    # that every stage input "from": "model" is one of them.
    sec["served_inputs"] = [by_name[n] for n in sec.get("request_inputs", []) if n in by_name]
    sec["served_outputs"] = [{"name": "output_tokens", "dtype": "int64", "data_type": "TYPE_INT64", "dims": [-1]}]
    return {"seq2seq": sec}


def load_manifest(directory: str | Path) -> dict[str, Any]:
    """The folder's manifest as written, checked by the one loader the backend uses too."""
    return read_stage_folder(directory).raw
