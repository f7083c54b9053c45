"""Production behaviour on a real tritonserver: metrics on the metrics port, an injected stage fault under load,
unload/reload with requests in flight, and a burst at 5x capacity (admission control, recovery, memory).

One server for this module, started with ``--model-control-mode=explicit`` so that the repository API can unload
and reload models (tests/triton/triton_models.py: build_prod_repository).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.policies.lazy import useful_batch_size
from lazybatch.client.api import Client, InferError
from lazybatch.client.soak import OpenLoop, metric_total, process_tree_rss, scrape, wait_for
from lazybatch.formats.prometheus import parse_samples
from lazybatch.serving import TritonServer, free_port

from triton_models import MAX_BATCH, build_prod_repository


@pytest.fixture(scope="module")
def prod(tmp_path_factory):
    root = tmp_path_factory.mktemp("prod")
    models = build_prod_repository(root)
    log = root / "tritonserver.log"
    server = TritonServer(models.repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          log_file=log, env={"OMP_NUM_THREADS": "1"},
                          extra_args=["--model-control-mode=explicit", "--load-model=*"])
    server.start(timeout=240)
    try:
        yield server, models
    finally:
        code = server.stop()
        assert code == 0, f"tritonserver exited with {code}; see {log}"


def _x(batch: int, seed: int, dim: int = 32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, dim)).astype(np.float32)


def _metrics(server) -> str:
    return scrape(server.endpoints.metrics)


def _reference(path):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda x: sess.run(None, {"x": x})[0]


def test_metrics_count_the_traffic_sent(prod):
    """Counts on Triton's metrics port equal what was sent: outcomes, SLA, latency and queue-delay histograms, the
    batch sizes every stage executed (each sample runs each stage once), decisions, BatchMonitor's gauge."""
    server, models = prod
    n_stages = 6
    before = _metrics(server)
    batches = [1 + i % 3 for i in range(24)]

    def client(k: int) -> None:
        with Client(server.endpoints.grpc) as c:
            for j in range(k, len(batches), 8):
                c.infer("prod_mlp", {"x": _x(batches[j], j)}, sla_ms=5000)
                c.infer("prod_monitor", {"x": _x(1, 100 + j)})

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with Client(server.endpoints.grpc) as c:  # NaN: refused by the backend's validation
        for i in range(3):
            with pytest.raises(Exception, match="NaN"):
                c.infer("prod_mlp", {"x": np.full((1, 32), np.nan, np.float32)})
    samples = sum(batches)

    def delta(family, **labels):
        return metric_total(_metrics(server), family, **labels) - metric_total(before, family, **labels)

    assert wait_for(lambda: delta("lazybatch_requests_total", model="prod_mlp", outcome="ok") == 24 and
                    delta("lazybatch_requests_total", model="prod_mlp", outcome="invalid") == 3 and
                    delta("lazybatch_requests_total", model="prod_monitor", outcome="ok") == 24, 10), \
        [line for line in _metrics(server).splitlines() if "requests_total" in line]
    text = _metrics(server)
    d = lambda fam, **lab: metric_total(text, fam, **lab) - metric_total(before, fam, **lab)  # noqa: E731
    assert d("lazybatch_request_latency_seconds_count", model="prod_mlp") == 24
    assert d("lazybatch_request_latency_seconds_bucket", model="prod_mlp", le="+Inf") == 24
    assert d("lazybatch_queue_delay_seconds_count", model="prod_mlp") == 24
    assert d("lazybatch_sla_total", model="prod_mlp", result="met") + \
        d("lazybatch_sla_total", model="prod_mlp", result="missed") == 24
    assert 0 < d("lazybatch_request_latency_seconds_sum", model="prod_mlp") < 24 * 5.0
    for s in range(n_stages):  # every sample ran every stage exactly once
        stage = f"stage_{s:03d}"
        assert d("lazybatch_stage_batch_size_sum", model="prod_mlp", stage=stage) == samples
        assert d("lazybatch_stage_batch_size_bucket", model="prod_mlp", stage=stage, le="+Inf") == \
            d("lazybatch_stage_batch_size_count", model="prod_mlp", stage=stage) > 0
    assert d("lazybatch_decisions_total", model="prod_mlp", kind="dispatch") >= 1
    assert d("lazybatch_dispatch_reasons_total", model="prod_mlp") == \
        d("lazybatch_decisions_total", model="prod_mlp", kind="dispatch")
    assert d("lazybatch_requests_total", model="prod_mlp", outcome="error") == 0
    assert "# TYPE lazybatch_requests_total counter" in text
    assert metric_total(text, "lazybatch_preferred_batch_size", model="prod_monitor") >= 1
    queued = [v for lab, v in parse_samples(text, "lazybatch_queue_samples") if lab.get("model") == "prod_mlp"]
    assert queued == [0.0]  # one series: one instance, labelled with its process
    assert all(lab.get("stub_pid", "").isdigit() for lab, _ in parse_samples(text, "lazybatch_requests_total"))


