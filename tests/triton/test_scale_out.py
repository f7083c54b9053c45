"""Scale-out on real processes: two tritonserver replicas behind nginx (lazybatch.scale_out), gRPC load through the
balancer from several threads, one replica drained mid-load.

What is shown, per test, from three independent records: the client's (every request sent, its answer checked
against onnxruntime on the whole graph, each retry counted), nginx's access log (which replica answered each
request) and each replica's own inference statistics (Triton's statistics extension while it serves; its metrics
endpoint, which stays up while it drains, for the replica being drained):

- ``test_drain_takes_the_replica_out_of_the_balancer_first``: the recipe's drain (`ScaleOut.drain`, i.e.
  `lazybatch scale-out --drain`): nginx marks the replica ``down`` and reloads, then Triton gets SIGTERM. No client
  sees an error, no retry.
- ``test_sigterm_alone_needs_client_retries``: only the SIGTERM. Triton finishes what it had taken but refuses
  what reaches it meanwhile (NOT_FOUND while its models unload, CANCELLED as its gRPC endpoint stops), and nginx
  cannot retry those: a gRPC error is an HTTP 200 with a grpc-status, while ``grpc_next_upstream`` acts on
  connection errors and HTTP statuses (it does skip the replica, unseen, once its port is closed). The client
  retries refused requests (counted, as often as needed: once is not enough, round robin may send the retry to
  the same draining replica); none is lost.

In both: every request sent got exactly one correct answer, both replicas served, the other replica's count keeps
rising after the drain, and the replicas' own counts add up to what the client got (nothing ran twice).
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

from benchmarks.harness.meta import git_commit
from lazybatch.batcher.errors import ConfigError
from lazybatch.repo import add_model
from lazybatch.nginx import find_nginx
from lazybatch.scale_out import ScaleOut
from lazybatch.staging import make_mlp, split_model

MODEL = "mlp_lazy"
IN_DIM = 32
THREADS = 6
# what a draining replica answers a request it did not take (safe to send again: it never ran): NOT_FOUND while
# its models unload, CANCELLED as its gRPC endpoint stops. Not UNAVAILABLE: lazybatch's answer to a request it
# held when its model was unloaded, which a graceful drain must never produce.
RETRYABLE = {"StatusCode.NOT_FOUND", "StatusCode.CANCELLED"}
# ... and UNAVAILABLE from Triton's own scheduler once the server is stopping (it refuses the request before handing
# it to the model: seen once in a suite run under a busy core, a request that reached the replica in that moment).
# Told apart from lazybatch's UNAVAILABLE by its message.
TRITON_STOPPING = "stopped accepting new inference requests"
# ... and nginx's 502 (UNAVAILABLE with this message): nginx had passed the request on a kept-alive connection to the
# draining replica as its gRPC endpoint closed, and gRPC is a POST, which nginx never passes to the next replica once
# sent (seen once in a CI run). The endpoint's CANCELLED through the balancer; never an answer lazybatch gave.
NGINX_BAD_GATEWAY = "Received http2 header with status: 502"


def retryable(code: str, message: str) -> bool:
    return code in RETRYABLE or (code == "StatusCode.UNAVAILABLE" and (TRITON_STOPPING in message
                                                                       or NGINX_BAD_GATEWAY in message))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Callable[[np.ndarray], np.ndarray]]:
    """A small lazybatch model (the real-server tests' MLP, cut after every Relu, policy lazy) and its reference."""
    import onnx
    import onnxruntime as ort

    root = tmp_path_factory.mktemp("scale_out")
    mlp = make_mlp(root / "mlp.onnx", in_dim=IN_DIM, width=128, depth=6, out_dim=10, seed=1)
    relus = [i for i, n in enumerate(onnx.load(str(mlp)).graph.node) if n.op_type == "Relu"]
    stages = split_model(mlp, root / "mlp_stages", cut_after=relus)
    repo = root / "model_repository"
    add_model(mlp, repo, name=MODEL, policy="lazy", sla_ms=500, max_batch_size=8, stages=stages, profile_reps=2,
              execution_provider="cpu", intra_op_threads=1)
    sess = ort.InferenceSession(str(mlp), providers=["CPUExecutionProvider"])
    return repo, lambda x: sess.run(None, {"x": x})[0]


@pytest.fixture
def scale_out(model, tmp_path: Path) -> Iterator[ScaleOut]:
    """Two replicas and nginx on 127.0.0.1 free ports; every process stopped however the test ends."""
    try:
        find_nginx()
    except ConfigError as e:
        pytest.fail(f"{e} (scripts/test.sh installs it)")
    so = ScaleOut(model[0], 2, run_dir=tmp_path / "run", env={"OMP_NUM_THREADS": "1"})
    so.start(timeout=240)  # stops whatever it started if it fails
    try:
        yield so
    finally:
        codes = so.stop()
        print(f"replica exit codes {codes}; run directory {so.run_dir}")


@dataclass
class Load:
    """Closed-loop gRPC load through the balancer: THREADS clients, one request at a time each.

    ``tries``: attempts per request (1: no retry); a refused request (RETRYABLE) is sent again after ``backoff_s``.
    """

    url: str
    reference: Callable[[np.ndarray], np.ndarray]
    tries: int = 1
    backoff_s: float = 0.02
    sent: int = 0
    answered: int = 0
    wrong: int = 0
    lost: int = 0
    retries: int = 0
    retried_requests: int = 0
    attempts: collections.Counter = field(default_factory=collections.Counter)  # attempts per answered request
    errors: collections.Counter = field(default_factory=collections.Counter)  # (code, message) of each refusal
    failures: list = field(default_factory=list)  # the error of each lost request

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(k,), daemon=True) for k in range(THREADS)]

    def start(self) -> "Load":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)
        assert not any(t.is_alive() for t in self._threads), "a client thread hung"

    def _run(self, k: int) -> None:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        client = grpcclient.InferenceServerClient(self.url)
        rng = np.random.default_rng(k)
        try:
            while not self._stop.is_set():
                x = rng.standard_normal((1, IN_DIM)).astype(np.float32)
                with self._lock:
                    self.sent += 1
                for attempt in range(1, self.tries + 1):
                    inp = grpcclient.InferInput("x", [1, IN_DIM], "FP32")
                    inp.set_data_from_numpy(x)
                    try:
                        y = client.infer(MODEL, [inp], client_timeout=60).as_numpy("y")
                    except InferenceServerException as e:
                        code = str(e.status())
                        with self._lock:
                            self.errors[(code, (e.message() or "")[:160])] += 1
                        if retryable(code, e.message() or "") and attempt < self.tries:
                            with self._lock:
                                self.retries += 1
                                self.retried_requests += attempt == 1
                            time.sleep(self.backoff_s)
                            continue
                        with self._lock:
                            self.lost += 1
                            self.failures.append(f"{code}: {e.message()}")
                        break
                    ok = y is not None and np.allclose(y, self.reference(x), rtol=1e-4, atol=1e-5)
                    with self._lock:
                        self.answered += 1
                        self.wrong += not ok
                        self.attempts[attempt] += 1
                    break
        finally:
            client.close()


