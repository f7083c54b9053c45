"""Consecutive stages of a split model merged back into one ONNX graph (a segment).

Why: a stage boundary is where the scheduler may preempt and merge, and it is also a cost: a session call, tensors
split and joined, and the cross-layer fusions onnxruntime cannot do across files (ResNet-50 on this project's CPU:
a job of one or two stages ran 0.82-0.87x as fast as the same stages inside the whole graph,
docs/data/mixed_probe_resnet50_120pct.txt). A policy that needs a few boundaries (an urgent request must find one
within a fraction of a pass) but not every one is better served by a handful of segments, each one onnxruntime
session, than by every stage.

The merge is plain graph surgery on the stage files the splitter wrote: their nodes, initializers and value infos
concatenated in stage order. The stages of one split come from one graph, so their tensor names are that graph's
and do not collide; an initializer that two stages both hold (a weight read on both sides of a cut) is kept once
where the copies are equal. Any other name that two stages both define is renamed in the later stage, where that
stage has no subgraphs (If/Loop bodies may read outer names); otherwise the merge is refused. The caller verifies
the merged graph against the stages on a sample batch before serving it (backend/fusion.py ``segment``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import onnx
from onnx import helper


class SegmentError(ValueError):
    """The stages cannot be merged into one graph (the message says why)."""


def balanced_cuts(times: Sequence[float], k: int) -> list[int]:
    """Where to cut ``len(times)`` stages into ``k`` consecutive segments of about equal time: the start index of
    every segment after the first (strictly increasing, each segment at least one stage). ``k`` is capped at the
    number of stages."""
    n = len(times)
    k = max(1, min(int(k), n))
    total = float(sum(times))
    prefix = [0.0]
    for t in times:
        prefix.append(prefix[-1] + float(t))
    cuts: list[int] = []
    lo = 1
    for j in range(1, k):
        hi = n - (k - j)  # leave at least one stage for every later segment
        target = total * j / k
        best = min(range(lo, hi + 1), key=lambda c: (abs(prefix[c] - target), c))
        cuts.append(best)
        lo = best + 1
    return cuts


def segment_ranges(n: int, cuts: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) of each segment of ``n`` stages cut at ``cuts``."""
    edges = [0, *cuts, n]
    return [(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


def _has_subgraphs(graph: onnx.GraphProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for node in graph.node for a in node.attribute)


def _defined(graph: onnx.GraphProto) -> set[str]:
    """Names a stage defines itself: its initializers and its nodes' outputs (not its inputs)."""
    names = {t.name for t in graph.initializer} | {t.name for t in graph.sparse_initializer}
    for node in graph.node:
        names.update(o for o in node.output if o)
    return names


def merge_stages(stage_dir: str | Path, stages: Sequence[Mapping[str, Any]], *, keep: Sequence[str],
                 name: str = "segment") -> onnx.ModelProto:
    """One model of the stages ``stages`` (manifest entries: ``file``, ``inputs`` as ``{"name"}``), run in order.

    Its inputs are the stage inputs that no earlier stage of the segment produces; its outputs are ``keep`` (the
    tensors that later stages or the model's outputs read; each must be produced here). Raises SegmentError."""
    d = Path(stage_dir)
    models = [onnx.load(str(d / st["file"])) for st in stages]
    nodes: list[onnx.NodeProto] = []
    inits: dict[str, onnx.TensorProto] = {}
    value_info: dict[str, onnx.ValueInfoProto] = {}
    inputs: dict[str, onnx.ValueInfoProto] = {}
    produced: dict[str, onnx.ValueInfoProto] = {}  # every stage output seen so far, with its type
    defined: set[str] = set()
    opsets: dict[str, int] = {}
    functions: dict[tuple[str, str], onnx.FunctionProto] = {}
    for i, m in enumerate(models):
        g = m.graph
        if g.sparse_initializer:
            raise SegmentError(f"stage file {stages[i]['file']} has sparse initializers, which are not merged")
        for op in m.opset_import:
            opsets[op.domain] = max(opsets.get(op.domain, 0), op.version)
        for f in m.functions:
            functions.setdefault((f.domain, f.name), f)
        boundary = {v.name for v in g.input} | {v.name for v in g.output}
        clash = set()
        for t in g.initializer:  # an equal copy of an earlier stage's weight is the same weight
            if t.name in inits and t.name not in boundary:
                if inits[t.name].SerializeToString() != t.SerializeToString():
                    clash.add(t.name)
        shared_weights = {t.name for t in g.initializer if t.name in inits and t.name not in clash}
        clash |= (_defined(g) & defined) - boundary - shared_weights
        rename = {}
        if clash:
            if _has_subgraphs(g):
                raise SegmentError(f"stage file {stages[i]['file']} defines {sorted(clash)[:3]}, which an earlier "
                                   "stage defines too, and has subgraphs that may read them")
            rename = {c: f"{name}/s{i}/{c}" for c in clash}
        weights = {t.name for t in g.initializer}  # an old-style input with a default value is a weight
        for v in g.input:
            if v.name not in produced and v.name not in inputs and v.name not in weights:
                inputs[v.name] = v
        for t in g.initializer:
            if t.name in shared_weights:
                continue
            t2 = onnx.TensorProto()
            t2.CopyFrom(t)
            t2.name = rename.get(t.name, t.name)
            inits[t2.name] = t2
        for node in g.node:
            n2 = onnx.NodeProto()
            n2.CopyFrom(node)
            n2.name = f"s{i}/{node.name}" if node.name else f"s{i}/{node.op_type}_{len(nodes)}"
            for j, x in enumerate(n2.input):
                if x in rename:
                    n2.input[j] = rename[x]
            for j, x in enumerate(n2.output):
                if x in rename:
                    n2.output[j] = rename[x]
            nodes.append(n2)
        for v in g.value_info:
            v2 = onnx.ValueInfoProto()
            v2.CopyFrom(v)
            v2.name = rename.get(v.name, v.name)
            value_info.setdefault(v2.name, v2)
        for v in g.output:
            produced[v.name] = v
        defined |= {rename.get(x, x) for x in _defined(g)}
    missing = [k for k in keep if k not in produced]
    if missing:
        raise SegmentError(f"the segment's stages do not produce {missing}")
    outputs = [produced[k] for k in keep]
    for k in list(value_info):
        if k in inputs or k in keep:
            del value_info[k]
    graph = helper.make_graph(nodes, name, list(inputs.values()), outputs, list(inits.values()),
                              value_info=list(value_info.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(dom, v) for dom, v in opsets.items()],
                              producer_name="lazybatch-segments")
    model.ir_version = max(m.ir_version for m in models)
    model.functions.extend(functions.values())
    return model
