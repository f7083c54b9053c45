"""Co-located lazybatch models on a real tritonserver, sharing one device through their group's arbiter
(config.pbtxt ``device_group``, backend/arbiter): both answer correctly under concurrent load with cross-model
grants in the arbiter's figures, and a stub killed with ``kill -9`` under load leaves the other model serving.

One server for this module, its own repository: a small MLP and a larger one in group ``dev0``. The arbiter's
socket lives in this module's own directory (``LAZYBATCH_ARBITER_DIR``), so the test can ask it for its figures.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from lazybatch.backend.arbiter import protocol as P
from lazybatch.backend.arbiter.client import query
from lazybatch.client.api import Client
from lazybatch.client.soak import scrape, wait_for
from lazybatch.formats.prometheus import parse_samples
from lazybatch.repo import add_model
from lazybatch.serving import TritonServer, free_port
from lazybatch.staging import make_mlp, split_model
from triton_models import settled_stats

GROUP = "dev0"
MODELS = {"co_small": (32, 4, 1), "co_large": (512, 8, 2)}  # name: width, depth, seed


def build_repo(root, parameters):
    """The two MLPs of MODELS split at their ReLUs and added under eager with ``parameters`` in root/repo; returns
    (repo, {name: whole-graph ONNX path}) (shared by the real-server arbiter tests)."""
    repo = root / "repo"
    graphs = {}
    for name, (width, depth, seed) in MODELS.items():
        model = make_mlp(root / f"{name}.onnx", in_dim=32, width=width, depth=depth, out_dim=10, seed=seed)
        relus = [i for i, n in enumerate(onnx.load(str(model)).graph.node) if n.op_type == "Relu"]
        stages = split_model(model, root / f"{name}_stages", cut_after=relus)
        add_model(model, repo, name=name, policy="eager", sla_ms=5000, max_batch_size=8, stages=stages,
                  profile_reps=1, execution_provider="cpu", intra_op_threads=1, parameters=parameters)
        graphs[name] = model
    return repo, graphs


@pytest.fixture(scope="module")
def colocated(tmp_path_factory):
    root = tmp_path_factory.mktemp("arbiter_server")
    repo, graphs = build_repo(root, {"device_group": GROUP, "metrics_interval_ms": "100"})
    arbiter_dir = root / "arbiter"
    arbiter_dir.mkdir()
    log = root / "tritonserver.log"
    server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          log_file=log, env={"OMP_NUM_THREADS": "1", "LAZYBATCH_ARBITER_DIR": str(arbiter_dir),
                                             "LAZYBATCH_STATS_DIR": str(root / "stats")})
    server.stats_dir = root / "stats"
    server.start(timeout=240)
    path = arbiter_dir / P.group_paths(repo, GROUP)[0].name  # where the stubs (LAZYBATCH_ARBITER_DIR) put it
    try:
        yield server, graphs, path, log
    finally:
        server.stop()  # a killed stub may make Triton's exit code non-zero: not this module's question
        try:
            os.kill(query(path)["pid"], signal.SIGKILL)
        except (OSError, ConnectionError):
            pass


def _reference(path):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda x: sess.run(None, {"x": x})[0]


def _load(server, graphs, n, *, seed=0, errors_ok=(), kill=None):
    """Four clients per model at once, ``n`` requests each; returns per model (answered ok, failed). A client of a
    model in ``errors_ok`` stops at its first error. ``kill`` (model, ok answers, pid): SIGKILL ``pid`` once that
    model has answered that many, with every client still sending."""
    counts = {name: [0, 0] for name in graphs}
    lock = threading.Lock()
    killed = []

    def client(name, k):
        ref = _reference(graphs[name])
        rng = np.random.default_rng(seed * 100 + k)
        # a timeout: a request held by a stub killed with kill -9 may never be answered by Triton itself (seen
        # once: its client waited past 10 minutes); the killed model's errors are counted, the other's must be none
        with Client(server.endpoints.grpc, timeout_s=30) as c:
            for _ in range(n):
                x = rng.standard_normal((1 + k % 2, 32)).astype(np.float32)
                try:
                    y = c.infer(name, {"x": x})["y"]
                except Exception:
                    if name not in errors_ok:
                        raise
                    with lock:
                        counts[name][1] += 1
                    return
                np.testing.assert_allclose(y, ref(x), rtol=1e-4, atol=1e-5)
                with lock:
                    counts[name][0] += 1
                    if kill is not None and not killed and name == kill[0] and counts[name][0] >= kill[1]:
                        os.kill(kill[2], signal.SIGKILL)
                        killed.append(time.monotonic())

    threads = [threading.Thread(target=client, args=(name, k)) for name in graphs for k in range(4)]
    failures = []
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return counts, killed


def test_colocated_models_share_the_device(colocated):
    server, graphs, path, _ = colocated
    counts, _ = _load(server, graphs, 15)
    assert counts == {name: [60, 0] for name in graphs}
    stats = query(path)
    by = {m["model"]: m for m in stats["members"]}
    assert set(by) == set(MODELS)
    assert all(m["grants"] > 0 for m in by.values())
    # the device passed between the models through the arbiter: a lease revoked when the other asked, or a
    # contended grant decided across them (under this closed-loop load a model is often alone in time, leased)
    assert sum(m["revokes"] + m["decisions"] for m in by.values()) > 0, stats
    if sum(m["decisions"] for m in by.values()):
        assert any("device to" in r for m in by.values() for r in m["recent"])
    # each stub's statistics file carries its own side of it (the retired probe_device_wait read them, `git show 555b6b3:benchmarks/probes/probe_device_wait.py`)
    for name in graphs:
        mine = settled_stats(server.stats_dir / f"{name}.json")["device"]
        assert mine["grants"] > 0 and mine["device_s"] > 0.0 and mine["wait_s"] >= 0.0, mine


def _stub_pid(server, model):
    pids = {lab.get("stub_pid") for lab, _ in parse_samples(scrape(server.endpoints.metrics),
                                                             "lazybatch_requests_total") if lab.get("model") == model}
    pids.discard(None)
    return int(pids.pop()) if len(pids) == 1 else None


def test_a_stub_killed_under_load_leaves_the_other_model_serving(colocated):
    server, graphs, path, _ = colocated
    assert wait_for(lambda: _stub_pid(server, "co_large") is not None, timeout=10)
    pid = _stub_pid(server, "co_large")
    left = query(path)["left"]
    counts, killed = _load(server, graphs, 40, seed=1, errors_ok=("co_large",), kill=("co_large", 20, pid))
    assert killed, counts
    assert counts["co_small"] == [160, 0]  # every request of the other model answered, once, correctly
    # the killed model's clients: answered until the kill, then one error each (they stop at it)
    assert counts["co_large"][0] >= 20 and counts["co_large"][1] <= 4
    assert wait_for(lambda: query(path)["left"] > left, timeout=10)
    # the device is free for the survivor: it keeps serving alone
    counts, _ = _load(server, {"co_small": graphs["co_small"]}, 5, seed=2)
    assert counts == {"co_small": [20, 0]}


def test_models_with_device_group_auto_share_their_devices_arbiter(tmp_path):
    """device_group "auto" on both lazybatch models of the server: they join their device's group ("cpu"); the
    second to load starts the arbiter and the first joins it. Both answer every request, and the one arbiter saw
    both (grants to each). (Without the parameter a model has the device to itself: the default, from the served
    figures, docs/colocation.md.)"""
    repo, graphs = build_repo(tmp_path, {"device_group": "auto"})
    arbiter_dir = Path(tempfile.mkdtemp(prefix="lb-arb-"))  # short: a Unix socket's path has at most 107 bytes
    server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          log_file=tmp_path / "tritonserver.log",
                          env={"OMP_NUM_THREADS": "1", "LAZYBATCH_ARBITER_DIR": str(arbiter_dir)})
    server.start(timeout=240)
    path = arbiter_dir / P.group_paths(repo, "cpu")[0].name
    try:
        assert wait_for(lambda: path.exists() and len(query(path)["members"]) == 2, timeout=10)
        counts, _ = _load(server, graphs, 15, seed=3)
        assert counts == {name: [60, 0] for name in graphs}
        by = {m["model"]: m for m in query(path)["members"]}
        assert set(by) == set(MODELS) and all(m["grants"] > 0 for m in by.values()), by
    finally:
        server.stop()
        try:
            os.kill(query(path)["pid"], signal.SIGKILL)
        except (OSError, ConnectionError):
            pass
