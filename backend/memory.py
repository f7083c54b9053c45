"""Giving memory back after a burst.

Why: a burst makes a model instance run its largest batches, and two pools keep what that took. onnxruntime's CPU
arena (one per session: a split model has one per stage) grows to the largest run's working set and never shrinks
unless a run asks it to (the run option ``memory.enable_memory_arena_shrinkage``); glibc's malloc keeps freed heap
pages of every thread's arena (numpy's activations between stages) until ``malloc_trim``. Measured on the burst
test's model (benchmarks/bench_memory.py, docs/operations.md): the stub went from 158 to 319 MiB through a 30 s burst
at 5x capacity and stayed there. Turning the arena off instead cost 15-22% of a run on that model (every run maps
and faults its activations afresh), so the arena stays and is shrunk when the instance goes idle, at most every
``memory_release_ms``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from typing import Any, Sequence

_libc_lock = threading.Lock()
_libc: ctypes.CDLL | None | bool = None  # False: no malloc_trim here (not glibc)


def malloc_trim() -> bool:
    """Return glibc's free heap pages (every malloc arena) to the system; False where there is no malloc_trim."""
    global _libc
    with _libc_lock:
        if _libc is None:
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                lib.malloc_trim.argtypes = [ctypes.c_size_t]
                lib.malloc_trim.restype = ctypes.c_int
                _libc = lib
            except (OSError, AttributeError):
                _libc = False
        lib = _libc
    if lib is False:
        return False
    lib.malloc_trim(0)  # type: ignore[union-attr]
    return True


def release_arenas(runners: Sequence[Any]) -> None:
    """The runners' sessions shrink their arenas at their next runs (an executor wrapper, npu, may have none)."""
    for runner in runners:
        release = getattr(runner, "release_arenas", None)
        if release is not None:
            release()


def trim_heap(stats: Any) -> bool:
    """``malloc_trim``, counted in ``stats`` (RuntimeStats: memory_releases, memory_release_s); False where there is
    no malloc_trim."""
    t0 = time.perf_counter()
    if not malloc_trim():
        return False
    stats.memory_releases += 1
    stats.memory_release_s += time.perf_counter() - t0
    return True


def arena_shrinkage_option(providers: Sequence[str]) -> str:
    """The value of onnxruntime's ``memory.enable_memory_arena_shrinkage`` run option for these providers."""
    devices = ["cpu:0"]
    if "CUDAExecutionProvider" in providers:
        devices.append("gpu:0")
    return ";".join(devices)


def shrinking_run_options(providers: Sequence[str]):  # -> onnxruntime.RunOptions
    """RunOptions that make a session's arenas free what the run did not use, at the end of the run."""
    import onnxruntime as ort

    ro = ort.RunOptions()
    ro.add_run_config_entry("memory.enable_memory_arena_shrinkage", arena_shrinkage_option(providers))
    return ro