def test_fault_in_one_stage_under_load_fails_only_those_requests(prod):
    """Every 5th sample of prod_fault makes stage 2 raise (parameter fault_injection), under 16 concurrent clients:
    exactly those requests fail with the error text, every other one gets its correct answer, one answer each, and
    the scheduler thread goes on serving."""
    server, models = prod
    ref = _reference(models.mlp)
    before = _metrics(server)
    loop = OpenLoop(server.endpoints.grpc, "prod_fault", lambda i: {"x": _x(1, 7000 + i)})
    try:
        phase = loop.run("fault", rate=150, duration=1.0, poisson=False)
        assert loop.wait_idle(60), "some request got no answer"
    finally:
        loop.close()
    out = phase.outcomes
    assert phase.lost == 0 and phase.duplicated == 0
    failed = sorted(i for i, o in out.items() if o.error is not None)
    # the backend numbers samples in arrival order, which under concurrency need not be the send order: count them
    assert len(failed) == len(out) // 5, (len(failed), len(out))
    assert all("injected fault in stage 'stage_002'" in out[i].error and out[i].kind == "error" for i in failed)
    text = _metrics(server)
    d = lambda fam, **lab: metric_total(text, fam, **lab) - metric_total(before, fam, **lab)  # noqa: E731
    assert wait_for(lambda: metric_total(_metrics(server), "lazybatch_requests_total", model="prod_fault",
                                         outcome="error") - metric_total(before, "lazybatch_requests_total",
                                                                         model="prod_fault", outcome="error")
                    == len(failed), 10)
    text = _metrics(server)
    assert d("lazybatch_stage_failures_total", model="prod_fault", stage="stage_002") >= len(failed)
    assert d("lazybatch_stage_failures_total", model="prod_fault", stage="stage_001") == 0
    # the model still serves: of 5 more requests one after the other exactly one is poisoned, the others are right
    results = []
    with Client(server.endpoints.grpc) as c:
        for k in range(5):
            x = _x(1, 900 + k)
            try:
                results.append(c.infer("prod_fault", {"x": x})["y"])
                np.testing.assert_allclose(results[-1], ref(x), rtol=1e-4, atol=1e-5)
            except InferError as e:
                assert "injected fault" in str(e)
                results.append(None)
    assert sum(r is None for r in results) == 1


