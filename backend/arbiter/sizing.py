"""How many onnxruntime threads a co-located model gets, and which device group a model instance joins by default:
the device group's sizing, beside the arbiter that shares the device.
"""

from __future__ import annotations

import os
import sys
from typing import Any, NamedTuple


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


class DevicePlan(NamedTuple):
    """Where a model instance runs and how wide: its device group ("": none), and the thread settings that follow."""

    group: str
    intra_op_threads: int
    solo_threads: int  # its whole graph's threads alone on the device (0: the lane's)
    per_session_threads: bool  # pools per session (a wider whole graph beside the stages' pools)


def per_session_threads(settings: Any, instance_kind: str, executor: str) -> bool:
    """Pools per session (spinning off) or one per process (spinning): ``use_per_session_threads`` where set, one
    per process otherwise, members of the CPU share included.

    Why (docs/colocation.md, "Parked pools"): the process pool keeps a split model's workers warm from stage to
    stage, which pools per session cannot (a model alone pays a wake-up at every stage). Its workers spin after the
    last operator, which beside a busy neighbour takes that neighbour's cores; a share member parks them in
    SCHED_IDLE while it holds nothing (backend/pool_park.py). Served on the quickstart's pair
    (docs/results/cpu_share_levers.md), both beat Triton together, and only the parked process pool was level with
    Triton alone."""
    s = settings
    return bool(s.use_per_session_threads)


def plan_device(settings: Any, cfg: Any, instance_kind: str, device_id: int, executor: str) -> DevicePlan:
    """The device group this instance joins (the config's ``device_group``, or its device's with ``auto``; said
    why where none), and the onnxruntime threads its lanes size: several lanes share the cores among them."""
    s = settings
    plain = DevicePlan("", s.intra_op_threads, 0, per_session_threads(s, instance_kind, executor))
    if s.whole_graph:
        return plain
    group = s.device_group
    if not group:
        if not s.device_group_auto or s.batch_per_execute:  # batch_per_execute: Triton's batcher runs executions
            return plain
        group, why = default_device_group(cfg, instance_kind, device_id, executor)
        if why:
            print(f"lazybatch: {s.name}: device_group auto: on no shared device ({why})", file=sys.stderr)
        if not group:
            return plain
    cores = usable_cores()
    threads = lane_threads(s.intra_op_threads, s.device_lanes, cores)
    if threads != s.intra_op_threads:
        print(f"lazybatch: {s.name}: intra_op_threads {threads} (device group {group!r} runs {s.device_lanes} "
              f"lanes on {cores} cores; set intra_op_threads to choose)", file=sys.stderr)
    solo = solo_threads(s.device_solo_intra_op_threads, threads, cores)
    # the whole graph's own pool beside the stages': pools per session
    return DevicePlan(group, threads, solo, bool(s.use_per_session_threads) or bool(solo))
