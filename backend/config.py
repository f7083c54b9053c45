"""The model's ``config.pbtxt``: parsed with the protobuf classes tritonclient ships, never by hand.

``BackendSettings`` gathers what the backend needs from it (Triton-style parameter names, see docs/triton.md), and
``validate_request`` checks one request's tensors against the config so that a bad request is answered at once with
a message that says what is wrong, instead of failing inside a batch that also holds good requests.
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.policies.registry import DEFAULT_POLICY as REPO_DEFAULT_POLICY, policy_choices
from lazybatch.formats.dtypes import TRITON_TO_NUMPY
from lazybatch.formats.example_dims import parse_example_dims

from .stages import TensorSpec

# Each poll is a round trip to the server process per held request: at a fixed 2 ms it was most of the backend's own
# cost in the NPU-served benchmark (docs/npu.md), and a fixed 50 ms left a cancelled request running ~25 ms (median)
# after its cancel. The default (0, written "auto") paces the asks by the model's stage times instead, within a
# bounded IPC load (backend/cancel_watch.py).
DEFAULT_CANCEL_POLL_MS = 0.0
# ... except on decoupled models. Their streamed parts reach Triton through the same stub-to-server message path as
# the asks, and asks paced by stage times (the LM's are under 1 ms: about 1000 asks a second) held the parts back:
# served at 90% load the LM's mean time to first token at the client was 48-250 ms (p99 0.3-1.6 s) while its parts
# left the backend 24.5 ms after arrival on average; at a fixed 100 ms the client saw 19-21 ms (p99 39-45 ms), at
# 1000 ms 22-23 ms (a probe of git commit 0cd9c15, benchmarks/probes/probe_first_part.py; its output is in git there,
# docs/data/first_part_probe.txt). A cancel on a stream is then answered within about 100 ms; an explicit
# cancel_poll_ms wins.
DECOUPLED_CANCEL_POLL_MS = 100.0
WHOLE_GRAPH = "whole_graph"  # the model runs the whole ONNX graph on what Triton batched (dynamic_batching)
DEFAULT_POLICY = "lazy"  # a config.pbtxt without a policy parameter

DEFAULT_DEVICE_LANES = 2  # served, on 2 cores: two one-thread lanes beat one lane of two threads (docs/colocation.md)

PARAMETERS = {
    "policy": f"{policy_choices()} (parameters as policy:key=value,..., e.g. lazy:preempt=benefit, "
              "graph:max_queue_delay_microseconds=..,preferred_batch_size=4/8; batcher/policies/registry.py) "
              f"| {WHOLE_GRAPH} (no scheduler: Triton's own dynamic_batching forms the batches); default "
              f"{DEFAULT_POLICY} where the parameter is absent (`lazybatch repo add` writes {REPO_DEFAULT_POLICY})",
    "sla_ms": "default SLA target of a request in ms (a request may override it with its own sla_ms parameter)",
    "stage_dir": "stage directory (manifest.json + stage ONNX files), relative to the version folder",
    "latency_table": "latency table (JSON/CSV), relative to the version folder",
    "whole_graph_model": "the whole-graph ONNX file (used by policy whole_graph), relative to the version folder",
    "profile_on_load": "true: profile the stages at load time when the latency table is missing",
    "example_dims": "per-sample sizes of the dynamic (-1) input dims, perf_analyzer's --shape form, ';' between "
                    "inputs (images:3,320,320): what warm-up feeds and what clients send (`lazybatch repo add` "
                    "writes the stage manifest's example_dims; without it the manifest's are read, else 1)",
    "scheduler_max_batch_size": "largest sub-batch the scheduler forms, in samples (default: max_batch_size)",
    "dec_timesteps": "decoder steps assumed by the slack predictor (seq2seq)",
    "dec_timesteps_coverage": "fraction of the output-length histogram dec_timesteps covers (default 0.9)",
    "allow_nan": "true (default): float inputs may hold NaN/Inf, as in Triton's own backends (perf_analyzer's "
                 "default random data has them) | false: such requests are refused with INVALID_ARG",
    "execution_provider": "auto (CUDA when onnxruntime has it, else CPU) | cpu | cuda",
    "intra_op_threads": "onnxruntime intra-op threads (0: onnxruntime's default)",
    "use_per_session_threads": "true: every stage session gets its own intra-op pool, spinning off (onnxruntime's "
                               "name); default false: one pool per model instance shared by all its stages",
    "use_env_allocators": "true (default): every onnxruntime session of the model instance (each stage and the whole "
                          "graph) allocates from one CPU arena registered in onnxruntime's environment, so that a "
                          "split model holds one working set, not one per stage (onnxruntime's name; "
                          "sessions/arena.py) | false: an arena per session, onnxruntime's default",
    "inplace_residuals": "true (default): residual stages write their output over their shortcut input, as "
                         "onnxruntime does in the whole graph (docs/onnx.md); false: plain session.run",
    "cancel_poll_ms": "auto (default; 0 is the same): the watcher thread asks each running request whether the "
                      "client cancelled it just before its stage ends and queued ones about once a stage time, so "
                      "a cancel is answered and its compute stops within about one stage time (sweeps >= 2 ms apart, "
                      "<= 16 round trips each, <= 1000 a second); on a decoupled model 100 ms (the asks share the "
                      "path of the streamed parts) | <ms>: each held request at most once per "
                      "<ms>, the rule before (50 was the default; backend/cancel_watch.py)",
    "fuse_stages": "auto (default): eager runs a job that spans every stage as the whole graph in one onnxruntime "
                   "call; lazy and oracle run each request through the whole graph "
                   "where their batch cap is 1 (batching buys nothing, so no boundary is ever used) | true: "
                   "every scheduler policy runs whole passes | false: always stage by stage (backend/fusion.py)",
    "fuse_segments": "0 (default): the scheduler sees every stage of the split | <N>: the stages are merged at load "
                     "into N segments of about equal batch-1 time, each one onnxruntime session, and the scheduler "
                     "preempts and merges only at their N-1 boundaries (fewer session calls; cross-layer fusions "
                     "kept); static graphs (backend/fusion.py segment)",
    "response_thread": "true (default): responses are built and sent on a thread of their own, so the scheduler "
                       "runs the next stage while pb_utils' send waits for the Triton process | false: sent inline "
                       "by the scheduler thread (backend/responder.py)",
    "batch_per_execute": "false (default) | true: each group Triton's dynamic batcher hands to execute is served "
                         "as one batch to its end (graph:0 in the scheduler), and execute returns only once every "
                         "request of it is answered: Triton's batcher as the only batcher, for models with a loop "
                         "inside (seq2seq under `repo add --policy triton:<us>`)",
    "stream_interval_tokens": "decoupled seq2seq models (model_transaction_policy { decoupled: true }): a response "
                              "goes out once a row holds this many new tokens (default 1: every token); the last "
                              "one carries the final flag (backend/seq2seq.py)",
    # seq2seq models: written by `lazybatch repo add` for clients, checked against the stage manifest at load
    "max_source_length": "seq2seq: most source tokens a request may send",
    "max_output_length": "seq2seq: most tokens the decoder generates per sequence",
    "vocab_size": "seq2seq: token ids are 0..vocab_size-1",
    "length_histogram": "seq2seq: the shipped length histogram clients draw request lengths from (chat, wmt)",
}
# production knobs (docs/operations.md); queue names follow Triton's ModelQueuePolicy
PARAMETERS.update({
    "device_group": "absent, empty or none (default): the model has the device to itself, as Triton's per-model "
                    "batchers (served figures: docs/results/colocation.md) | <name>: lazybatch models of one server in "
                    "one group share the device through an arbiter process that picks the next stage job across "
                    "them, started only once a second member loads (docs/colocation.md, \"Served: the arbiter\"); a "
                    "model alone in time holds a lease and runs as an ungrouped one, inline route included | auto: "
                    "the group of the model instance's device (cpu for KIND_CPU, gpu<N> for KIND_GPU device N, npu "
                    "for executor npu; none for a model with more than one instance on its device). Refused for "
                    "policy whole_graph or batch_per_execute (triton:<us>: Triton's batcher runs whole executions)",
    "device_weight": "device_group models: the model's weight in the device's fair share (a number > 0, default 1): "
                     "while models wait for the device, their device time is shared in proportion to their weights",
    "device_priority_level": "device_group models: the model's priority level at the device (an integer >= 0, "
                             "default 0; smaller is more urgent, as Triton's priority levels): a waiting model of a "
                             "more urgent level gets the device first, within the fair share's bound",
    "device_max_queue_size": "device_group models: most samples held across every model of the group (queued or in "
                             "flight; default 0: unbounded); an arrival past it is rejected UNAVAILABLE, saying the "
                             "shared device's queue is full (set it alike on the group's models: each checks its own)",
    "device_lanes": "device_group models: how many stage jobs the group's device runs at once (an integer 1..64, "
                    f"default {DEFAULT_DEVICE_LANES}, from the served figures); one value per group: the arbiter is "
                    "started with the first member's, and a model whose value differs fails its load saying both. "
                    "With more than one lane and intra_op_threads unset, each member's onnxruntime pool gets the "
                    "instance's cores divided among the lanes (at least one thread; docs/colocation.md, \"Lanes\")",
    "device_solo_intra_op_threads": "device_group models: onnxruntime intra-op threads of a whole-graph pass run "
                                    "while the model is alone on the device (no other member active: the solo "
                                    "lease, or no second member yet); default: the instance's cores, where its "
                                    "lanes leave its stages one thread each; 0: such passes keep the lane's "
                                    "threads. Shared, the model runs its stages at the lane's threads "
                                    "(docs/colocation.md, \"Width alone\")",
    "max_queue_size": "most samples the scheduler holds (queued or in flight); more are rejected UNAVAILABLE "
                      "(default 0: unbounded)",
    "timeout_action": "REJECT: refuse a request whose deadline the predictor says cannot be met | DELAY: serve it "
                      "late (default)",
    "metrics": "true (default): export Triton custom metrics (lazybatch_*) on the metrics port",
    "metrics_interval_ms": "how often the metrics are pushed to Triton (default 1000)",
    "memory_release_ms": "at an idle moment at most this often, onnxruntime's arenas are shrunk (at each session's "
                         "next run) and glibc's free heap is returned, so that a burst's memory comes back "
                         "(default 5000; 0: never; backend/memory.py)",
    "fault_injection": "tests only: stage=<index|name>,every=<N>[,mode=sample|run] makes that stage raise "
                       "(default off)",
    # request priorities, named and read like Triton's dynamic_batching priority_levels/default_priority_level
    "priority_levels": "number of request priority levels, 1 the most urgent (default 0: request priorities are "
                       "ignored)",
    "default_priority_level": "the level of a request that sends no request_priority (or 0); required with "
                              "priority_levels",
})

from .npu_executor import PARAMETERS as _NPU_EXECUTOR_PARAMETERS  # noqa: E402 (read by npu_executor.py)

PARAMETERS.update(_NPU_EXECUTOR_PARAMETERS)


def model_config_pb2() -> Any:
    from tritonclient.grpc import model_config_pb2 as pb

    return pb


def parse_config_text(text: str, *, source: str | None = None) -> Any:
    """config.pbtxt text -> inference.ModelConfig."""
    from google.protobuf import text_format

    cfg = model_config_pb2().ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as e:
        raise ConfigError(f"not a valid model config: {e}", source=source) from None
    return cfg


def parse_config_json(text: str) -> Any:
    """Triton hands ``initialize`` the (auto-completed) config as JSON."""
    from google.protobuf import json_format

    cfg = model_config_pb2().ModelConfig()
    json_format.Parse(text, cfg, ignore_unknown_fields=True)
    return cfg


def load_config(path: str | Path) -> Any:
    p = Path(path)
    try:
        return parse_config_text(p.read_text(), source=str(p))
    except OSError as e:
        raise ConfigError(f"cannot read the model config: {e.strerror}", source=str(p)) from None


def config_to_text(cfg: Any) -> str:
    from google.protobuf import text_format

    return text_format.MessageToString(cfg)


def _param(cfg: Any, key: str, default: str | None = None) -> str | None:
    if key in cfg.parameters:
        return cfg.parameters[key].string_value.strip()
    return default


def _bool(text: str | None, key: str) -> bool:
    if text is None:
        return False
    t = text.lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{key} must be true or false, got {text!r}", field=f"parameters.{key}")


def _number(text: str | None, key: str, kind: type = float) -> Any:
    if text is None or text == "":
        return None
    try:
        v = kind(text)
    except ValueError:
        raise ConfigError(f"{key} must be a number, got {text!r}", field=f"parameters.{key}") from None
    if not math.isfinite(v) or v < 0:
        raise ConfigError(f"{key} must be a finite number >= 0, got {text!r}", field=f"parameters.{key}")
    return v


@dataclass
class BackendSettings:
    """What the backend reads from config.pbtxt (paths resolved against the version folder)."""

    name: str
    policy: str
    max_batch_size: int
    scheduler_max_batch_size: int
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    sla_ms: float | None
    stage_dir: Path
    latency_table: Path
    whole_graph_model: Path
    profile_on_load: bool
    dec_timesteps: int | None
    dec_timesteps_coverage: float
    allow_nan: bool
    execution_provider: str
    intra_op_threads: int
    cancel_poll_ms: float
    use_per_session_threads: bool = False
    use_env_allocators: bool = True
    inplace_residuals: bool = True
    fuse_stages: str = "auto"
    fuse_segments: int = 0
    response_thread: bool = True
    batch_per_execute: bool = False
    decoupled: bool = False  # model_transaction_policy { decoupled: true }: seq2seq models stream their tokens
    stream_interval_tokens: int = 1
    max_queue_size: int = 0
    timeout_action: str = "DELAY"
    metrics: bool = True
    metrics_interval_ms: float = 1000.0
    memory_release_ms: float = 5000.0
    fault_injection: str = ""
    priority_levels: int = 0
    default_priority_level: int = 0
    device_group: str = ""  # co-located models' shared device (backend/arbiter); "": the device's (default_group)
    device_group_none: bool = True  # device_group absent, empty or "none": the model keeps off every shared device
    device_group_auto: bool = False  # device_group "auto": the group of the instance's device (default_device_group)
    device_weight: float = 1.0  # its weight in the device's fair share
    device_priority_level: int = 0  # its priority at the device (smaller: more urgent)
    device_max_queue_size: int = 0  # samples held across the group's models (0: unbounded)
    device_lanes: int = DEFAULT_DEVICE_LANES  # stage jobs the group's device runs at once (alike on the group's models)
    device_solo_intra_op_threads: int = -1  # whole passes alone on the device: -1 the cores (solo_threads), 0 off

    def request_level(self, priority: int) -> tuple[int, str | None]:
        """The scheduler's priority level for a request's ``request_priority`` (0 or absent: the default level),
        or an error; with no ``priority_levels`` every request gets level 0 (FIFO), as in Triton."""
        if self.priority_levels == 0:
            return 0, None
        if priority == 0:
            return self.default_priority_level, None
        if not 1 <= priority <= self.priority_levels:
            return 0, (f"request_priority {priority} is outside 1..{self.priority_levels} (the model's "
                       f"priority_levels; 1 is the most urgent, 0 means the default level "
                       f"{self.default_priority_level})")
        return priority, None

    @property
    def whole_graph(self) -> bool:
        return self.policy == WHOLE_GRAPH

    @classmethod
    def from_config(cls, cfg: Any, version_dir: str | Path) -> "BackendSettings":
        vdir = Path(version_dir)
        unknown = sorted(k for k in cfg.parameters if k not in PARAMETERS)
        if unknown:
            raise ConfigError(f"unknown parameters {unknown}; known: {', '.join(PARAMETERS)}", field="parameters")
        if cfg.max_batch_size < 1:
            raise ConfigError("max_batch_size must be at least 1: the backend batches along dimension 0",
                              field="max_batch_size")
        stage_dir = vdir / (_param(cfg, "stage_dir") or "stages")
        examples = _example_dims(cfg, stage_dir)
        inputs = [_spec(t, "input", examples.get(t.name)) for t in cfg.input]
        outputs = [_spec(t, "output") for t in cfg.output]
        if not inputs or not outputs:
            raise ConfigError("the config needs input and output sections", field="input/output")
        policy = (_param(cfg, "policy", DEFAULT_POLICY) or DEFAULT_POLICY).lower()
        smbs = _number(_param(cfg, "scheduler_max_batch_size"), "scheduler_max_batch_size", int)
        dts = _number(_param(cfg, "dec_timesteps"), "dec_timesteps", int)
        cov = _number(_param(cfg, "dec_timesteps_coverage"), "dec_timesteps_coverage")
        sla = _number(_param(cfg, "sla_ms"), "sla_ms")
        if sla is not None and sla <= 0:
            raise ConfigError("sla_ms must be positive (leave it out for no SLA)", field="parameters.sla_ms")
        per_execute = _bool(_param(cfg, "batch_per_execute"), "batch_per_execute")
        if per_execute and not policy.startswith("graph"):
            raise ConfigError(f"batch_per_execute serves each execute's group as one batch; it needs policy graph:0 "
                              f"(no batching of the scheduler's own), not {policy!r}", field="parameters.policy")
        decoupled = bool(cfg.model_transaction_policy.decoupled)
        if decoupled and policy == WHOLE_GRAPH:
            raise ConfigError("a decoupled model (model_transaction_policy { decoupled: true }) needs a scheduler "
                              f"policy: {WHOLE_GRAPH} answers from execute, which a decoupled model may not",
                              field="model_transaction_policy.decoupled")
        interval = _number(_param(cfg, "stream_interval_tokens"), "stream_interval_tokens", int)
        if interval is not None and interval < 1:
            raise ConfigError("stream_interval_tokens must be at least 1", field="parameters.stream_interval_tokens")
        return cls(
            name=cfg.name, policy=policy, max_batch_size=int(cfg.max_batch_size),
            scheduler_max_batch_size=int(smbs) if smbs else int(cfg.max_batch_size),
            inputs=inputs, outputs=outputs, sla_ms=sla,
            stage_dir=stage_dir,
            latency_table=vdir / (_param(cfg, "latency_table") or "latency.json"),
            whole_graph_model=vdir / (_param(cfg, "whole_graph_model") or "model.onnx"),
            profile_on_load=_bool(_param(cfg, "profile_on_load"), "profile_on_load"),
            dec_timesteps=int(dts) if dts else None,
            dec_timesteps_coverage=0.9 if cov is None else float(cov),
            allow_nan=_bool(_param(cfg, "allow_nan", "true"), "allow_nan"),
            execution_provider=_param(cfg, "execution_provider", "auto") or "auto",
            intra_op_threads=int(_number(_param(cfg, "intra_op_threads"), "intra_op_threads", int) or 0),
            cancel_poll_ms=_cancel_poll_ms(_param(cfg, "cancel_poll_ms"), decoupled),
            use_per_session_threads=_bool(_param(cfg, "use_per_session_threads"), "use_per_session_threads"),
            use_env_allocators=_bool(_param(cfg, "use_env_allocators", "true"), "use_env_allocators"),
            inplace_residuals=_bool(_param(cfg, "inplace_residuals", "true"), "inplace_residuals"),
            fuse_stages=_fuse_mode(_param(cfg, "fuse_stages", "auto")),
            fuse_segments=_fuse_segments(_param(cfg, "fuse_segments")),
            response_thread=_bool(_param(cfg, "response_thread", "true"), "response_thread"),
            batch_per_execute=per_execute,
            decoupled=decoupled,
            stream_interval_tokens=int(interval or 1),
            **_device_settings(cfg, WHOLE_GRAPH if policy == WHOLE_GRAPH else
                               "batch_per_execute" if per_execute else None),
            **_production_settings(cfg),
        )


def _cancel_poll_ms(text: str | None, decoupled: bool = False) -> float:
    """``cancel_poll_ms``: "auto" (or absent, or 0) is 0.0, paced by the stage times, or on a decoupled model
    ``DECOUPLED_CANCEL_POLL_MS``; else a fixed period in ms."""
    auto = DECOUPLED_CANCEL_POLL_MS if decoupled else DEFAULT_CANCEL_POLL_MS
    if text is None or text.strip().lower() in ("", "auto"):
        return auto
    ms = float(_number(text, "cancel_poll_ms"))
    return auto if ms == 0.0 else ms


def _fuse_mode(text: str | None) -> str:
    mode = (text or "auto").strip().lower()
    if mode not in ("auto", "true", "false"):
        raise ConfigError(f"fuse_stages must be auto, true or false, got {text!r}", field="parameters.fuse_stages")
    return mode


def _fuse_segments(text: str | None) -> int:
    n = int(_number(text, "fuse_segments", int) or 0)
    if n < 0:
        raise ConfigError(f"fuse_segments must be 0 (off) or a number of segments >= 1, got {text!r}",
                          field="parameters.fuse_segments")
    return n


MAX_DEVICE_PRIORITY_LEVEL = 32767  # the arbiter's protocol carries it as a signed 16-bit integer
MAX_DEVICE_LANES = 64  # far past any measured use (docs/colocation.md, "Lanes": 2 already contend on 2 cores)
NO_DEVICE_GROUP = "none"  # device_group: "none" (as absent) keeps a model off every shared device
AUTO_DEVICE_GROUP = "auto"  # device_group: "auto" joins the group of the model instance's device


def _device_settings(cfg: Any, whole_executions: str | None = None) -> dict[str, Any]:
    """``device_group`` and the parameters that only mean something with it (``device_weight``,
    ``device_priority_level``, ``device_max_queue_size``, ``device_lanes``), checked here so that a typo fails the
    load with the parameter's name. ``whole_executions``: the model runs Triton's batches whole (policy whole_graph,
    or batch_per_execute), which no arbiter can gate: it joins no group, and naming one is an error."""
    raw = (_param(cfg, "device_group", "") or "").strip()
    auto = raw.lower() == AUTO_DEVICE_GROUP  # the instance's device's group (default_device_group)
    none = not raw or raw.lower() == NO_DEVICE_GROUP  # the default: no shared device (docs/colocation.md says why)
    group = "" if (none or auto) else raw
    out: dict[str, Any] = {"device_group": group, "device_group_none": none, "device_group_auto": auto}
    # parameter: (parse, valid, what the error says it must be)
    checks = {
        "device_weight": (float, lambda v: math.isfinite(v) and v > 0,
                          "a number > 0 (the model's weight in the device's fair share, default 1)"),
        "device_priority_level": (int, lambda v: 0 <= v <= MAX_DEVICE_PRIORITY_LEVEL,
                                  f"an integer in 0..{MAX_DEVICE_PRIORITY_LEVEL} (smaller is more urgent, default 0)"),
        "device_max_queue_size": (int, lambda v: 0 <= v <= 0xFFFFFFFF,
                                  "an integer >= 0 (samples held across the group's models; 0: unbounded)"),
        "device_lanes": (int, lambda v: 1 <= v <= MAX_DEVICE_LANES,
                         f"an integer in 1..{MAX_DEVICE_LANES} (stage jobs the group's device runs at once, "
                         f"default {DEFAULT_DEVICE_LANES})"),
        "device_solo_intra_op_threads": (int, lambda v: 0 <= v <= 4096,
                                         "an integer >= 0 (threads of a whole-graph pass alone on the device; 0: "
                                         "the lane's threads)"),
    }
    for key, (parse, valid, must) in checks.items():
        text = _param(cfg, key)
        if not text:
            continue
        try:
            value = parse(text)
        except ValueError:
            value = None
        if value is None or not valid(value):
            raise ConfigError(f"{key} must be {must}, got {text!r}", field=f"parameters.{key}")
        out[key] = value
    cap = out.get("device_max_queue_size", 0)
    if 0 < cap < cfg.max_batch_size:
        raise ConfigError(f"device_max_queue_size {cap} is below max_batch_size {cfg.max_batch_size}: a full-size "
                          "request could never be admitted; raise it (or 0 for unbounded)",
                          field="parameters.device_max_queue_size")
    given = [k for k in ("device_weight", "device_priority_level", "device_max_queue_size",
                         "device_lanes", "device_solo_intra_op_threads") if k in out]
    if whole_executions and (group or auto or given):
        what = ", ".join((["device_group"] if group or auto else []) + given)
        raise ConfigError(f"{what}: a model under {whole_executions} runs Triton's batches as whole executions, which "
                          "the device group's arbiter cannot gate between stages (Triton's batcher is in front); such "
                          "a model shares the device as before, outside the group. Remove it (or use a lazybatch "
                          "policy such as eager)", field=f"parameters.{'device_group' if group or auto else given[0]}")
    if none and given:
        verb = "apply" if len(given) > 1 else "applies"
        raise ConfigError(f"{', '.join(given)} {verb} only to a model on a shared device (device_group set to a "
                          "group's name, or \"auto\": the instance's device), and this one has none; set "
                          "device_group or remove it", field=f"parameters.{given[0]}")
    return out


def lane_threads(intra_op_threads: int, lanes: int, cores: int) -> int:
    """The intra-op pool of a grouped model: its own ``intra_op_threads`` where set, else onnxruntime's default (0)
    on one lane, else the cores shared among the lanes. Why: each lane runs a job of its own at once, and pools of
    all the cores each would fight for them (served on 2 cores, two lanes helped only with one thread each:
    docs/colocation.md, "Lanes")."""
    if intra_op_threads > 0 or lanes <= 1:
        return intra_op_threads
    return max(1, cores // lanes)


def solo_threads(setting: int, lane: int, cores: int) -> int:
    """The intra-op threads of a grouped model's whole-graph passes while it is alone on the device, or 0 where they
    keep the lane's (``lane``: the model's intra_op_threads; 0, onnxruntime's default, is every core already).

    Why: onnxruntime cannot resize a pool, so a model sized for its lane would run on part of the cores the whole
    time it is alone (served: BERT alone at 110% averaged 1,585 ms on one thread against 184 ms under Triton;
    docs/colocation.md, "Width alone"). So its whole graph gets a session of its own at this width, used only while
    no other member is active, and the stages keep the lane's. That takes pools per session (a process with a
    global pool refuses sessions with their own), which costs nothing where the lane has one thread: such stages
    need no pool at all. With wider lanes the stages would wake their own pools' workers at every stage
    (sessions/threads.py), so the default stays off there; a ``setting`` above the lane's turns it on anyway."""
    if setting == 0 or lane <= 0:
        return 0
    want = setting if setting > 0 else (cores if lane == 1 else 0)
    return want if want > lane else 0