def test_unload_and_reload_with_requests_in_flight(prod):
    """Unloading a model through the repository API while 24 requests are queued on it: each gets exactly one answer
    (served, or UNAVAILABLE from the backend or Triton); after a reload the model serves again."""
    server, models = prod
    model = "prod_heavy_delay"
    c = grpcclient.InferenceServerClient(server.endpoints.grpc)
    answers: dict[int, list] = {}
    lock = threading.Lock()

    def cb(i):
        def f(result, error):
            with lock:
                answers.setdefault(i, []).append(error)
        return f

    n = 24
    for i in range(n):
        x = np.random.default_rng(i).standard_normal((1, 512)).astype(np.float32)
        t = grpcclient.InferInput("x", [1, 512], "FP32")
        t.set_data_from_numpy(x)
        c.async_infer(model, [t], cb(i))
    time.sleep(0.3)  # some are running, most are queued (75 ms per sample)
    c.unload_model(model)
    assert wait_for(lambda: len(answers) == n, 120), f"{len(answers)} of {n} answered"
    time.sleep(0.5)
    assert all(len(v) == 1 for v in answers.values()), "a request was answered twice"
    errors = [str(e) for v in answers.values() for e in v if e is not None]
    assert all("unloaded" in e or "unavailable" in e.lower() for e in errors), errors
    assert wait_for(lambda: not c.is_model_ready(model), 60)
    c.load_model(model)
    assert c.is_model_ready(model)
    x = np.ones((2, 512), np.float32)
    t = grpcclient.InferInput("x", [2, 512], "FP32")
    t.set_data_from_numpy(x)
    y = c.infer(model, [t]).as_numpy("y")
    np.testing.assert_allclose(y, _reference(models.heavy)(x), rtol=1e-3, atol=1e-4)
    c.close()


