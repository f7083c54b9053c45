"""One onnxruntime CPU arena for every session of a process, instead of one arena per session.

Why: a split model is one session per stage, and onnxruntime gives each session its own CPU arena, which grows to
the largest run's working set of that stage and keeps it. The whole graph needs one working set at a time; a split
model run stage by stage keeps up to one per stage (20 for MobileNet), plus the whole graph's. One arena shared by
every session holds one working set at a time, as the whole graph does (figures: docs/onnx.md, "One arena per
process"; ``git show 555b6b3:benchmarks/probes/probe_shared_arena.py``, a retired probe). onnxruntime's own mechanism is an allocator registered in its
environment (``create_and_register_allocator``), used by the sessions whose options say
``session.use_env_allocators = 1``.

Unlike the global thread pool (threads.py), registering it changes nothing for sessions that do not ask for it, so
the switch is harmless to a user's own sessions; it is still the process's, so a Triton model instance (one stub
process each) turns it on (backend/model.py, parameter ``use_env_allocators``) and library code follows.
The shared arena is a BFC arena like each session's: the run option ``memory.enable_memory_arena_shrinkage``
(backend/memory.py) shrinks it as before. CUDA arenas stay per session.
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_shared = False  # whether this process registered the shared CPU arena


def shared_arena() -> bool:
    """Whether sessions made from now on (through ``threads.session_options``) use the process's shared arena."""
    return _shared


def use_shared_arena() -> None:
    """Register one CPU arena in onnxruntime's environment for every split-model session this process makes from now
    on. Idempotent."""
    global _shared
    with _lock:
        if _shared:
            return
        import onnxruntime as ort

        info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
        ort.create_and_register_allocator(info, ort.OrtArenaCfg({}))  # onnxruntime's default arena settings
        _shared = True


def apply(so: Any) -> Any:
    """Make a session's options use the shared arena where this process has one."""
    if _shared:
        so.add_session_config_entry("session.use_env_allocators", "1")
        # the weights are allocated once for the session's life: straight from the device allocator, so that they
        # do not grow the shared arena in its power-of-two steps (onnxruntime's advice for shared arenas)
        so.add_session_config_entry("session.use_device_allocator_for_initializers", "1")
    return so
