"""The model's ``config.pbtxt``: parsed with the protobuf classes tritonclient ships, never by hand, into
``BackendSettings``: what the backend needs from it (Triton-style parameter names, see docs/triton.md; the table of
parameters and their defaults is ``parameters.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lazybatch.batcher.errors import ConfigError
from lazybatch.formats.dtypes import TRITON_TO_NUMPY
from lazybatch.formats.example_dims import parse_example_dims
from lazybatch.formats.stage_manifest import TensorSpec, load_manifest

from .config_pbtxt import model_config_pb2
from .parameters import (AUTO_DEVICE_GROUP, DECOUPLED_CANCEL_POLL_MS, DEFAULT_CANCEL_POLL_MS, DEFAULT_DEVICE_LANES,
                         DEFAULT_POLICY, MAX_DEVICE_LANES, MAX_DEVICE_PRIORITY_LEVEL, NO_DEVICE_GROUP, PARAMETERS,
                         WHOLE_GRAPH, default_value)


def _param(cfg: Any, key: str, default: str | None = None) -> str | None:
    """The parameter's text, else ``default``, else the schema's default (``parameters.py``)."""
    if key in cfg.parameters:
        return cfg.parameters[key].string_value.strip()
    return default if default is not None else default_value(key)


def _given(cfg: Any, key: str) -> str | None:
    """The parameter's text where config.pbtxt sets it (None: absent), for checks of what a user wrote."""
    return cfg.parameters[key].string_value.strip() if key in cfg.parameters else None


def _bool(text: str | None, key: str) -> bool:
    if text is None:
        return False
    t = text.lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{key} must be true or false, got {text!r}", field=f"parameters.{key}")


def _unset_or_bool(text: str | None, key: str) -> bool | None:
    return None if text is None else _bool(text, key)


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
    use_per_session_threads: bool | None = None  # None: unset (backend/arbiter/sizing.py chooses)
    use_env_allocators: bool = True
    inplace_residuals: bool = True
    device_tensors: str = "auto"  # stage tensors on the provider's device between stages (sessions/device_tensors.py)
    cuda_graphs: bool = False  # a CUDA graph per (stage, batch bucket) on the device path (sessions/cuda_graphs.py)
    shared_cuda_stream: bool = False  # every stage session on one CUDA stream, no sync per run (sessions/cuda_stream.py)
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
    cpu_share: str = "auto"  # the CPU share's role (batcher/cpu_rank.py), or "none": off (backend/cpu_share.py)
    cpu_share_nice: int = 10  # the nice its threads take under one more urgent active model (cpu_rank.nice_steps)
    cpu_share_park: bool = True  # cpu_share models: onnxruntime's workers parked in SCHED_IDLE while idle (pool_park)
    cpu_share_split: bool = True  # cpu_share models: the cores split by rank while ranks meet (cpu_rank.cores_for)
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
        policy = (_param(cfg, "policy") or DEFAULT_POLICY).lower()
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
            allow_nan=_bool(_param(cfg, "allow_nan"), "allow_nan"),
            execution_provider=_param(cfg, "execution_provider") or "auto",
            intra_op_threads=int(_number(_param(cfg, "intra_op_threads"), "intra_op_threads", int) or 0),
            cancel_poll_ms=_cancel_poll_ms(_param(cfg, "cancel_poll_ms"), decoupled),
            use_per_session_threads=_unset_or_bool(_param(cfg, "use_per_session_threads"), "use_per_session_threads"),
            use_env_allocators=_bool(_param(cfg, "use_env_allocators"), "use_env_allocators"),
            inplace_residuals=_bool(_param(cfg, "inplace_residuals"), "inplace_residuals"),
            device_tensors=_choice(_param(cfg, "device_tensors"), "device_tensors", ("auto", "true", "false")),
            cuda_graphs=_bool(_param(cfg, "cuda_graphs"), "cuda_graphs"),
            shared_cuda_stream=_bool(_param(cfg, "shared_cuda_stream"), "shared_cuda_stream"),
            fuse_stages=_choice(_param(cfg, "fuse_stages"), "fuse_stages", ("auto", "true", "false")),
            fuse_segments=_fuse_segments(_param(cfg, "fuse_segments")),
            response_thread=_bool(_param(cfg, "response_thread"), "response_thread"),
            batch_per_execute=per_execute,
            decoupled=decoupled,
            stream_interval_tokens=int(interval or 1),
            **_device_settings(cfg, WHOLE_GRAPH if policy == WHOLE_GRAPH else
                               "batch_per_execute" if per_execute else None),
            cpu_share=_cpu_share(_param(cfg, "cpu_share")),
            cpu_share_nice=_cpu_share_nice(_param(cfg, "cpu_share_nice")),
            cpu_share_park=_bool(_param(cfg, "cpu_share_park"), "cpu_share_park"),
            cpu_share_split=_bool(_param(cfg, "cpu_share_split"), "cpu_share_split"),
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


def _cpu_share(text: str | None) -> str:
    from lazybatch.batcher.cpu_rank import ROLES

    role = (text or "auto").strip().lower()
    if role not in (*ROLES, "none"):
        raise ConfigError(f"cpu_share must be none, {', '.join(ROLES)}, got {text!r}", field="parameters.cpu_share")
    return role


def _cpu_share_nice(text: str | None) -> int:
    try:
        value = int((text or "").strip() or default_value("cpu_share_nice") or "")
    except ValueError:
        value = 0
    if not 1 <= value <= 19:
        raise ConfigError(f"cpu_share_nice must be an integer 1..19 (the nice value under one more urgent model), "
                          f"got {text!r}", field="parameters.cpu_share_nice")
    return value


def _choice(text: str | None, name: str, choices: tuple[str, ...]) -> str:
    value = (text or choices[0]).strip().lower()
    if value not in choices:
        raise ConfigError(f"{name} must be {', '.join(choices[:-1])} or {choices[-1]}, got {text!r}",
                          field=f"parameters.{name}")
    return value


def _fuse_segments(text: str | None) -> int:
    n = int(_number(text, "fuse_segments", int) or 0)
    if n < 0:
        raise ConfigError(f"fuse_segments must be 0 (off) or a number of segments >= 1, got {text!r}",
                          field="parameters.fuse_segments")
    return n


def _device_settings(cfg: Any, whole_executions: str | None = None) -> dict[str, Any]:
    """``device_group`` and the parameters that only mean something with it (``device_weight``,
    ``device_priority_level``, ``device_max_queue_size``, ``device_lanes``), checked here so that a typo fails the
    load with the parameter's name. ``whole_executions``: the model runs Triton's batches whole (policy whole_graph,
    or batch_per_execute), which no arbiter can gate: it joins no group, and naming one is an error."""
    raw = (_param(cfg, "device_group") or "").strip()
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
        text = _given(cfg, key)
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
            "fault_injection": _param(cfg, "fault_injection") or ""}


def _example_dims(cfg: Any, stage_dir: Path) -> dict[str, tuple[int, ...]]:
    """The ``example_dims`` parameter, else the stage manifest's (a repository written before the parameter)."""
    text = _param(cfg, "example_dims")
    if text:
        try:
            return parse_example_dims(text)
        except ValueError as e:
            raise ConfigError(f"example_dims: {e}", field="parameters.example_dims") from None
    try:
        inputs = load_manifest(stage_dir).inputs
    except (ConfigError, OSError, ValueError):
        return {}  # no stage directory (a whole-graph model of its own): no sizes to read
    return {t.name: t.example for t in inputs if t.example is not None}


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
