"""End-to-end through a real Triton server: correctness under every policy, concurrency, bad requests, cancellation.

No mocks: requests go over gRPC/HTTP to tritonserver, into the lazybatch Python backend, through the scheduler and
onnxruntime, and back.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from lazybatch.client.api import Client, InferError

from triton_models import MAX_BATCH, POLICIES, crash_at_stop

TOL = dict(rtol=1e-4, atol=1e-5)


def _x(batch: int, seed: int, dim: int = 32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, dim)).astype(np.float32)


@pytest.mark.parametrize("model", sorted(POLICIES))
def test_single_requests_match_onnxruntime(served, reference, model):
    with Client(served.grpc) as c:
        for batch in (1, 3, MAX_BATCH):
            x = _x(batch, seed=batch)
            y = c.infer(model, {"x": x}, sla_ms=1000)["y"]
            assert y.shape == (batch, 10)
            np.testing.assert_allclose(y, reference("mlp", x), **TOL)


def test_model_split_by_lazybatch_split(served, reference):
    """repo add without --stages: the project's splitter cut it; answers equal the whole graph, alone and batched."""
    manifest = json.loads((served.repo / "mlp_split" / "1" / "stages" / "manifest.json").read_text())
    assert manifest.get("created_by", "").startswith("lazybatch split") and len(manifest["stages"]) == 3

    def client(k: int) -> None:
        with Client(served.grpc) as c:
            for j in range(3):
                x = _x(1 + (k + j) % MAX_BATCH, seed=500 + 10 * k + j)
                np.testing.assert_allclose(c.infer("mlp_split", {"x": x})["y"], reference("mlp", x), **TOL)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(client, range(16)))


def test_http_protocol(served, reference):
    with Client(served.http, protocol="http") as c:
        x = _x(2, seed=7)
        np.testing.assert_allclose(c.infer("mlp_lazy", {"x": x})["y"], reference("mlp", x), **TOL)


@pytest.mark.parametrize("model", sorted(POLICIES))
def test_32_concurrent_clients_mixed_batches(served, reference, model):
    """32 clients at once, batch sizes 1..MAX_BATCH mixed: every answer is its own request's result."""
    def client(k: int) -> int:
        rng = np.random.default_rng(100 + k)
        with Client(served.grpc) as c:
            for j in range(4):
                x = _x(int(rng.integers(1, MAX_BATCH + 1)), seed=1000 * k + j)
                y = c.infer(model, {"x": x}, sla_ms=float(rng.choice([50, 200, 2000])))["y"]
                np.testing.assert_allclose(y, reference("mlp", x), **TOL)
        return 4

    with ThreadPoolExecutor(32) as pool:
        assert sum(pool.map(client, range(32))) == 128


@pytest.mark.parametrize("model", ["mlp_eager", "mlp_lazy", "mlp_oracle", "mlp_graph"])
def test_scheduler_batches_concurrent_requests(served, model):
    """Under concurrency the backend's scheduler really forms sub-batches of more than one sample, and answers
    every request it accepted exactly once (its own counters)."""
    before = served.stats(model)

    def client(k: int) -> None:
        with Client(served.grpc) as c:
            for j in range(3):
                c.infer(model, {"x": _x(1, seed=k * 10 + j)}, sla_ms=1000)

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(client, range(32)))
    after = served.stats(model)
    assert after["requests"] - before["requests"] == 96
    assert after["answered"].get("OK", 0) - before["answered"].get("OK", 0) == 96
    hist = {int(b): n - before["batch_hist"].get(b, 0) for b, n in after["batch_hist"].items()}
    assert max(b for b, n in hist.items() if n > 0) > 1, hist
    assert sum(after["answered"].values()) == after["requests"]


def test_eager_runs_idle_groups_inline_and_mixes_answers_with_errors(served, reference):
    """eager's inline path (backend/inline.py, InlineRoute.run) on the real server: Triton's dynamic batcher hands execute
    groups; a group that finds the scheduler idle runs in execute and is answered with its end, while a bad request
    of the same group already got its error through the response sender (None in execute's list). Every request
    gets exactly one answer: its own result, or the error that says what was wrong."""
    model = "mlp_eager"
    cfg = (served.repo / model / "config.pbtxt").read_text()
    assert "dynamic_batching" in cfg, "repo add writes eager models with Triton's batcher in front (no delay)"
    before = served.stats(model)
    bad_seen = []

    def client(k: int) -> None:
        with Client(served.grpc) as c:
            for j in range(4):
                x = _x(1 + (k + j) % 3, seed=3000 + 10 * k + j)
                if (k + j) % 5 == 0:
                    x[0, 0] = np.nan
                    with pytest.raises(InferError, match="NaN"):
                        c.infer(model, {"x": x})
                    bad_seen.append(k)
                else:
                    np.testing.assert_allclose(c.infer(model, {"x": x})["y"], reference("mlp", x), **TOL)

    with ThreadPoolExecutor(24) as pool:
        list(pool.map(client, range(24)))
    after = served.stats(model)
    assert after["inline_runs"] > before.get("inline_runs", 0), after
    good = 96 - len(bad_seen)
    assert after["answered"].get("OK", 0) - before["answered"].get("OK", 0) == good
    with Client(served.grpc) as c:  # and the server goes on
        x = _x(2, seed=1)
        np.testing.assert_allclose(c.infer(model, {"x": x})["y"], reference("mlp", x), **TOL)


