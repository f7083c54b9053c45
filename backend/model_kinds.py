"""What a served model is made of, by kind: the table ``TritonPythonModel.initialize`` picks a builder from.

A kind is one entry of ``MODEL_KINDS``: a function that takes what the model's config says (``BuildInputs``) and
returns everything a model of that kind is served with, whole (``ModelParts``): the stage runner, the latency
table, the policy, the runtime class and what it is built with, or the whole-graph executor of a model served
without a scheduler. Nothing is written onto the model or the runtime afterwards. ``model_kind`` says which kind a
model is from its config and its stage manifest.

| kind | what is served |
|---|---|
| ``whole_graph`` | no scheduler: the whole ONNX graph on whatever Triton's own dynamic batcher grouped |
| ``seq2seq`` | the encoder/decoder-step loop under the scheduler (backend/seq2seq.py) |
| ``npu`` | the stages timed by the NPU model (backend/npu_executor.py) |
| ``stages`` | the stages, merged into segments, with the whole graph for spans or fused (backend/fusion.py) |
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, NamedTuple

from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.policies.backend_hooks import serving_costs
from lazybatch.batcher.policies.spec import PolicySpec
from lazybatch.formats.stage_manifest import TensorSpec, Manifest

from .settings import BackendSettings
from .fusion import measure_fused_ratio
from .npu_executor import maybe_wrap
from .stages import StageRunner
from .stage_profile import profile_batch_sizes
from .whole_graph import WholeGraphExecutor


class BuildInputs(NamedTuple):
    """What a builder reads: the model's settings and config, and for a scheduled model its policy and stages."""

    settings: BackendSettings
    cfg: Any  # the ModelConfig protobuf
    spec: PolicySpec | None = None  # None: whole_graph
    runner: StageRunner | None = None
    solo_threads: int = 0  # a grouped model's whole-graph threads alone on the device (arbiter/sizing.py)
    on_batch: Callable[[int, int, float], None] | None = None  # the batch log (backend/stats_logs.py)


@dataclasses.dataclass(frozen=True)
class ModelParts:
    """Everything one model is served with, built whole by its kind's builder."""

    whole_graph: WholeGraphExecutor | None = None  # no scheduler: Triton's batcher groups, this runs the graph
    runner: Any = None  # a StageRunner, or a wrapper of one (segments, fused, NPU-timed)
    table: LatencyTable | None = None
    policy: Any = None
    runtime_cls: Callable[..., Any] | None = None  # BackendRuntime, or one bound to its model (seq2seq)
    whole: StageRunner | None = None  # the whole graph for jobs that span every stage (eager's spans)
    whole_wide: bool = False  # that graph runs wider than the stages, alone on the device (solo_threads)
    fused: str | None = None  # why the stages run as whole-graph passes, if they do (the stats file says)
    segment_dir: Path | None = None  # fuse_segments: the merged segment files, removed at finalize
    seq2seq: Any = None  # a seq2seq.Seq2SeqSpec for encoder-decoder models

    @property
    def scheduled(self) -> bool:
        return self.runtime_cls is not None


Builder = Callable[[BuildInputs], ModelParts]


def executor_of(cfg: Any) -> str:
    """The ``executor`` parameter, lower case ("" where not set)."""
    return cfg.parameters["executor"].string_value.lower() if "executor" in cfg.parameters else ""


def model_kind(cfg: Any, manifest: Manifest) -> str:
    """The kind of a model served under the scheduler (``whole_graph`` is the settings' own switch)."""
    if "seq2seq" in manifest.raw:  # encoder + decoder-step loop
        return "seq2seq"
    return "npu" if executor_of(cfg) == "npu" else "stages"


def check_against_manifest(settings: BackendSettings, manifest_inputs: list[TensorSpec],
                           manifest_outputs: list[TensorSpec]) -> None:
    """config.pbtxt and the stage manifest must describe the same tensors."""
    for kind, cfg, man in (("input", settings.inputs, manifest_inputs), ("output", settings.outputs,
                                                                         manifest_outputs)):
        a = {t.name: (t.dtype, t.dims) for t in cfg}
        b = {t.name: (t.dtype, t.dims) for t in man}
        if a != b:
            raise ConfigError(f"config.pbtxt {kind}s {a} differ from the stage manifest's {b}",
                              field=kind, source=settings.name)


