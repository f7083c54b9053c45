"""A request's path through the backend, traced: which lazybatch modules receive or return the request (its
``Parent``, its samples' ``Request``s) on the scheduler route, on which threads, and which of them call back into a
module still waiting for them on the same thread's stack.

Why: the step loop (batcher/scheduler.py) hands answers back to its driver as values (``Step.answers``); a callback
from the core into the runtime (the ``on_response`` it replaced) would show here as a hop back. Records the request
passes through as data (``rows``, ``batcher.request``, ``batcher.interfaces``) are listed apart, and the policy's
modules (the eager policy, the paper's rule it extends, ``base.advance``) count as one, as docs/architecture.md
draws them. In-process, inline route off, the default policy; Triton's adapter (``model.py``) and the responder are
the two ends outside this runtime.
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np

from lazybatch.backend.request_parsing import RequestOptions
from lazybatch.backend.rows import Parent, Sample
from lazybatch.backend.runtime import BackendRuntime
from lazybatch.backend.stages import StageRunner
from lazybatch.batcher.policies import parse_policy
from lazybatch.batcher.request import Request
from tests.backendhelpers import relu_split_mlp

RECORDS = {"backend.rows", "batcher.request", "batcher.interfaces"}


def _room(module: str) -> str:
    name = module.removeprefix("lazybatch.")
    return "policy" if name.startswith("batcher.policies") else name


def _carries(value: object, handle: object, depth: int = 0) -> bool:
    if value is handle or isinstance(value, (Parent, Sample, Request)):
        return True
    if depth < 2 and isinstance(value, (list, tuple)) and len(value) < 32:
        return any(_carries(v, handle, depth + 1) for v in value)
    return False


def test_the_scheduler_route_hands_answers_back_as_values(tmp_path):
    _, stages = relu_split_mlp(tmp_path, depth=3)
    runner = StageRunner(stages, execution_provider="cpu")
    table = runner.profile([1, 2, 4, 8], reps=1)
    answered = threading.Event()
    handle = object()
    hops: list[tuple[str, str, str]] = []  # (thread, room, the room it was called from)
    back: set[tuple[str, str]] = set()  # (caller, callee) where the callee waits lower on the same stack

    def profile(frame, event, arg):
        if event not in ("call", "return") or not frame.f_globals.get("__name__", "").startswith("lazybatch."):
            return
        code = frame.f_code
        if event == "call":
            args = [frame.f_locals.get(v) for v in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]]
            if not any(_carries(a, handle) for a in args[1 if code.co_argcount else 0:]):
                return
        elif not _carries(arg, handle):
            return
        room = _room(frame.f_globals["__name__"])
        stack, f = [], frame.f_back
        while f is not None:
            if f.f_globals.get("__name__", "").startswith("lazybatch."):
                stack.append(_room(f.f_globals["__name__"]))
            f = f.f_back
        caller = next((r for r in stack if r not in RECORDS), "")
        hops.append((threading.current_thread().name, room, caller))
        if event == "call" and room not in RECORDS and caller and caller != room and room in stack:
            back.add((caller, room))

    threading.setprofile(profile)  # the runtime's threads start profiled
    try:
        rt = BackendRuntime(runner, table, parse_policy("eager").build(max_batch_size=8),
                            lambda h, *answer: answered.set() if h is handle else None)
    finally:
        threading.setprofile(None)
    try:
        x = np.ones((1, 16), np.float32)
        sys.setprofile(profile)
        try:
            assert rt.submit(handle, {"x": x}, 1, RequestOptions(sla_s=1.0)) is None
            assert answered.wait(10), "the request was not answered"
            time.sleep(0.05)
        finally:
            sys.setprofile(None)
    finally:
        rt.close()
    rooms = {room for _, room, _ in hops if room not in RECORDS}
    threads = {thread for thread, _, _ in hops}
    assert rooms == {"backend.runtime", "backend.inbox", "batcher.scheduler", "policy", "backend.stage_runs"}, rooms
    assert len(threads) == 2, threads  # Triton's execute thread, the scheduler thread
    # the one hop back: a policy answers through its core (Scheduler.finish); the core never calls its driver
    assert back == {("policy", "batcher.scheduler")}, back
