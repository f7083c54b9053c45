"""A request's path through the backend, traced: which lazybatch modules receive or return the request (its
``Parent``, its samples' ``Request``s, on the inline route its tensors), on which threads, and which of them call
back into a module still waiting for them on the same thread's stack.

Why: a newcomer follows one request through few modules, each called once from the one before, none called back
(docs/architecture.md draws both routes). The goal: at most 6 modules with Triton's adapter (``model.py``, outside
this in-process runtime) once at its two ends, at most 3 threads (execute, scheduler, responder), and no callback
into a caller; the inline route at most 3 modules on 1 thread. The core hands answers back to its driver as values
(``Step.answers``) and a policy leaves what it answered in ``Policy.finished``; a callback (the core's former
``on_response`` into the runtime, a policy's ``Scheduler.finish``) would show here as a hop back, as would an inbox
calling the runtime to admit arrivals. Records the request passes through as data (``rows``, ``batcher.request``,
``batcher.interfaces``) are listed apart, and the policy's modules (the eager policy, the paper's rule it extends,
``base.advance``) count as one. Default policy; the response thread on, as config ``response_thread`` is by default.
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np

from lazybatch.backend.fusion import fuse
from lazybatch.backend.request_parsing import RequestOptions
from lazybatch.backend.responder import ResponseThread
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


def _args(frame) -> list:
    """The arguments a call was made with (``self`` first, where it has one)."""
    code = frame.f_code
    return [frame.f_locals.get(v) for v in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]]


def _carries(value: object, handle: object, depth: int = 0) -> bool:
    if value is handle or isinstance(value, (Parent, Sample, Request)):
        return True
    if depth < 2 and isinstance(value, (list, tuple)) and len(value) < 32:
        return any(_carries(v, handle, depth + 1) for v in value)
    return False


def test_the_scheduler_route_crosses_five_modules_on_three_threads_and_never_calls_back(tmp_path):
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
        if event == "call":
            if not any(_carries(a, handle) for a in _args(frame)[1 if frame.f_code.co_argcount else 0:]):
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
        responder = ResponseThread(lambda h, *answer: answered.set() if h is handle else None)  # as model.py
        rt = BackendRuntime(runner, table, parse_policy("eager").build(max_batch_size=8), responder)
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
        responder.close()
    rooms = {room for _, room, _ in hops if room not in RECORDS}
    threads = {thread for thread, _, _ in hops}
    # with Triton's adapter at its two ends: 6 modules
    assert rooms == {"backend.runtime", "batcher.scheduler", "policy", "backend.stage_runs", "backend.responder"}, \
        rooms
    assert len(threads) == 3, threads  # Triton's execute thread, the scheduler thread, the response thread
    assert back == set(), back


def test_the_inline_route_crosses_two_modules_on_executes_thread(tmp_path):
    """A lone request that finds the scheduler idle runs as one whole-graph pass in ``execute``
    (``InlineRoute.run_one``) and is answered from it: the route and the session it runs, on one thread."""
    model, stages = relu_split_mlp(tmp_path, depth=3)
    runner = StageRunner(stages, execution_provider="cpu")
    table = runner.profile([1, 2, 4, 8], reps=1)
    whole = fuse(runner, table, model, execution_provider="cpu", intra_op_threads=0, name="t")
    assert whole is not None
    rt = BackendRuntime(runner, table, parse_policy("eager").build(max_batch_size=8), lambda *answer: None,
                        whole_runner=whole[0], inline=True)
    x = np.ones((1, 16), np.float32)
    tensors = {"x": x}
    seen: list[tuple[str, str, str, object]] = []  # (event, room, thread, what a return gave)

    def profile(frame, event, arg):
        if event not in ("call", "return") or not frame.f_globals.get("__name__", "").startswith("lazybatch."):
            return
        if event == "call" and not any(a is tensors or a is x for a in _args(frame)):
            return
        seen.append((event, _room(frame.f_globals["__name__"]), threading.current_thread().name, arg))

    try:
        assert rt.route.run_one(tensors, 1, RequestOptions()) is not None  # the first pass warms the session
        time.sleep(0.2)  # the scheduler thread's look-in after it
        threading.setprofile(profile)
        sys.setprofile(profile)
        try:
            out = rt.route.run_one(tensors, 1, RequestOptions(sla_s=1.0))
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
    finally:
        rt.close()
    assert out is not None

    def gives(value: object, depth: int = 0) -> bool:  # the answer's dict or one of its arrays
        if value is out or any(value is a for a in out.values()):
            return True
        if depth < 2 and isinstance(value, (list, tuple, dict)) and len(value) < 32:
            return any(gives(v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
        return False

    path = [(room, thread) for event, room, thread, arg in seen if event == "call" or gives(arg)]
    # with Triton's adapter at its two ends: 3 modules
    assert {room for room, _ in path} == {"backend.inline", "backend.stages"}, path
    assert {thread for _, thread in path} == {threading.current_thread().name}, path