def _success(so: ScaleOut, i: int) -> int:
    """Replica i's own count of successful requests (Triton's statistics extension, asked directly)."""
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(so.replicas[i].endpoints.grpc) as c:
        return int(c.get_inference_statistics(MODEL).model_stats[0].inference_stats.success.count)


def _metric_success(so: ScaleOut, i: int) -> int | None:
    """The same count from the replica's metrics endpoint, which answers while it drains (the statistics
    extension says 'Server not ready' then); None once the model is unloaded or the endpoint is gone."""
    try:
        text = urllib.request.urlopen(so.replicas[i].endpoints.metrics, timeout=2).read().decode()
    except OSError:
        return None
    m = re.search(r'^nv_inference_request_success\{model="%s",version="1"\} (\d+)' % MODEL, text, flags=re.M)
    return int(m.group(1)) if m else None


def _watch_until_exit(so: ScaleOut, i: int, timeout: float = 90.0) -> int | None:
    """Poll replica i's success count until it exits; the last value read is its final count."""
    last = None
    proc = so.replicas[i].proc
    end = time.monotonic() + timeout
    while proc.poll() is None:
        assert time.monotonic() < end, f"replica {i} did not exit {timeout:.0f} s after SIGTERM"
        v = _metric_success(so, i)
        last = v if v is not None else last
        time.sleep(0.05)
    assert proc.returncode == 0, f"replica {i} exited with {proc.returncode}; see {so.replicas[i].log_file}"
    return last


def _wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.1)


def _access_log(so: ScaleOut, with_duration: bool = False) -> list[tuple]:
    """nginx's record of each inference: (end time, replicas tried in order, grpc-status[, duration s])."""
    rows = []
    for line in so.nginx.access_log.read_text().splitlines():
        m = re.match(r"(\S+) \d+ /inference\.GRPCInferenceService/ModelInfer -> (.*) (\d{3}) grpc=(\S*) (\S+)$", line)
        if m:
            row = (float(m.group(1)), [a.strip() for a in m.group(2).split(",")], m.group(4).replace("-", ""))
            rows.append((*row, float(m.group(5))) if with_duration else row)
    return rows


def _settled_access_log(so: ScaleOut, answered: int, timeout: float = 10.0) -> list[tuple]:
    """nginx writes a request's log line when it finalizes the request, which is after the client has its answer:
    under a busy core the last line was once still unwritten when the test read the log (1489 ok lines for 1490
    answers). Wait until the ok lines reach the client's count, or until the timeout; the count is then asserted
    exactly, so a missing or a duplicated line still fails."""
    end = time.monotonic() + timeout
    while True:
        rows = _access_log(so)
        if sum(1 for r in rows if r[2] == "0") >= answered or time.monotonic() > end:
            return rows
        time.sleep(0.1)