def usable_cores() -> int:
    """The cores this process may run on (its affinity: a container's cpuset), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_device_group(cfg: Any, kind: str, device_id: int, executor: str = "") -> tuple[str, str]:
    """(the default group of a model instance, why it has none where it has none). ``kind`` and ``device_id`` are
    Triton's ``model_instance_kind`` ("CPU", "GPU") and ``model_instance_device_id``. A model with several
    instances on one device keeps out: they were asked to run side by side, which one lane would serialise."""
    kind = (kind or "CPU").upper()
    on_device = 0
    for g in cfg.instance_group:
        g_kind = g.kind  # KIND_AUTO 0, KIND_GPU 1, KIND_CPU 2, KIND_MODEL 3 (model_config.proto)
        if kind == "GPU" and g_kind == 1 and (not g.gpus or device_id in g.gpus):
            on_device += max(g.count, 1)
        elif kind != "GPU" and g_kind in (0, 2, 3):
            on_device += max(g.count, 1)
    if on_device > 1:
        return "", f"{on_device} instances of the model on its device (set device_group to group them)"
    if executor == "npu":
        return "npu", ""  # the NPU the stages are timed by, not the CPU that computes their outputs
    return (f"gpu{device_id}" if kind == "GPU" else "cpu"), ""


def _production_settings(cfg: Any) -> dict[str, Any]:
    """Admission, metrics and fault-injection parameters (checked here so that a typo fails the load)."""
    from lazybatch.batcher.admission import QueuePolicy

    try:
        qp = QueuePolicy.parse(_param(cfg, "max_queue_size"), _param(cfg, "timeout_action"))
    except ConfigError as e:
        raise ConfigError(e.message, field=f"parameters.{e.field}") from None
    if 0 < qp.max_queue_size < cfg.max_batch_size:
        raise ConfigError(f"max_queue_size {qp.max_queue_size} is below max_batch_size {cfg.max_batch_size}: a full-size "
                          "request could never be admitted; raise it (or 0 for unbounded)",
                          field="parameters.max_queue_size")
    interval = _number(_param(cfg, "metrics_interval_ms"), "metrics_interval_ms")
    if interval is not None and interval < 10:
        raise ConfigError("metrics_interval_ms must be at least 10", field="parameters.metrics_interval_ms")
    release = _number(_param(cfg, "memory_release_ms"), "memory_release_ms")
    if release is not None and release < 0:
        raise ConfigError("memory_release_ms must be 0 (never) or positive", field="parameters.memory_release_ms")
    metrics = _param(cfg, "metrics")
    levels = int(_number(_param(cfg, "priority_levels"), "priority_levels", int) or 0)
    default = int(_number(_param(cfg, "default_priority_level"), "default_priority_level", int) or 0)
    if levels and not 1 <= default <= levels:
        raise ConfigError(f"default_priority_level must be in 1..priority_levels ({levels}), got {default}: the "
                          "level of requests that send no priority", field="parameters.default_priority_level")
    if default and not levels:
        raise ConfigError("default_priority_level needs priority_levels", field="parameters.priority_levels")
    return {"priority_levels": levels, "default_priority_level": default,
            "max_queue_size": qp.max_queue_size, "timeout_action": qp.timeout_action,
            "metrics": True if metrics is None else _bool(metrics, "metrics"),
            "metrics_interval_ms": 1000.0 if interval is None else float(interval),
            "memory_release_ms": 5000.0 if release is None else float(release),
            "fault_injection": _param(cfg, "fault_injection", "") or ""}


def _example_dims(cfg: Any, stage_dir: Path) -> dict[str, tuple[int, ...]]:
    """The ``example_dims`` parameter, else the stage manifest's (a repository written before the parameter)."""
    text = _param(cfg, "example_dims")
    if text:
        try:
            return parse_example_dims(text)
        except ValueError as e:
            raise ConfigError(f"example_dims: {e}", field="parameters.example_dims") from None
    try:
        entries = json.loads((stage_dir / "manifest.json").read_text()).get("graph_inputs", [])
    except (OSError, ValueError, AttributeError):
        return {}
    return {str(e["name"]): tuple(int(d) for d in e["example_dims"]) for e in entries
            if isinstance(e, dict) and "name" in e and isinstance(e.get("example_dims"), list)}