BAD = {
    "wrong dtype": ({"x": np.zeros((2, 32), np.float64)}, "data-type"),
    "wrong shape": ({"x": np.zeros((2, 31), np.float32)}, "shape"),
    "missing input": ({}, "input"),
    "unexpected input": ({"x": np.zeros((1, 32), np.float32), "z": np.zeros((1, 32), np.float32)}, "z"),
    "batch above max": ({"x": np.zeros((MAX_BATCH + 1, 32), np.float32)}, "batch"),
    "NaN": ({"x": np.full((2, 32), np.nan, np.float32)}, "NaN"),
}


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("model", ["mlp_eager", "mlp_lazy", "mlp_triton2000"])
def test_bad_request_gets_clear_error(served, model, case):
    inputs, needle = BAD[case]
    c = grpcclient.InferenceServerClient(served.grpc)
    if inputs:
        tensors = []
        for name, arr in inputs.items():
            t = grpcclient.InferInput(name, list(arr.shape), "FP64" if arr.dtype == np.float64 else "FP32")
            t.set_data_from_numpy(arr)
            tensors.append(t)
    else:
        tensors = []
    with pytest.raises(Exception) as info:
        c.infer(model, tensors)
    assert needle.lower() in str(info.value).lower(), str(info.value)


def test_bad_sla_parameter(served):
    with Client(served.grpc) as c:
        with pytest.raises(InferError, match="sla_ms must be a positive number"):
            c.infer("mlp_lazy", {"x": _x(1, 0)}, sla_ms=-5)
        with pytest.raises(InferError, match="deadline passed"):
            c.infer("mlp_lazy", {"x": _x(1, 0)}, deadline_unix_ms=time.time() * 1e3 - 1000)
        y = c.infer("mlp_lazy", {"x": _x(1, 0)}, deadline_unix_ms=time.time() * 1e3 + 5000)["y"]
        assert y.shape == (1, 10)


def test_cancelled_while_queued_is_answered_cancelled(served, reference):
    """Requests waiting in a 300 ms batching window are cancelled by their clients: the backend notices at the next
    poll, answers them CANCELLED and runs only the one left."""
    model = "mlp_graph300"
    before = served.stats(model)
    c = grpcclient.InferenceServerClient(served.grpc)
    got: dict[int, tuple] = {}
    done = threading.Semaphore(0)

    def cb(i):
        def f(result, error):
            got[i] = (result, error)
            done.release()
        return f

    xs = [_x(1, seed=s) for s in range(3)]
    ctx = []
    for i, x in enumerate(xs):
        t = grpcclient.InferInput("x", [1, 32], "FP32")
        t.set_data_from_numpy(x)
        ctx.append(c.async_infer(model, [t], cb(i)))
    time.sleep(0.05)
    ctx[0].cancel()
    ctx[2].cancel()
    for _ in range(3):
        assert done.acquire(timeout=30)
    assert got[1][1] is None
    np.testing.assert_allclose(got[1][0].as_numpy("y"), reference("mlp", xs[1]), **TOL)
    assert got[0][1] is not None and got[2][1] is not None
    after = served.stats(model)
    assert after["answered"].get("CANCELLED", 0) - before["answered"].get("CANCELLED", 0) == 2
    assert after["answered"].get("OK", 0) - before["answered"].get("OK", 0) == 1
    n_stages = len(json.loads((served.repo / model / "1" / "stages" / "manifest.json").read_text())["stages"])
    assert after["stage_runs"] - before.get("stage_runs", 0) == n_stages  # the cancelled ones ran no stage


def test_the_fixture_forgives_only_a_crash_after_sigint(tmp_path):
    """conftest.py's teardown lets pass a crash at the stop (an open defect, triton_models.crash_at_stop), never
    a crash while serving, a hang killed or another exit code."""
    log = tmp_path / "tritonserver.log"
    log.write_text("I started\nSignal (2) received.\nI unloading\n"
                   "tcache_thread_shutdown(): unaligned tcache chunk detected\nSignal (6) received.\n")
    assert "tcache" in crash_at_stop(-6, log)
    assert crash_at_stop(0, log) is None and crash_at_stop(-9, log) is None and crash_at_stop(1, log) is None
    log.write_text("I started\nSignal (11) received.\nSignal (2) received.\n")  # crashed while serving
    assert crash_at_stop(-11, log) is None
    log.write_text("I started\n")
    assert crash_at_stop(-11, log) is None
