"""Whole passes where stage boundaries buy nothing (config parameter ``fuse_stages``).

A stage boundary is where LazyBatching preempts and merges; it is also a cost: a session call, tensors split per
request and joined again, and the cross-layer fusions onnxruntime cannot do across files (ResNet-50 on this CPU:
50 ms staged against 41 ms as one graph). Where the latency table says batching buys nothing, lazy's batch cap is 1
(``useful_batch_size``): it never forms a sub-batch, so it never preempts (a newcomer may only preempt as many
requests as can later merge with the preempted sub-batch: none) and never merges. The boundaries then only cost, and
``fuse_stages: auto`` runs each request through the whole graph in one onnxruntime call, as Triton would.

- ``auto`` (default): lazy and oracle fuse when their batch cap is 1. Serial and graph batching stay stage by stage:
  they are the layer-wise baselines of the papers' comparisons. Eager (the default policy) keeps the stages and
  the whole graph beside them: it decides per job how far to run without a decision point (``StageJob.stop``,
  batcher/policies/eager.py), and a job that spans every stage runs as one whole-graph call.
- ``true``: any scheduler policy runs whole passes (no preemption or regrouping inside a pass).
- ``false``: always stage by stage.

The fused model is the whole graph the stages were split from (``whole_graph_model``, ``model.onnx``). At load it
must have the stages' inputs and outputs and give their result on a sample batch; if it does not, the model is
served stage by stage and the log says why (a user who replaced one file without the other loses nothing).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from lazybatch.batcher.graph import ModelGraph, Stage, StageType
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.policies.lazy import useful_batch_size
from lazybatch.batcher.policies.spec import PolicySpec
from lazybatch.formats.stage_manifest import Manifest, StageInput, StageSpec

from .stages import StageRunner

FUSE_MODES = ("auto", "true", "false")
FUSED_STAGE = "whole_graph"


def wants_whole_graph_spans(mode: str, spec: PolicySpec, policy: Any) -> bool:
    """Whether the backend should hold the whole graph beside the stages: for a policy that asks for spans of stages
    (``StageJob.stop``; the registry's ``whole_graph_spans``), a span of every stage runs as one onnxruntime call.
    ``fuse_stages: auto`` (and ``true`` keeps its meaning: whole passes only; ``false``: never)."""
    return mode == "auto" and spec.entry.whole_graph_spans and bool(getattr(policy, "spans", True))


def fuse_reason(mode: str, spec: PolicySpec, policy: Any, table: LatencyTable) -> str | None:
    """Why this model should run whole passes, or None where stage boundaries are (or may be) of use."""
    if mode == "false":
        return None
    if mode == "true":
        return "fuse_stages: true"
    if spec.entry.whole_when_unbatched and useful_batch_size(table, policy.max_batch_size,
                                                             policy.min_batch_gain) == 1:
        return (f"fuse_stages: auto, {policy.name}'s batch cap is 1 (one more sample costs at least "
                f"{1 - policy.min_batch_gain:.0%} of a batch-1 run): no sub-batch to preempt or merge")
    return None


def fused_manifest(manifest: Manifest, whole_model: Path) -> Manifest:
    """One stage: the whole graph, from the model inputs to the model outputs."""
    stage = StageSpec(0, FUSED_STAGE, str(whole_model.resolve()), StageType.STATIC,
                      [StageInput(t.name, None) for t in manifest.inputs], [o.name for o in manifest.outputs])
    return Manifest(manifest.model, manifest.inputs, manifest.outputs, [stage], manifest.source,
                    {k: v for k, v in manifest.raw.items() if k not in ("inplace", "stages")})


def fused_table(table: LatencyTable) -> LatencyTable:
    """The stages' times summed per batch size: an upper bound of the fused pass (the backend's time_scale
    calibration brings it to what the fused pass really takes after a few runs)."""
    graph = ModelGraph(table.graph.name, [Stage(0, FUSED_STAGE, StageType.STATIC)])
    rows = [[sum(table.dense[s][b] for s in range(table.graph.n)) for b in table.batch_sizes]]
    return LatencyTable(graph, table.batch_sizes, rows, provenance=f"{table.provenance}; stages summed (fused)",
                        meta=dict(table.meta, fused_from_stages=table.graph.n))


def fuse(runner: StageRunner, table: LatencyTable, whole_model: Path, *, execution_provider: str,
         intra_op_threads: int, name: str, rtol: float = 1e-3,
         atol: float = 1e-4) -> tuple[StageRunner, LatencyTable] | None:
    """The whole-graph runner and its one-row table, or None (with a log line) where the whole graph cannot stand in
    for the stages."""
    if not whole_model.exists():
        print(f"lazybatch: {name}: fuse_stages wanted, but there is no whole graph at {whole_model}; serving stage "
              "by stage", file=sys.stderr)
        return None
    try:
        fused = StageRunner(runner.dir, manifest=fused_manifest(runner.manifest, whole_model),
                            execution_provider=execution_provider, intra_op_threads=intra_op_threads,
                            inplace_residuals=False, device_tensors=runner.resident is not None,
                            device_id=runner.device_id, graph_buckets=runner.graph_buckets,
                            stream=runner.stream)
        sample = runner.sample_inputs(2, seed=7)
        want = runner.run_all(sample)
        got = fused.run_all(sample)
    except Exception as e:  # ConfigError from the session check, onnxruntime's own types from a run (a whole
        # graph with a fixed batch dimension of 1 fails on the sample batch of 2: it cannot serve the batches either)
        print(f"lazybatch: {name}: the whole graph cannot stand in for the stages ({e}); serving stage by stage",
              file=sys.stderr)
        return None
    if (fused.resident is None) != (runner.resident is None):  # spans hand their tensors to the stages
        print(f"lazybatch: {name}: the whole graph refused the stages' device path ({fused.resident_refused}); "
              "serving stage by stage", file=sys.stderr)
        return None
    for o in runner.output_names:
        a, b = np.asarray(want[o]), np.asarray(got[o])
        same = a.shape == b.shape and (np.array_equal(a, b) if a.dtype.kind not in "fc" else
                                       np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True))
        if not same:
            print(f"lazybatch: {name}: {whole_model} does not give the stages' result for output {o!r} on a sample "
                  "batch; serving stage by stage", file=sys.stderr)
            return None
    return fused, fused_table(table)


def measure_fused_ratio(runner: StageRunner, whole: StageRunner, reps: int = 5) -> float:
    """Whole-graph pass / the stages run one after the other, at batch 1 (medians of ``reps`` interleaved runs, at
    load time): what cutting a whole pass into stages loses (cross-layer fusions, a session call per stage), which
    eager weighs with the boundary cost (``fused_ratio``). At most 1: a whole pass never costs more than its
    stages (a larger reading is noise)."""
    sample = runner.sample_inputs(1, seed=3)
    staged, fused = [], []
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        runner.run_all(sample)
        t1 = time.perf_counter()
        whole.run_all(sample)
        t2 = time.perf_counter()
        staged.append(t1 - t0)
        fused.append(t2 - t1)
    return min(1.0, statistics.median(fused) / max(statistics.median(staged), 1e-9))


def segment_manifest(manifest: Manifest, ranges: list[tuple[int, int]], last_use: dict[str, int],
                     files: list[str]) -> Manifest:
    """The manifest of a model served as ``ranges`` of its stages, segment ``j`` in ``files[j]``: a segment reads
    what its stages read from the model or from earlier segments, and yields what later segments or the model's
    outputs read."""
    seg_of = {s: j for j, (a, b) in enumerate(ranges) for s in range(a, b)}
    specs = []
    for j, (a, b) in enumerate(ranges):
        ins: dict[str, StageInput] = {}
        for st in manifest.stages[a:b]:
            for i in st.inputs:
                if i.source is None or i.source < a:
                    ins.setdefault(i.name, StageInput(i.name, None if i.source is None else seg_of[i.source]))
        outs = [o for st in manifest.stages[a:b] for o in st.outputs if last_use.get(o, -1) >= b]
        specs.append(StageSpec(j, f"segment_{a:02d}_{b - 1:02d}", files[j], StageType.STATIC, list(ins.values()),
                               outs))
    raw = {k: v for k, v in manifest.raw.items() if k not in ("inplace", "stages")}
    raw["segments"] = [[a, b] for a, b in ranges]
    return Manifest(manifest.model, manifest.inputs, manifest.outputs, specs, manifest.source, raw)


def segment_table(table: LatencyTable, ranges: list[tuple[int, int]]) -> LatencyTable:
    """Each segment's time: its stages' summed, per batch size (an upper bound of the merged pass, which fuses
    across the old boundaries; the backend's recalibration brings it to what the segment takes)."""
    names = [f"segment_{a:02d}_{b - 1:02d}" for a, b in ranges]
    graph = ModelGraph(table.graph.name, [Stage(j, names[j], StageType.STATIC) for j in range(len(ranges))])
    rows = [[sum(table.dense[s][b] for s in range(lo, hi)) for b in table.batch_sizes] for lo, hi in ranges]
    return LatencyTable(graph, table.batch_sizes, rows, provenance=f"{table.provenance}; stages summed per segment",
                        meta=dict(table.meta, segments=[[a, b] for a, b in ranges]))


def segment(runner: StageRunner, table: LatencyTable, k: int, out_dir: Path, *, execution_provider: str,
            intra_op_threads: int, name: str, rtol: float = 1e-3,
            atol: float = 1e-4) -> tuple[StageRunner, LatencyTable] | None:
    """The model's stages merged into ``k`` segments of about equal batch-1 time (config ``fuse_segments``), each
    one onnxruntime session: the runner and its table, or None (with a log line) where they cannot stand in for
    the stages (a merge refused, or a different result on a sample batch); the model is then served stage by stage.
    The merged files go to ``out_dir``."""
    import onnx

    from lazybatch.sessions.segments import balanced_cuts, merge_stages, segment_ranges

    if table.graph.is_seq2seq:
        print(f"lazybatch: {name}: fuse_segments is for static graphs; the decoder loop keeps its stages",
              file=sys.stderr)
        return None
    n = runner.n_stages
    ranges = segment_ranges(n, balanced_cuts([table.dense[s][1] for s in range(n)], k))
    if len(ranges) >= n:
        return None  # as many segments as stages: nothing to merge
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        files = []
        for j, (a, b) in enumerate(ranges):
            keep = [o for st in runner.manifest.stages[a:b] for o in st.outputs if runner.last_use.get(o, -1) >= b]
            entries = [{"file": st.file} for st in runner.manifest.stages[a:b]]
            model = merge_stages(runner.dir, entries, keep=keep, name=f"{name}_segment_{j}")
            files.append(f"segment_{j:02d}.onnx")
            big = sum(len(t.raw_data) for t in model.graph.initializer) > 1_500_000_000
            onnx.save_model(model, str(out_dir / files[-1]), save_as_external_data=big,
                            all_tensors_to_one_file=True, location=f"segment_{j:02d}.data")
        seg = StageRunner(out_dir, manifest=segment_manifest(runner.manifest, ranges, runner.last_use, files),
                          execution_provider=execution_provider, intra_op_threads=intra_op_threads,
                          inplace_residuals=False, device_tensors=runner.resident is not None,
                          device_id=runner.device_id, graph_buckets=runner.graph_buckets,
                          stream=runner.stream)
        checks = []
        for batch in (2, 1):  # a batch where the stages take one (a graph with a fixed batch of 1 does not)
            sample = runner.sample_inputs(batch, seed=11)
            try:
                want = runner.run_all(sample)
            except Exception:
                continue
            checks.append((want, seg.run_all(sample)))
    except Exception as e:  # SegmentError, OSError, onnxruntime's own types
        print(f"lazybatch: {name}: cannot serve the stages as {len(ranges)} segments ({e}); serving stage by stage",
              file=sys.stderr)
        return None
    for want, got in checks:
        for o in runner.output_names:
            a, b = np.asarray(want[o]), np.asarray(got[o])
            if not (a.shape == b.shape and (np.array_equal(a, b) if a.dtype.kind not in "fc" else
                                            np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True))):
                print(f"lazybatch: {name}: the segments do not give the stages' result for output {o!r} on a sample "
                      "batch; serving stage by stage", file=sys.stderr)
                return None
    if not checks:
        print(f"lazybatch: {name}: the stages run on no sample batch, so the segments cannot be checked; serving "
              "stage by stage", file=sys.stderr)
        return None
    return seg, segment_table(table, ranges)