def _spec(t: Any, kind: str, example: tuple[int, ...] | None = None) -> TensorSpec:
    pb = model_config_pb2()
    dt_name = pb.DataType.Name(t.data_type)
    if dt_name not in TRITON_TO_NUMPY:
        raise ConfigError(f"{kind} {t.name!r}: data type {dt_name} is not supported by the lazybatch backend",
                          field=f"{kind}.data_type")
    dims = tuple(int(d) for d in t.dims)
    if example is not None and len(example) != len(dims):
        raise ConfigError(f"example_dims gives {kind} {t.name!r} {len(example)} sizes, its dims {list(dims)} have "
                          f"{len(dims)}", field="parameters.example_dims")
    return TensorSpec(t.name, TRITON_TO_NUMPY[dt_name], dims, example if example and -1 in dims else None)


def validate_request(tensors: Mapping[str, np.ndarray], inputs: list[TensorSpec], max_batch_size: int,
                     allow_nan: bool = True) -> tuple[int, str | None]:
    """Check one request: returns (batch size, None) or (0, what is wrong)."""
    want = {t.name: t for t in inputs}
    missing = [n for n in want if n not in tensors]
    if missing:
        return 0, f"missing input(s) {missing}; the model expects {sorted(want)}"
    extra = sorted(n for n in tensors if n not in want)
    if extra:
        return 0, f"unexpected input(s) {extra}; the model expects {sorted(want)}"
    batch = None
    for name, spec in want.items():
        a = tensors[name]
        if a.dtype != spec.dtype:
            return 0, f"input {name!r} has dtype {a.dtype}, expected {spec.dtype} ({spec.data_type})"
        if a.ndim != len(spec.dims) + 1:
            return 0, (f"input {name!r} has shape {list(a.shape)}, expected [batch, "
                       f"{', '.join(map(str, spec.dims))}]")
        for got, exp in zip(a.shape[1:], spec.dims):
            if exp >= 0 and got != exp:
                return 0, (f"input {name!r} has shape {list(a.shape)}, expected [batch, "
                           f"{', '.join(map(str, spec.dims))}]")
        b = int(a.shape[0])
        if batch is None:
            batch = b
        elif b != batch:
            return 0, f"inputs disagree on the batch size ({batch} vs {b} for {name!r})"
        if not allow_nan and a.dtype.kind == "f" and a.size and not np.isfinite(a).all():
            bad = int(a.size - np.isfinite(a).sum())
            return 0, (f"input {name!r} holds {bad} NaN/Inf value(s); this model refuses them (allow_nan: false "
                       "in its config.pbtxt)")
    if not batch or batch < 1:
        return 0, "batch size must be at least 1"
    if batch > max_batch_size:
        return 0, f"batch size {batch} exceeds the model's max_batch_size {max_batch_size}"
    return batch, None


