"""The CPU share on a real tritonserver (backend/cpu_share.py, docs/colocation.md), every thread's nice read from
/proc: a model with a loose SLA is lowered while one with a tight SLA has requests, and back once it has none (both under
the defaults: no ``cpu_share`` line); an idle model's onnxruntime workers parked in SCHED_IDLE beside a busy
neighbour and never alone; the
tight one unloaded and reloaded under load, then its stub killed with ``kill -9``: the loose one is put back each
time within a bound, and every request of each model gets exactly one answer. A Triton configuration (triton:0,
Triton's batcher and our whole-graph stub) in the same server is never touched.

One server for this module, ``--model-control-mode=explicit`` so that the repository API can unload and load. The
stub-kill test runs last: Triton restarts a killed stub in its own way.
"""

from __future__ import annotations

import os
import signal
import time

import onnx
import pytest
import tritonclient.grpc as grpcclient

from lazybatch.backend.cpu_share import ACTIVE_WINDOW_S, POLL_S
from lazybatch.batcher.cpu_rank import NICE_STEPS
from lazybatch.repo import add_model
from lazybatch.serving import TritonServer, free_port
from lazybatch.staging import make_mlp, split_model

from test_arbiter_faults import Sender, _gone, _until  # noqa: E402  (numbered requests, each answer counted)
from lazybatch.backend.os_weights import IDLE, read_weight, thread_nices, threads
from triton_models import stub_pid
from lazybatch.client.soak import scrape
from lazybatch.formats.prometheus import parse_samples

# name: width, depth, seed, policy, sla_ms
MODELS = {"co_small": (32, 4, 1, "eager", 100), "co_large": (512, 8, 2, "eager", 5000),
          "co_triton": (512, 8, 3, "triton:0", 5000)}
LOWERED = NICE_STEPS[1]
BACK_BOUND_S = ACTIVE_WINDOW_S + 20 * POLL_S + 3.0  # idle for the window, then one look (generous: 2 loaded cores)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    root = tmp_path_factory.mktemp("cpu_share")
    repo = root / "repo"
    graphs = {}
    for name, (width, depth, seed, policy, sla) in MODELS.items():
        model = make_mlp(root / f"{name}.onnx", in_dim=32, width=width, depth=depth, out_dim=10, seed=seed)
        relus = [i for i, n in enumerate(onnx.load(str(model)).graph.node) if n.op_type == "Relu"]
        stages = split_model(model, root / f"{name}_stages", cut_after=relus)
        add_model(model, repo, name=name, policy=policy, sla_ms=sla, max_batch_size=8, stages=stages,
                  profile_reps=1, execution_provider="cpu",
                  parameters=None)  # the defaults: the share is on for every lazybatch model on a CPU
        graphs[name] = model
    server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          log_file=root / "tritonserver.log", extra_args=["--model-control-mode=explicit",
                                                                          "--load-model=*"])
    server.start(timeout=240)
    try:
        yield server, repo, graphs
    finally:
        server.stop()  # a killed stub may make Triton's exit code non-zero: not this module's question


def _lowered(repo, model) -> bool:
    return thread_nices(stub_pid(repo, model)) == {LOWERED}


def _back(repo, model) -> bool:
    return thread_nices(stub_pid(repo, model)) == {0}


def test_the_loose_model_yields_while_the_tight_one_has_requests_and_triton_is_left_alone(shared):
    server, repo, graphs = shared
    large = Sender(server, "co_large", graphs["co_large"], 1).start()
    tri = Sender(server, "co_triton", graphs["co_triton"], 2).start()
    try:
        time.sleep(ACTIVE_WINDOW_S)
        assert _back(repo, "co_large")  # nothing more urgent active: not lowered, under load of its own
        small = Sender(server, "co_small", graphs["co_small"], 3).start()
        try:
            _until(lambda: _lowered(repo, "co_large"), 30, "co_large lowered beside the active co_small")
            assert _back(repo, "co_small") and _back(repo, "co_triton")
            _until(lambda: small.ok() >= 30 and _lowered(repo, "co_large"), 60, "co_small serves beside it")
        finally:
            small.stop()
        t0 = time.monotonic()
        _until(lambda: _back(repo, "co_large"), BACK_BOUND_S, "co_large back once co_small is idle")
        print(f"co_large back {time.monotonic() - t0:.2f} s after co_small's last answer")
        assert _back(repo, "co_triton")
    finally:
        large.stop()
        tri.stop()
    for s in (small, large, tri):
        ok, errors = s.check()
        assert ok >= 30 and not errors