def _check_and_report(so: ScaleOut, load: Load, final: list[int], t_exit: float) -> dict:
    """Every request got one correct answer; nginx's log and the replicas' own counts agree with the client."""
    rows = _settled_access_log(so, load.answered)
    grpc_addr = [r.endpoints.grpc for r in so.replicas]
    ok_rows = [r for r in rows if r[2] == "0"]
    per_replica = [sum(1 for r in ok_rows if r[1][-1] == a) for a in grpc_addr]
    after_exit = sum(1 for r in ok_rows if r[1][-1] == grpc_addr[0] and r[0] > t_exit)
    passed_on = sum(1 for r in rows if len(r[1]) > 1)  # nginx tried the next replica (connection refused)
    figures = {"sent": load.sent, "answered": load.answered, "wrong": load.wrong, "lost": load.lost,
               "retries": load.retries, "retried_requests": load.retried_requests,
               "attempts_per_answered_request": dict(sorted(load.attempts.items())),
               "client_errors": {f"{c} {m}": n for (c, m), n in load.errors.items()},
               "nginx_ok_per_replica": per_replica, "replica_own_success": final,
               "nginx_passed_on_to_next_replica": passed_on, "replica0_ok_after_replica1_exited": after_exit}
    print("scale-out drain figures:", figures)
    if os.environ.get("LAZYBATCH_DRAIN_FIGURES"):  # docs/operations.md#scale-out: one JSON line per run
        with open(os.environ["LAZYBATCH_DRAIN_FIGURES"], "a") as f:
            f.write(json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
                                "commit": git_commit(), **figures}) + "\n")
    assert load.lost == 0, f"lost requests: {load.failures[:5]}"
    assert load.wrong == 0, "wrong answers"
    assert load.answered == load.sent, figures
    # one response per request through nginx, and the replicas ran exactly what was answered: nothing twice
    assert len(ok_rows) == load.answered, figures
    assert final[0] == per_replica[0], figures
    assert final[1] == per_replica[1], figures
    assert after_exit > 0, "the remaining replica took no requests after the drain"
    return figures


def _both_serving(so: ScaleOut, load: Load) -> list[int]:
    load.start()
    _wait_for(lambda: min(_success(so, 0), _success(so, 1)) >= 300, 60, "both replicas to serve 300 requests")
    return [_success(so, 0), _success(so, 1)]


def test_drain_takes_the_replica_out_of_the_balancer_first(scale_out: ScaleOut, model) -> None:
    so = scale_out
    load = Load(so.grpc, model[1], tries=1)  # no retry at all: any refused request fails the test
    try:
        before = _both_serving(so, load)
        so.drain(1)  # nginx: replica 1 down, reload, old workers done; then SIGTERM
        final1 = _watch_until_exit(so, 1)
        t_exit = time.time()
        at_exit = _success(so, 0)
        _wait_for(lambda: _success(so, 0) >= at_exit + 200, 60, "replica 0 to serve on after the drain")
    finally:
        load.stop()
    final = [_success(so, 0), final1]
    assert final1 is not None and final1 >= before[1] > 0, (before, final1)
    figures = _check_and_report(so, load, final, t_exit)
    assert load.retries == 0 and not load.errors, figures


def test_sigterm_alone_needs_client_retries(scale_out: ScaleOut, model) -> None:
    so = scale_out
    load = Load(so.grpc, model[1], tries=20)  # refused requests are sent again (counted), 20 ms apart
    try:
        before = _both_serving(so, load)
        t_term = time.time()
        so.drain(1, balancer_first=False)  # SIGTERM only
        final1 = _watch_until_exit(so, 1)
        t_exit = time.time()
        at_exit = _success(so, 0)
        _wait_for(lambda: _success(so, 0) >= at_exit + 200, 60, "replica 0 to serve on after the drain")
    finally:
        load.stop()
    final = [_success(so, 0), final1]
    assert final1 is not None and final1 >= before[1] > 0, (before, final1)
    figures = _check_and_report(so, load, final, t_exit)
    # requests replica 1 had taken when the SIGTERM came, answered after it (nginx's log: start < SIGTERM < end)
    r1 = so.replicas[1].endpoints.grpc
    across = sum(1 for end, addrs, st, dur in _access_log(so, with_duration=True)
                 if addrs[-1] == r1 and st == "0" and end - dur <= t_term < end)
    print(f"requests on replica 1 across the SIGTERM, answered: {across}")
    # what nginx alone cannot hide: the draining replica's refusals reach the client, which retried them; a
    # refusal is NOT_FOUND (its models unloading) or CANCELLED (its gRPC endpoint stopping): never a request it
    # had taken and dropped (that would be UNAVAILABLE, lazybatch's answer to requests held at unload)
    assert load.retries > 0, figures
    assert all(retryable(c, m) for c, m in load.errors), figures