@dataclass
class RequestOptions:
    """Per-request scheduling options from Triton request parameters."""

    sla_s: float | None = None
    deadline_unix_s: float | None = None
    priority: int = 0


def parse_request_parameters(text: str | None, default_sla_ms: float | None) -> tuple[RequestOptions, str | None]:
    """``sla_ms``, ``deadline_unix_ms`` (absolute, wall clock) and ``request_priority`` from request parameters.

    Other parameters are ignored (clients and Triton add their own). Texts are parsed once and remembered (a client
    sends the same parameters with every request, and this runs on the request's path); each call gets its own
    ``RequestOptions``.
    """
    if not text:
        return RequestOptions(sla_s=None if default_sla_ms is None else default_sla_ms / 1e3), None
    if not isinstance(text, str):
        return _parse_request_parameters(text, default_sla_ms)
    sla_s, deadline, priority, err = _parsed_parameters(text, default_sla_ms)
    return RequestOptions(sla_s, deadline, priority), err


@functools.lru_cache(maxsize=256)
def _parsed_parameters(text: str, default_sla_ms: float | None) -> tuple[float | None, float | None, int, str | None]:
    opts, err = _parse_request_parameters(text, default_sla_ms)
    return opts.sla_s, opts.deadline_unix_s, opts.priority, err


