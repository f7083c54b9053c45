"""What a model's stub process sets for itself, once, at load: a Triton Python-backend stub is a process of its own
per model instance, so these process-wide settings are the model's own; outside Triton (``pb_utils`` None: tests,
embedding) the process is someone else's and nothing is set."""

from __future__ import annotations

from typing import Any

from .settings import BackendSettings


def freeze_loaded_heap(pb_utils: Any) -> None:
    """Inside Triton, a scheduled model's stub keeps what it loaded (graphs, tables, sessions' Python side) for
    good: moved out of the garbage collector's generations (``gc.freeze``), a full collection scans what came after
    only. Why: the scheduler's threads keep objects between requests, so the stub collects now and then where
    Triton's batcher never does, and a full collection over the loaded heap paused a 1 ms model for about 25 ms
    (in-process, ad hoc: tiny, 20,000 requests), a queue of 25 requests at 90% load; served, the standing guard saw
    no change beyond its spread (docs/results/default_guard.md). Garbage from the load is collected first, so that
    none of it is kept."""
    if pb_utils is None:
        return
    import gc

    gc.collect()
    gc.freeze()


def process_wide_onnxruntime(s: BackendSettings, pb_utils: Any) -> None:
    """Inside Triton a model instance is a stub process of its own: one thread pool and one CPU arena for all its
    sessions (sessions/threads.py, sessions/arena.py). Outside it (in-process tests, embedding) the process is
    someone else's, and the switch would refuse their sessions."""
    if pb_utils is None:
        return
    if not s.use_per_session_threads:
        from lazybatch.sessions.threads import use_global_thread_pool

        use_global_thread_pool(s.intra_op_threads)
    if s.use_env_allocators:
        from lazybatch.sessions.arena import use_shared_arena

        use_shared_arena()