def load_table(settings: BackendSettings, runner: StageRunner) -> LatencyTable:
    """The model's latency table; profiled now (and saved) only when profile_on_load is set."""
    path = settings.latency_table
    if path.exists():
        table = LatencyTable.load(path)
    elif settings.profile_on_load:
        table = runner.profile(profile_batch_sizes(settings.scheduler_max_batch_size), reps=3,
                               provenance=f"profiled at load time by the lazybatch backend ({runner.providers[0]})")
        try:
            table.save(path)
        except OSError:
            pass
    else:
        raise ConfigError(f"no latency table at {path}: run `lazybatch repo add` (it profiles the stages) or "
                          "`lazybatch profile`, or set parameter profile_on_load: \"true\" to profile at load time",
                          field="parameters.latency_table", source=settings.name)
    names = [s.name for s in runner.manifest.stages]
    have = [s.name for s in table.graph.stages]
    if have != names:
        raise ConfigError(f"the latency table's stages {have[:5]}... ({len(have)}) do not match the stage "
                          f"directory's {names[:5]}... ({len(names)}); re-profile the stages", source=str(path))
    return table


def _max_batch(settings: BackendSettings, spec: PolicySpec) -> int | None:
    return settings.scheduler_max_batch_size if spec.entry.batches else None


# ---------------------------------------------------------------------- the kinds
def whole_graph(b: BuildInputs) -> ModelParts:
    """No scheduler: one session of the whole graph, warmed up (backend/whole_graph.py)."""
    return ModelParts(whole_graph=WholeGraphExecutor(b.settings, b.on_batch))


def seq2seq_model(b: BuildInputs) -> ModelParts:
    """The encoder/decoder-step loop (backend/seq2seq.py); its state and loop exits live in its runtime."""
    from . import seq2seq

    s, cfg, spec, runner = b.settings, b.cfg, b.spec, b.runner
    assert spec is not None and runner is not None
    if executor_of(cfg) == "npu":
        raise ConfigError("executor npu (NPU-timed stages) is not available for seq2seq models yet: the "
                          "encoder/decoder loop runs its own stage calls; use executor onnxruntime",
                          field="parameters.executor")
    model = seq2seq.Seq2SeqSpec(runner.manifest, str(runner.dir / "manifest.json"))
    model.check_config(s.inputs, s.outputs, {k: v.string_value for k, v in cfg.parameters.items()}, s.name)
    table = load_table(s, runner)
    policy = seq2seq.build_policy(spec, model, table, coverage=s.dec_timesteps_coverage,
                                  max_batch_size=_max_batch(s, spec), dec_timesteps=s.dec_timesteps,
                                  decoupled=s.decoupled)
    seq2seq.warm_up(runner, model)
    runtime_cls = functools.partial(seq2seq.Seq2SeqRuntime, spec=model,
                                    stream_every=s.stream_interval_tokens if s.decoupled else 0)
    return ModelParts(runner=runner, table=table, policy=policy, runtime_cls=runtime_cls, seq2seq=model)


def npu_model(b: BuildInputs) -> ModelParts:
    """Stages timed by the NPU model from their table rows (docs/npu.md): kept as they are, never merged or fused."""
    return _staged(b, merge=False)


def stages_model(b: BuildInputs) -> ModelParts:
    """The stages, merged into segments where configured; beside them the whole graph for a policy that runs spans
    of stages, or else one whole-graph pass where no stage boundary would be used."""
    return _staged(b, merge=True)


MODEL_KINDS: dict[str, Builder] = {
    "whole_graph": whole_graph,
    "seq2seq": seq2seq_model,
    "npu": npu_model,
    "stages": stages_model,
}


def _staged(b: BuildInputs, *, merge: bool) -> ModelParts:
    from .runtime import BackendRuntime

    s, spec, runner = b.settings, b.spec, b.runner
    assert spec is not None and runner is not None
    check_against_manifest(s, runner.manifest.inputs, runner.manifest.outputs)
    table = load_table(s, runner)
    policy = spec.build(max_batch_size=_max_batch(s, spec))
    whole, wide, fused, segment_dir = None, False, None, None
    if merge:
        runner, table, segment_dir = _segments(s, runner, table)
        whole, wide, fused = _whole_graph_for_spans(b, policy, runner, table)
        if whole is None:
            runner, table, fused = _fused(s, spec, policy, runner, table)
    runner, table = maybe_wrap(b.cfg, runner, table, s.scheduler_max_batch_size)  # executor: npu (docs/npu.md)
    if getattr(runner, "graphs", None):  # a padded batch costs its bucket (sessions/cuda_graphs.py)
        table = table.bucketed(runner.graph_buckets, sorted(runner.graphs))
    runner.run_all(runner.sample_inputs(1))  # warm-up: the first onnxruntime run is slow
    return ModelParts(runner=runner, table=table, policy=policy, runtime_cls=BackendRuntime, whole=whole,
                      whole_wide=wide, fused=fused, segment_dir=segment_dir)