def test_burst_at_5x_capacity_then_normal_load(prod):
    """prod_heavy (max_queue_size 32, timeout_action REJECT, SLA 1 s): 50% load, a 30 s burst at 5x capacity, 50%
    load again. Every request gets exactly one answer; the overload is refused at once (UNAVAILABLE, with the
    reason) instead of queueing; after the burst the model serves normal load as before (no more rejections than
    before, nothing held); the server's memory (tritonserver + stubs) returns near its level before the burst; the
    metrics count exactly what the client saw."""
    server, models = prod
    model = "prod_heavy"
    table = LatencyTable.load(models.repo / model / "1" / "latency.json")
    capacity = max(b / table.whole_graph_latency(b) for b in table.batch_sizes)  # samples/s, best batch
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((64, 512)).astype(np.float32)
    loop = OpenLoop(server.endpoints.grpc, model, lambda i: {"x": xs[i % 64:i % 64 + 1]})
    try:
        warm = loop.run("warm-up", rate=capacity * 2, duration=2.0)  # every batch size once: arenas grown
        assert loop.wait_idle(60)
        time.sleep(1.0)  # the warm-up's counts reach Triton (pushed every 200 ms) before the baseline scrape
        before = _metrics(server)
        normal1 = loop.run("normal", rate=capacity * 0.5, duration=6.0)
        assert loop.wait_idle(60)
        rss0 = process_tree_rss(server.proc.pid)
        burst = loop.run("burst 5x", rate=capacity * 5, duration=30.0)
        assert loop.wait_idle(120), "some burst request got no answer"
        normal2 = loop.run("normal after", rate=capacity * 0.5, duration=6.0)
        assert loop.wait_idle(60)
        # memory comes back at an idle moment at most every memory_release_ms (default 5 s): after that long, one
        # request makes the idle instance release (glibc's heap now, each session's arena marked), the next ones
        # run with onnxruntime's arena shrinkage (backend/memory.py)
        time.sleep(5.5)
        with Client(server.endpoints.grpc) as c:
            for j in range(3):
                c.infer(model, {"x": xs[j:j + 1]})
                time.sleep(0.3)
        rss1 = process_tree_rss(server.proc.pid)
    finally:
        loop.close()
    phases = (warm, normal1, burst, normal2)
    print("\ncapacity %.1f samples/s; RSS %.1f -> %.1f MB" % (capacity, rss0 / 2**20, rss1 / 2**20))
    for p in phases:
        print(p.summary())
    for p in phases:
        assert p.lost == 0 and p.duplicated == 0, p.summary()
        assert p.count("other") == 0 and p.count("error") == 0 and p.count("unavailable") == 0, p.summary()
    # the burst was refused at admission, not queued: the rejections say why, the accepted ones were served
    assert burst.count("rejected") > len(burst.outcomes) / 2, burst.summary()
    reasons = {o.error.split("rejected: ")[1][:26] for o in burst.outcomes.values() if o.kind == "rejected"}
    assert all(r.startswith(("the deadline cannot be met", "the queue is full")) for r in reasons), reasons
    assert burst.count("ok") > 0
    # promises kept (docs/operations.md): at least 99% of the accepted requests met the 1 s SLA as the client saw it, and
    # the refused ones were told at once: within the time of one whole-graph pass at the largest batch + slack for
    # a loaded 2-core machine (a rejection waits at most for the job in flight on the scheduler thread)
    # The deadline runs from the backend's arrival and admission sees only its own side (batcher/admission.py);
    # the client's clock also counts the gRPC path both ways and the response thread. On a quiet machine that is a
    # few ms (bench_memory: 0 of 4,277 late); with another process spinning on one of the two cores it reached
    # tens of ms, and 1.9-4.6% of the accepted requests ended up to that much past 1 s by the client's clock. So
    # the promise is checked with 100 ms for that path, and the count past the bare SLA is printed.
    print("burst: %d accepted, %d late, %d later than SLA + 100 ms; rejected answered in p50 %.1f / p99 %.1f ms"
          % (burst.count("ok"), burst.late(1.0), burst.late(1.1), burst.latency_ms(50, "rejected"),
             burst.latency_ms(99, "rejected")))
    late_at = burst.late_sent_at(1.1)  # when a stall hit, if one did
    assert len(late_at) <= 0.01 * burst.count("ok"), \
        (burst.summary(), "late ones sent at (s)", [round(t, 2) for t in late_at[:60]])
    assert burst.latency_ms(99, "rejected") <= 1e3 * table.whole_graph_latency(MAX_BATCH) + 100, burst.summary()
    # recovery: normal load after the burst is served like normal load before it
    assert normal2.count("rejected") <= normal1.count("rejected") + max(2, len(normal2.outcomes) // 10), \
        (normal1.summary(), normal2.summary())
    assert normal2.count("ok") >= len(normal2.outcomes) * 0.8, normal2.summary()
    # memory: back within 10% of its level before the burst (docs/operations.md; without the release it stayed +25%)
    assert rss1 <= rss0 * 1.10, (rss0, rss1)
    # the server's counts are the client's
    sent = [normal1, burst, normal2]

    def delta(text, family, **labels):
        return (metric_total(text, family, model=model, **labels)
                - metric_total(before, family, model=model, **labels))

    ok = sum(p.count("ok") for p in sent) + 3  # and the three sequential requests before the memory reading
    rejected = sum(p.count("rejected") for p in sent)
    assert wait_for(lambda: delta(_metrics(server), "lazybatch_requests_total", outcome="ok") == ok, 10), \
        (delta(_metrics(server), "lazybatch_requests_total", outcome="ok"), ok)
    text = _metrics(server)
    assert delta(text, "lazybatch_requests_total", outcome="rejected") == rejected
    assert delta(text, "lazybatch_rejected_total") == rejected
    assert delta(text, "lazybatch_decisions_total", kind="reject") == rejected
    assert metric_total(text, "lazybatch_queue_samples", model=model) == 0
    # fuse_stages: auto. Batching barely pays on this model, and where its profile (taken when the repository was
    # built, on a busy machine) gives lazy a batch cap of 1, lazy ran every request through the whole graph in one
    # pass, which the per-stage metrics show as the one stage whole_graph; where a noisy profile gives a cap above
    # 1, it ran stage by stage. Either way the metrics must show the one the scheduler's rule chose, and only it.
    cap = useful_batch_size(table, MAX_BATCH)
    whole = delta(text, "lazybatch_stage_batch_size_sum", stage="whole_graph")
    first = delta(text, "lazybatch_stage_batch_size_sum", stage="stage_000")
    assert (whole, first) == ((ok, 0) if cap == 1 else (0, ok)), (cap, whole, first, ok)
    assert MAX_BATCH == 8


def test_compose_image_tag_is_the_release_of_this_server(prod):
    """docker-compose.yml pins NGC YY.MM, which carries Triton 2.(51 + months since 24.10): it must be the release
    of the server these tests run (nvidia-pytriton's), so the Python backend in production is the one tested."""
    import json
    import re
    import urllib.request
    from pathlib import Path

    server, _ = prod
    with urllib.request.urlopen(f"http://{server.endpoints.http}/v2", timeout=5) as r:
        version = json.load(r)["version"]
    compose = (Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text()
    tags = set(re.findall(r'TRITON_TAG: "(\d+)\.(\d+)"', compose))
    assert len(tags) == 1, tags
    yy, mm = (int(v) for v in tags.pop())
    assert version.split(".")[:2] == ["2", str(51 + (yy - 24) * 12 + (mm - 10))], version


def test_request_priority_overtakes_the_queue(prod):
    """priority_levels 2: a level-1 request sent behind queued default (level 2) requests runs as soon as the
    device frees, not after them; a priority outside the levels gets a clear error and the rest are served."""
    server, _ = prod
    done: list[tuple[float, str]] = []
    lock = threading.Lock()

    # Every default request is sent at once (a barrier after each thread's connection is made); the urgent one has
    # its thread and connection made beforehand too, and is sent as soon as the first default request is answered
    # (signalled from that request's own thread): the others are queued at the server by then. Each default
    # request holds 4 samples (about 90 ms on this machine, the serial policy runs one request at a time), so that
    # the urgent request's own way to the server is short beside one service time even with another process
    # spinning on one of the two cores. (With one sample a request, about 22 ms, the main thread's poll for the
    # first answer and the urgent thread's wake-up let 2-8 more requests start first in 2 of 5 suite runs.)
    ready = threading.Barrier(18)
    go = threading.Event()
    sent = [0.0]

    def send(tag: str, priority: int | None) -> None:
        with Client(server.endpoints.grpc) as c:
            assert c.is_ready("prod_heavy_prio")  # the connection is made here, before the barrier
            ready.wait(timeout=60)
            if priority is not None:
                assert go.wait(timeout=60)
                sent[0] = time.perf_counter()
            rows = 1 if priority is not None else 4
            c.infer("prod_heavy_prio", {"x": _x(rows, len(tag), dim=512)}, priority=priority)
        with lock:
            done.append((time.perf_counter(), tag))
        go.set()  # the first answer: the urgent request goes now

    queued = [threading.Thread(target=send, args=(f"d{i}", None)) for i in range(16)]
    urgent = threading.Thread(target=send, args=("urgent", 1))
    for t in [*queued, urgent]:
        t.start()
    ready.wait(timeout=60)
    assert go.wait(timeout=60), "no default request was answered"
    with Client(server.endpoints.grpc) as c:
        with pytest.raises(InferError, match=r"request_priority 3 is outside 1\.\.2"):
            c.infer("prod_heavy_prio", {"x": _x(1, 0, dim=512)}, priority=3)
    for t in [*queued, urgent]:
        t.join()
    assert len(done) == 17
    after = [tag for t, tag in sorted(done) if t >= sent[0]]
    print("\nanswered after the urgent request was sent (ms):",
          [(tag, round((t - sent[0]) * 1e3)) for t, tag in sorted(done) if t >= sent[0]])
    assert len(after) >= 5, f"too few default requests were still queued when the urgent one came: {after}"
    # first in line: only the request running when it reached the server, and one that may have started while the
    # urgent request was still on its way, finish before it; in arrival order it would finish last of these
    assert after.index("urgent") <= 2, f"the level-1 request finished after {after}"


def test_traffic_classes_under_load_against_tritons_priority_queue(prod):
    """`lazybatch load --class` on the default policy and on Triton's batcher with two levels and a queue timeout
    per level (config accepted by the real server): every request answered, each class reported on its own."""
    from lazybatch.client.load import run_load
    from lazybatch.client.report import format_table
    from lazybatch.traffic import parse_classes

    server, _ = prod
    classes = parse_classes(["interactive:0.3:2000:1", "bulk:0.7:60000:2"])
    for model in ("prod_heavy_urgency", "prod_heavy_triton_prio"):
        r = run_load(server.endpoints.grpc, model, 10.0, 2.0, classes=classes, seed=1)
        print(format_table([r]))
        assert r.sent > 5 and r.ok == r.sent, r.error_kinds
        assert set(r.classes) == {"interactive", "bulk"}
        assert sum(c["sent"] for c in r.classes.values()) == r.sent
        assert all(c["sent"] > 0 and c["ok"] == c["sent"] for c in r.classes.values())


def test_reload_in_place_after_traffic_leaves_the_server_sound(tmp_path):
    """A model that has served and exported its metrics is reloaded in place twice (config changed, then
    ``load_model``: Triton starts the new instance before it finalizes the old one). The new instance serves and
    counts under its own ``stub_pid``, and the server exits cleanly. Before that label, both instances wrote to one
    Prometheus series that the old one freed on finalize, and tritonserver died of heap corruption at or before
    shutdown (3 of 3 runs; backend/metrics.py, TritonMetricsExporter)."""
    from lazybatch.backend.config_pbtxt import config_to_text, load_config
    from lazybatch.repo import add_model
    from lazybatch.staging import make_mlp, split_model

    mlp = make_mlp(tmp_path / "mlp.onnx", in_dim=32, width=64, depth=3, out_dim=10, seed=3)
    stages = split_model(mlp, tmp_path / "stages", cut_after=None)
    repo = tmp_path / "repo"
    add_model(mlp, repo, name="reloaded", policy="eager", sla_ms=2000, max_batch_size=MAX_BATCH, stages=stages,
              profile_reps=2, execution_provider="cpu", intra_op_threads=1,
              parameters={"metrics_interval_ms": "100"})
    log = tmp_path / "tritonserver.log"
    server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          log_file=log, env={"OMP_NUM_THREADS": "1"},
                          extra_args=["--model-control-mode=explicit", "--load-model=*"])
    server.start(timeout=240)
    ref = _reference(mlp)
    pids: list[str] = []
    try:
        c = grpcclient.InferenceServerClient(server.endpoints.grpc)
        for round_ in range(3):
            for i in range(20):
                x = _x(1, 100 * round_ + i)
                t = grpcclient.InferInput("x", list(x.shape), "FP32")
                t.set_data_from_numpy(x)
                np.testing.assert_allclose(c.infer("reloaded", [t]).as_numpy("y"), ref(x), rtol=1e-3, atol=1e-4)
            def samples() -> list:  # this instance's series: under a process no earlier instance had
                return [(lab, v) for lab, v in parse_samples(_metrics(server), "lazybatch_requests_total")
                        if lab.get("model") == "reloaded" and lab.get("outcome") == "ok"
                        and lab.get("stub_pid") not in pids]

            assert wait_for(lambda: sum(v for _, v in samples()) >= 20, 30), samples()
            (lab, v), = samples()
            assert v == 20
            pids.append(lab["stub_pid"])
            if round_ < 2:  # reload in place: a changed config makes load_model load a new instance
                path = repo / "reloaded" / "config.pbtxt"
                cfg = load_config(path)
                cfg.parameters["metrics_interval_ms"].string_value = str(100 + 10 * (round_ + 1))
                path.write_text(config_to_text(cfg))
                c.load_model("reloaded")
                assert c.is_model_ready("reloaded")
        c.close()
    finally:
        code = server.stop()
    text = log.read_text()
    assert code == 0, f"tritonserver exited with {code}; see {log}"
    assert not any(s in text for s in ("corrupted", "unaligned", "Signal (6)", "Signal (11)")), text[-2000:]