def _parked(repo, model) -> int:
    """How many of the model's stub's threads are in SCHED_IDLE (its parked onnxruntime workers)."""
    pid = stub_pid(repo, model)
    return sum(1 for tid in threads(pid) if read_weight(tid, pid).policy == IDLE)


def test_an_idle_model_parks_its_pool_beside_a_busy_neighbour_and_never_alone(shared):
    """Parked pools (docs/colocation.md): a lazybatch model that holds no request while another member of the
    share is active has its onnxruntime workers in SCHED_IDLE, and only them (its scheduler and Triton's stub
    threads stay normal, so the next request is received at once); it serves from there. Beside idle members it
    never parks (parking costs the model itself, backend/pool_park.py). Triton's stub is never parked."""
    server, repo, graphs = shared
    time.sleep(ACTIVE_WINDOW_S + 2 * POLL_S)  # the module's earlier senders are idle for the window
    alone = Sender(server, "co_small", graphs["co_small"], 7).start()
    _until(lambda: alone.ok() >= 10, 60, "co_small serves alone")
    alone.stop()
    time.sleep(0.5)
    assert _parked(repo, "co_small") == 0  # its peers are idle: nothing to buy them
    large = Sender(server, "co_large", graphs["co_large"], 9).start()
    try:
        small = Sender(server, "co_small", graphs["co_small"], 8).start()
        _until(lambda: small.ok() >= 10, 60, "co_small serves beside co_large")
        small.stop()
        _until(lambda: _parked(repo, "co_small") >= 1, 10, "co_small's workers parked once it holds nothing")
        pid = stub_pid(repo, "co_small")
        assert _parked(repo, "co_small") < len(threads(pid))  # not the stub's other threads
        assert _parked(repo, "co_triton") == 0
    finally:
        large.stop()
    parks = {lab["model"]: v for lab, v in parse_samples(scrape(server.endpoints.metrics),
                                                         "lazybatch_cpu_share_parks_total")}
    assert parks["co_small"] >= 1 and "co_triton" not in parks
    for s in (alone, small, large):
        ok, errors = s.check()
        assert ok >= 10 and not errors


def test_the_tight_model_unloaded_and_reloaded_under_load(shared):
    server, repo, graphs = shared
    c = grpcclient.InferenceServerClient(server.endpoints.grpc)
    large = Sender(server, "co_large", graphs["co_large"], 4).start()
    small = Sender(server, "co_small", graphs["co_small"], 5).start()
    try:
        _until(lambda: _lowered(repo, "co_large"), 30, "co_large lowered beside co_small")
        c.unload_model("co_small")
        _until(lambda: not c.is_model_ready("co_small"), 60, "co_small unloaded")
        # its stub left the share on its way out: co_large is back without waiting for the window
        _until(lambda: _back(repo, "co_large"), 10 * POLL_S + 3.0, "co_large back once co_small is unloaded")
        c.load_model("co_small")
        assert c.is_model_ready("co_small")
        _until(lambda: _lowered(repo, "co_large"), 30, "co_large lowered again beside the reloaded co_small")
        # the reloaded model serves on (a fixed count over the whole test depended on how fast the unload went:
        # a CI run's co_small answered 10 in all)
        served = small.ok()
        _until(lambda: small.ok() >= served + 20, 60, "co_small serves on after its reload")
    finally:
        small.stop()
        large.stop()
        c.close()
    ok, errors = large.check()
    assert ok > 20 and not errors
    ok, _ = small.check(errors_ok=_gone)  # each answered once: served, or refused while unloaded
    assert ok >= 20


def test_the_tight_models_stub_killed_puts_the_loose_one_back(shared):
    server, repo, graphs = shared
    large = Sender(server, "co_large", graphs["co_large"], 6).start()
    small = Sender(server, "co_small", graphs["co_small"], 7).start()
    try:
        _until(lambda: _lowered(repo, "co_large"), 30, "co_large lowered beside co_small")
        killed = stub_pid(repo, "co_small")
        os.kill(killed, signal.SIGKILL)
        t0 = time.monotonic()
        # its process gone: ignored at the next look, without waiting for the window
        _until(lambda: _back(repo, "co_large"), 10 * POLL_S + 3.0, "co_large back after co_small's stub was killed")
        print(f"co_large back {time.monotonic() - t0:.2f} s after the kill")
        served = large.ok()
        _until(lambda: large.ok() >= served + 20, 60, "co_large serves on")
    finally:
        small.halt.set()
        large.stop()
    ok, errors = large.check()  # every request of the surviving model answered once, correctly
    assert ok > 40 and not errors