def _parse_request_parameters(text: Any, default_sla_ms: float | None) -> tuple[RequestOptions, str | None]:
    opts = RequestOptions(sla_s=None if default_sla_ms is None else default_sla_ms / 1e3)
    try:
        params = json.loads(text) if isinstance(text, str) else dict(text)
    except (ValueError, TypeError):
        return opts, f"request parameters are not valid JSON: {text!r}"
    if not isinstance(params, dict):
        return opts, f"request parameters must be a JSON object, got {text!r}"
    if "sla_ms" in params and "deadline_unix_ms" in params:
        return opts, "give either sla_ms or deadline_unix_ms, not both"
    if "sla_ms" in params:
        v = params["sla_ms"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            return opts, f"request parameter sla_ms must be a positive number, got {v!r}"
        opts.sla_s = float(v) / 1e3
    if "deadline_unix_ms" in params:
        v = params["deadline_unix_ms"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return opts, f"request parameter deadline_unix_ms must be a number (ms since the epoch), got {v!r}"
        opts.sla_s = None
        opts.deadline_unix_s = float(v) / 1e3
    key = "request_priority" if "request_priority" in params else "priority"  # "priority" is Triton-reserved
    if key in params:
        v = params[key]
        if isinstance(v, bool) or not isinstance(v, int):
            return opts, f"request parameter {key} must be an integer, got {v!r}"
        opts.priority = v
    return opts, None
