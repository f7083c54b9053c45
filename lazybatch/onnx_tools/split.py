"""``lazybatch split``: write one ONNX file per stage plus manifest.json, into a directory that appears only when
everything (including ``--verify``) succeeded."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import onnx
from onnx import helper

from lazybatch import __version__
from lazybatch.batcher.errors import ConfigError
from lazybatch.sessions.ort_optimize import OPTIMIZED_WHOLE, manifest_entry, optimize_model

from .batchable import infer_shapes, make_batchable, shape_table
from .fsutil import check_target, replace_dir, staging_dir
from .loading import default_opset, fold_constant_nodes, load_model
from .manifest import FORMAT, build_manifest, input_ranges
from .plan import Plan, make_plan
from .probe import choose_examples, probe
from .zoo import EXTERNAL_DATA_THRESHOLD, seq2seq_spec

WHOLE_MODEL = "model.onnx"


@dataclass
class SplitResult:
    out: Path
    manifest: dict[str, Any]
    seconds: float


def _stage_model(plan: Plan, k: int, src: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str], list[str]]:
    """The ONNX model of stage k: its nodes, the constant nodes/initializers they need, its inputs and outputs."""
    g = src.graph
    positions = plan.stages[k]
    nodes = [plan.active[i] for i in positions]
    produced = {o for nd in nodes for o in nd.output if o}
    const_by_out = {o: nd for nd in plan.const_nodes for o in nd.output if o}
    inits = {t.name: t for t in g.initializer}
    need_const: list[onnx.NodeProto] = []
    seen: set[int] = set()
    used_inits: set[str] = set()
    stack = [t for nd in nodes for t in nd.input if t]
    while stack:
        t = stack.pop()
        if t in inits:
            used_inits.add(t)
        elif t in const_by_out and id(const_by_out[t]) not in seen:
            seen.add(id(const_by_out[t]))
            need_const.append(const_by_out[t])
            stack.extend(x for x in const_by_out[t].input if x)
    const_order = {id(nd): i for i, nd in enumerate(plan.const_nodes)}
    need_const.sort(key=lambda nd: const_order[id(nd)])
    const_outs = {o for nd in need_const for o in nd.output}
    inputs: list[str] = []
    for nd in nodes:
        for t in nd.input:
            if t and t not in produced and t not in inits and t not in const_outs and t not in inputs:
                inputs.append(t)
    later = {t for j in range(k + 1, len(plan.stages)) for i in plan.stages[j] for t in plan.active[i].input}
    graph_outputs = [o.name for o in g.output]
    outputs = [o for nd in nodes for o in nd.output if o and (o in later or o in graph_outputs)]

    def vi(name: str) -> onnx.ValueInfoProto:
        et, dims = plan.shapes.get(name, (0, None))
        if not et or dims is None:
            raise ConfigError(f"the type or rank of tensor {name!r} (between stages) could not be inferred, not "
                              "even by running the model in onnxruntime; check that the model runs, or cut "
                              "elsewhere with --max-stages / --max-cross")
        return helper.make_tensor_value_info(name, et, dims)

    graph = helper.make_graph(need_const + nodes, f"{g.name or 'model'}_stage_{k:03d}",
                              [vi(t) for t in inputs], [vi(t) for t in outputs],
                              [inits[t] for t in sorted(used_inits)])
    model = helper.make_model(graph, opset_imports=list(src.opset_import), producer_name="lazybatch split")
    model.ir_version = max(4, min(src.ir_version, 13))
    model.functions.extend(src.functions)
    return model, inputs, outputs


def _save(model: onnx.ModelProto, path: Path, external: bool) -> None:
    if external or sum(len(t.raw_data) for t in model.graph.initializer) > EXTERNAL_DATA_THRESHOLD:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=1024)
    else:
        onnx.save_model(model, str(path))


def split_model(model_path: str | Path, out: str | Path, *, max_stages: int | None = None,
                min_stage_cost: float | None = None, max_cross: int | None = None, verify: bool = False,
                force: bool = False, progress: bool = False,
                graph_optimization_level: str | None = None,
                input_shapes: Mapping[str, Sequence[int]] | None = None) -> SplitResult:
    """Split ``model_path`` into ``out``. With ``graph_optimization_level`` (basic, extended, all) the graph is
    cut after onnxruntime has optimised it at that level (see :mod:`lazybatch.sessions.ort_optimize`);
    ``model.onnx`` stays the unoptimised (batchable) model, and the optimised whole graph is kept beside it for
    --verify.

    ``input_shapes``: per-sample sizes (no batch) for inputs with dynamic dimensions besides the batch, used by
    every run of the model here and recorded in the manifest as ``example_dims`` (see :mod:`.probe`); where not
    given, sizes the model accepts are found by trying a few."""
    t0 = time.perf_counter()
    out = Path(out)
    check_target(out, force, "output directory")
    if max_stages is not None and max_stages < 1:
        raise ConfigError(f"--max-stages must be at least 1, got {max_stages}")
    loaded = load_model(model_path)
    model = loaded.model
    fold_constant_nodes(model.graph)
    fixes = make_batchable(model)
    model = infer_shapes(model)
    whole = onnx.ModelProto()
    whole.CopyFrom(model)
    del whole.graph.value_info[:]
    whole.ir_version = max(4, min(whole.ir_version, 13))
    if graph_optimization_level:
        model = infer_shapes(optimize_model(whole, graph_optimization_level, loaded.external_data))
    spec = seq2seq_spec(model)
    examples = choose_examples(whole, input_shapes, input_ranges(model))
    shapes, sizes = probe(model, shape_table(model), input_ranges(model), examples)
    plan = make_plan(model, spec, max_stages=max_stages, min_stage_cost=min_stage_cost, max_cross=max_cross,
                     shapes=shapes, sizes=sizes)
    with staging_dir(out) as tmp:
        _save(whole, tmp / WHOLE_MODEL, loaded.external_data)
        if graph_optimization_level:
            opt_whole = onnx.ModelProto()
            opt_whole.CopyFrom(model)
            del opt_whole.graph.value_info[:]
            _save(opt_whole, tmp / OPTIMIZED_WHOLE, loaded.external_data)
        stage_io: list[tuple[list[str], list[str]]] = []
        for k in range(len(plan.stages)):
            sm, ins, outs = _stage_model(plan, k, model)
            path = tmp / f"stage_{k:03d}.onnx"
            _save(sm, path, loaded.external_data)
            try:
                onnx.checker.check_model(str(path))  # by path: works for external data and files over 2 GB
            except onnx.checker.ValidationError as e:
                raise ConfigError(f"stage {k} fails onnx.checker ({str(e).splitlines()[0]}); this is a lazybatch "
                                  "bug or an unusual graph: try --max-stages with a smaller number") from None
            stage_io.append((ins, outs))
        manifest = build_manifest(plan, stage_io, model, source=Path(model_path).name, seq2seq=spec,
                                  granularity={"max_stages": max_stages, "min_stage_cost": min_stage_cost,
                                               "max_cross": max_cross},
                                  fixes=fixes, external_data=loaded.external_data, opset=default_opset(model),
                                  whole_model=WHOLE_MODEL, version=__version__, examples=examples)
        if graph_optimization_level:
            manifest["ort_optimization"] = manifest_entry(graph_optimization_level)
        if not verify:
            from .verify import check_batchable
            check_batchable(tmp, manifest)
        else:
            from .verify import verify_dir
            manifest["verify"] = verify_dir(tmp, manifest, progress=progress, original=loaded.path)
            if not manifest["verify"]["passed"]:
                v = manifest["verify"]
                raise ConfigError(f"--verify failed: chained stages differ from the whole graph (max abs error "
                                  f"{v['max_abs_err']:.3g}, {v['rel_err']:.3g} of the output scale, limit "
                                  f"{v['tolerance']:g}; worst output {v['worst_output']!r} at batch "
                                  f"{v['worst_batch']}); nothing was written. If the model hard-codes its batch "
                                  "size somewhere other than Reshape, re-export it with a dynamic batch dimension")
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        replace_dir(tmp, out)
    assert manifest["format"] == FORMAT
    return SplitResult(out, manifest, time.perf_counter() - t0)
