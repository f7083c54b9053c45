"""onnxruntime intra-op thread pools for a split model: one pool per session, or one per process for all of them.

Why: a split model is one session per stage, run one after another. With a pool per session (onnxruntime's
default), every stage has worker threads of its own; they must not spin (18 idle pools busy-waiting on 2 cores made
ResNet-50 8x slower), so each stage run starts by waking workers that fell asleep while the other stages ran. The
whole graph has one pool whose workers stay warm from one operator to the next. onnxruntime can give every session
of a process the same pool (an environment with global thread pools and sessions with ``use_per_session_threads =
False``; Triton's onnxruntime backend calls this ``enable_global_threadpool``): the chained stages then use their
threads as the whole graph does. docs/onnx.md has the measurements (ResNet-50, 18 stages, batch 1).

The catch is that the choice is the whole process's: once onnxruntime has global pools, it refuses every session
that asks for its own pool, and a session created with default options asks for its own. So only a process that
lazybatch owns switches (``use_global_thread_pool``): a Triton model instance (one process each), the benchmark
scripts, and CLI commands when told to. Library code (StageChain, the profiler, the tests' in-process runs) follows
whatever the process chose, and defaults to per-session pools, so that importing lazybatch never breaks a user's
own sessions. The global pool's workers spin between operators, as onnxruntime's default does (its Python API
cannot turn that off); with one pool that costs what it costs the whole graph.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

_lock = threading.Lock()
_global_threads: int | None = None  # intra-op size of this process's global pool (0: onnxruntime's default)


def global_thread_pool() -> int | None:
    """The intra-op size of this process's global pool (0: onnxruntime's default), or None while it has none."""
    return _global_threads


def use_global_thread_pool(threads: int = 0) -> None:
    """Make every onnxruntime session this process creates from now on share one intra-op pool of ``threads``.

    Call it early from a process lazybatch owns; sessions created afterwards by other code with default options are
    refused by onnxruntime (``use_per_session_threads must be false``). A second call with another size keeps the
    first pool (onnxruntime cannot resize it) and warns.
    """
    global _global_threads
    threads = max(0, int(threads))
    with _lock:
        if _global_threads is None:
            from onnxruntime.capi import _pybind_state as C

            C.set_global_thread_pool_sizes(threads, 1)
            _global_threads = threads
            return
        if _global_threads == threads:
            return
    warnings.warn(f"this process's onnxruntime thread pool has {_global_threads or 'the default number of'} threads "
                  f"and cannot be resized to {threads or 'the default'}; sessions keep using it", RuntimeWarning,
                  stacklevel=2)


def session_options(threads: int = 0, *, spinning: bool = False, log_severity_level: int = 3) -> Any:
    """SessionOptions for one session of a split model: the process's global pool where it has one, otherwise a
    pool of ``threads`` of the session's own, spinning off unless ``spinning``; the process's shared CPU arena where
    it has one (arena.py)."""
    import onnxruntime as ort

    from .arena import apply

    so = apply(ort.SessionOptions())  # the process's shared CPU arena where it has one (arena.py)
    so.log_severity_level = log_severity_level
    if _global_threads is not None:
        so.use_per_session_threads = False
        return so
    if threads > 0:
        so.intra_op_num_threads = threads
    if not spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so