def _segments(s: BackendSettings, runner: StageRunner, table: LatencyTable) -> tuple[Any, Any, Path | None]:
    """The stages merged into ``fuse_segments`` segments (backend/fusion.py ``segment``), or as they are. The
    merged files live in a temporary folder of this model instance (the repository may be read-only), removed
    at finalize."""
    if s.fuse_segments < 1 or s.fuse_stages == "false":
        return runner, table, None
    from .fusion import segment

    segment_dir = Path(tempfile.mkdtemp(prefix=f"lazybatch-{s.name}-segments-"))
    done = segment(runner, table, s.fuse_segments, segment_dir, execution_provider=s.execution_provider,
                   intra_op_threads=s.intra_op_threads, name=s.name)
    if done is None:
        return runner, table, segment_dir
    print(f"lazybatch: {s.name}: {runner.n_stages} stages served as {done[0].n_stages} segments "
          f"({', '.join(st.name for st in done[0].manifest.stages)})", file=sys.stderr)
    return done[0], done[1], segment_dir


def _whole_graph_for_spans(b: BuildInputs, policy: Any, runner: StageRunner,
                           table: LatencyTable) -> tuple[Any, bool, str | None]:
    """The verified whole-graph runner for a policy that runs spans of stages (backend/fusion.py
    ``spans_whole_graph``), whether it runs wider than the stages, and why; or None: the stages then stay as they
    are and fuse_stages decides as before."""
    from .fusion import fuse, wants_whole_graph_spans

    s, spec = b.settings, b.spec
    if not wants_whole_graph_spans(s.fuse_stages, spec, policy):
        return None, False, None
    done = fuse(runner, table, s.whole_graph_model, execution_provider=s.execution_provider,
                intra_op_threads=s.intra_op_threads, name=s.name)
    if done is None:
        return None, False, None
    ratio = measure_fused_ratio(runner, done[0])  # at the stages' width: what eager weighs
    costs = serving_costs(policy)
    if costs is not None:
        costs.measured_costs(fused_ratio=ratio)
    fused = (f"a job that spans all {table.graph.n} stages runs as one whole-graph pass "
             f"({ratio:.2f}x the stages' time); the scheduler keeps the stage boundaries where "
             "preempting may pay")
    if b.solo_threads:  # the device group's member alone on the device: a wider whole graph (arbiter/sizing.py)
        wide = fuse(runner, table, s.whole_graph_model, execution_provider=s.execution_provider,
                    intra_op_threads=b.solo_threads, name=s.name)
        if wide is not None:
            fused += (f"; alone on the device it runs on {b.solo_threads} intra-op threads, shared the stages run "
                      f"on {s.intra_op_threads}")
            print(f"lazybatch: {s.name}: whole-graph passes alone on the device run {b.solo_threads} intra-op "
                  f"threads; shared, the stages run {s.intra_op_threads} (device_solo_intra_op_threads)",
                  file=sys.stderr)
            return wide[0], True, fused
    return done[0], False, fused


def _fused(s: BackendSettings, spec: PolicySpec, policy: Any, runner: StageRunner,
           table: LatencyTable) -> tuple[Any, Any, str | None]:
    """Whole passes where no stage boundary would be used (backend/fusion.py); the NPU executor times stages
    from their table rows and keeps them (the ``npu`` kind never comes here)."""
    from .fusion import fuse, fuse_reason

    reason = fuse_reason(s.fuse_stages, spec, policy, table)
    if reason is None:
        return runner, table, None
    done = fuse(runner, table, s.whole_graph_model, execution_provider=s.execution_provider,
                intra_op_threads=s.intra_op_threads, name=s.name)
    if done is None:
        return runner, table, None
    fused = f"{table.graph.n} stages run as one whole-graph pass ({reason})"
    print(f"lazybatch: {s.name}: {fused}", file=sys.stderr)
    return done[0], done[1], fused
