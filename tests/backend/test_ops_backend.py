"""Metrics bookkeeping, fault injection and admission in the backend's scheduler thread, without a server.

The real-server versions (scraping Triton's metrics port, unload/reload, a burst) are in
tests/triton/test_ops_server.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from lazybatch.backend import metrics as M
from lazybatch.backend.settings import BackendSettings
from lazybatch.backend.config_pbtxt import parse_config_text
from lazybatch.backend.request_parsing import RequestOptions
from lazybatch.backend.faults import FaultInjector
from lazybatch.backend.runtime import BackendRuntime
from lazybatch.backend.stages import StageRunner
from lazybatch.batcher.admission import QueuePolicy
from lazybatch.batcher.decisions import DecisionLog
from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.policies import parse_policy
from lazybatch.batcher.request import Status
from lazybatch.formats.prometheus import parse_samples

from test_backend import CONFIG, Collector, mlp  # noqa: F401  (the module-scoped fixture)


def test_histogram_is_cumulative_with_sum_and_count():
    h = M.Histogram([1, 2, 4])
    for v in (0.5, 1, 3, 3, 9):
        h.observe(v)
    assert h.cumulative() == [("1", 2), ("2", 2), ("4", 4), ("+Inf", 5)]
    assert h.sum == pytest.approx(16.5) and h.count == 5


def test_reason_labels_are_bounded():
    assert M.reason_label("preferred batch size 4 reached (120 requests/s last window)") == \
        "preferred batch size N reached"
    assert M.reason_label("deadline guard: 3 queued, preferred 4") == "deadline guard"
    assert M.reason_label("device idle: queued requests start") == "device idle"


def test_passes_done_records_what_the_per_stage_and_per_request_calls_did():
    """Inline whole-graph passes of one batch size are recorded in one call: the same series as stage_run for
    every stage of every pass and request_done for every request (queue delay 0, no SLA verdict)."""
    one, loop = M.ModelMetrics("m", ["s0", "s1", "s2"], 8), M.ModelMetrics("m", ["s0", "s1", "s2"], 8)
    for batch, answered, failed in ((1, [(0.004, 1), (0.2, 1)], 0), (5, [(0.03, 3)], 0), (8, [(0.7, 2), (0.1, 0)], 3)):
        one.passes_done(3, batch, answered, failed)
        for latency, ok in answered:
            for s in range(3):
                loop.stage_run(s, batch)
            for _ in range(ok):
                loop.request_done(M.OK, latency=latency, queue_delay=0.0, sla_met=None)
        for _ in range(failed):
            loop.request_done(M.ERROR)
    assert one.to_prometheus() == loop.to_prometheus()


def test_model_metrics_collect_and_text_format():
    m = M.ModelMetrics("m", ["s0", "s1"], 8)
    m.request_done(M.OK, latency=0.004, queue_delay=0.001, sla_met=True)
    m.request_done(M.OK, latency=0.3, queue_delay=0.2, sla_met=False)
    m.request_done(M.REJECTED, reject_reason="deadline")
    m.stage_run(0, 3)
    m.stage_run(1, 8)
    m.stage_failed(1)
    log = DecisionLog()
    log.add(0.0, "dispatch", 0, 2, "preferred batch size 2 reached (10 requests/s last window)")
    log.add(0.0, "preempt", 1, 2, "slack predictor allows lazy batching")
    log.add(0.0, "merge", 1, 3, "two topmost sub-batches reached the same stage")

    class Monitor:
        pbs = 4
    m.sync_scheduler(log, held=5, policy=Monitor())
    log.add(0.1, "dispatch", 0, 1, "preferred batch size 2 reached (12 requests/s last window)")
    m.sync_scheduler(log, held=0)
    series = {(s.family, s.labels): s.value for s in m.collect()}
    mod = (("model", "m"),)
    assert series[("lazybatch_requests_total", mod + (("outcome", "ok"),))] == 2
    assert series[("lazybatch_requests_total", mod + (("outcome", "rejected"),))] == 1
    assert series[("lazybatch_sla_total", mod + (("result", "missed"),))] == 1
    assert series[("lazybatch_rejected_total", mod + (("reason", "deadline"),))] == 1
    assert series[("lazybatch_request_latency_seconds_bucket", mod + (("le", "0.005"),))] == 1
    assert series[("lazybatch_request_latency_seconds_count", mod)] == 2
    assert series[("lazybatch_queue_delay_seconds_bucket", mod + (("le", "+Inf"),))] == 2
    assert series[("lazybatch_stage_batch_size_bucket", mod + (("stage", "s0"), ("le", "4")))] == 1
    assert series[("lazybatch_stage_batch_size_bucket", mod + (("stage", "s1"), ("le", "4")))] == 0
    assert series[("lazybatch_stage_failures_total", mod + (("stage", "s1"),))] == 1
    assert series[("lazybatch_decisions_total", mod + (("kind", "merge"),))] == 1
    assert series[("lazybatch_decisions_total", mod + (("kind", "dispatch"),))] == 2
    assert series[("lazybatch_dispatch_reasons_total", mod + (("reason", "preferred batch size N reached"),))] == 2
    assert series[("lazybatch_preferred_batch_size", mod)] == 4
    assert series[("lazybatch_queue_samples", mod)] == 0
    text = m.to_prometheus()
    assert "# TYPE lazybatch_requests_total counter" in text
    got = dict((lab["outcome"], v) for lab, v in parse_samples(text, "lazybatch_requests_total"))
    assert got["ok"] == 2 and got["error"] == 0


class FakeMetric:
    def __init__(self, labels):
        self.labels = labels
        self.value = 0.0
        self.calls = 0

    def increment(self, v):
        assert v > 0
        self.value += v
        self.calls += 1

    def set(self, v):
        self.value = v
        self.calls += 1


class FakePbUtils:
    """Stands in for pb_utils.MetricFamily: records what the exporter pushes."""

    made: list = []

    class MetricFamily:
        COUNTER, GAUGE = 0, 1

        def __init__(self, name, description, kind):
            self.name = name
            self.kind = kind

        def Metric(self, labels):
            m = FakeMetric(labels)
            FakePbUtils.made.append((self.name, m))
            return m


def test_exporter_pushes_only_deltas():
    m = M.ModelMetrics("m", ["s0"], 4)
    FakePbUtils.made = []
    ex = M.TritonMetricsExporter(m, FakePbUtils, interval_s=3600)
    m.request_done(M.OK, latency=0.01, queue_delay=0.0, sla_met=True)
    ex.push()
    calls = sum(x.calls for _, x in FakePbUtils.made)
    ex.push()  # nothing changed: no calls
    assert sum(x.calls for _, x in FakePbUtils.made) == calls
    m.request_done(M.OK, latency=0.01, queue_delay=0.0, sla_met=True)
    ex.close()
    ok = [x for n, x in FakePbUtils.made if n == "lazybatch_requests_total" and x.labels["outcome"] == "ok"]
    assert len(ok) == 1 and ok[0].value == 2


def test_fault_injection_parameter():
    names = ["a", "b", "c"]
    assert FaultInjector.parse("", names) is None
    f = FaultInjector.parse("stage=b,every=3", names)
    assert (f.stage, f.every, f.mode) == (1, 3, "sample")
    assert FaultInjector.parse("stage=2,every=1,mode=run", names).stage == 2
    for bad, needle in [("stage=z,every=2", "neither a stage name"), ("stage=1", "give stage"),
                        ("stage=1,every=0", "positive integer"), ("stage=1,every=2,mode=x", "sample or run"),
                        ("oops", "key=value")]:
        with pytest.raises(ConfigError, match=needle):
            FaultInjector.parse(bad, names)
    f.check(0, [2, 5])  # another stage: nothing
    with pytest.raises(RuntimeError, match="injected fault in stage 'b' for sample 2"):
        f.check(1, [0, 1, 2])


def test_production_parameters_in_config(tmp_path):
    extra = '''parameters { key: "max_queue_size" value { string_value: "64" } }
parameters { key: "timeout_action" value { string_value: "reject" } }
parameters { key: "metrics_interval_ms" value { string_value: "200" } }'''
    s = BackendSettings.from_config(parse_config_text(CONFIG + extra), tmp_path)
    assert (s.max_queue_size, s.timeout_action, s.metrics, s.metrics_interval_ms) == (64, "REJECT", True, 200.0)
    d = BackendSettings.from_config(parse_config_text(CONFIG), tmp_path)
    assert (d.max_queue_size, d.timeout_action, d.fault_injection) == (0, "DELAY", "")
    bad = CONFIG + 'parameters { key: "timeout_action" value { string_value: "drop" } }'
    small = CONFIG + 'parameters { key: "max_queue_size" value { string_value: "2" } }'
    with pytest.raises(ConfigError, match="max_queue_size 2 is below max_batch_size 4"):
        BackendSettings.from_config(parse_config_text(small), tmp_path)
    with pytest.raises(ConfigError, match="parameters.timeout_action.*REJECT or DELAY"):
        BackendSettings.from_config(parse_config_text(bad), tmp_path)


def _rt(stages, policy, **kw):
    runner = StageRunner(stages, execution_provider="cpu")
    table = runner.profile([1, 2, 4, 8], reps=1)
    c = Collector()
    metrics = M.ModelMetrics("m", [s.name for s in runner.manifest.stages], 8)
    rt = BackendRuntime(runner, table, parse_policy(policy).build(max_batch_size=8), c.respond,
                        is_cancelled=c.is_cancelled, cancel_poll_s=0.0, metrics=metrics, **kw)
    return rt, c, metrics


def _count(metrics, family, **labels):
    want = tuple(labels.items())
    return sum(s.value for s in metrics.collect() if s.family == family and all(l in s.labels for l in want))


def test_runtime_injected_fault_fails_only_poisoned_requests_and_keeps_serving(mlp):  # noqa: F811
    _, stages = mlp
    names = [f"stage_{i:03d}" for i in range(5)]
    rt, c, metrics = _rt(stages, "graph:20", fault=FaultInjector.parse("stage=2,every=4", names))
    for h in range(40):  # one sample each: scheduler ids 0..39, every 4th (3, 7, ...) is poisoned
        assert rt.submit(h, {"x": np.full((1, 16), h, np.float32)}, 1, RequestOptions()) is None
    c.wait(40)
    rt.close()
    assert all(len(a) == 1 for a in c.answers.values())
    failed = sorted(h for h, a in c.answers.items() if a[0][1] is Status.ERROR)
    assert failed == list(range(3, 40, 4))
    assert all("injected fault in stage 'stage_002'" in c.answers[h][0][2] for h in failed)
    assert all(c.answers[h][0][1] is Status.OK for h in range(40) if h not in failed)
    assert _count(metrics, "lazybatch_requests_total", outcome="error") == 10
    assert _count(metrics, "lazybatch_requests_total", outcome="ok") == 30
    assert _count(metrics, "lazybatch_stage_failures_total", stage="stage_002") >= 10


def test_a_fault_inside_a_span_is_counted_against_its_own_stage(mlp):  # noqa: F811
    """Eager runs stages 0-4 as one job where no boundary is used: a fault injected in stage 2 is still counted
    against stage 2, not against the span's first stage."""
    _, stages = mlp
    names = [f"stage_{i:03d}" for i in range(5)]
    rt, c, metrics = _rt(stages, "eager", fault=FaultInjector.parse("stage=2,every=4", names))
    for h in range(20):
        assert rt.submit(h, {"x": np.full((1, 16), h, np.float32)}, 1, RequestOptions()) is None
    c.wait(20)
    spans = rt.stats.span_runs
    rt.close()
    failed = sorted(h for h, a in c.answers.items() if a[0][1] is Status.ERROR)
    assert failed == list(range(3, 20, 4))
    assert spans > 0  # the case this test is about: jobs that span several stages
    assert _count(metrics, "lazybatch_stage_failures_total", stage="stage_002") >= len(failed)
    assert _count(metrics, "lazybatch_stage_failures_total", stage="stage_000") == 0


def test_runtime_rejects_when_the_queue_is_full_and_counts_it(mlp):  # noqa: F811
    _, stages = mlp
    rt, c, metrics = _rt(stages, "graph:300", queue_policy=QueuePolicy(max_queue_size=4))
    for h in range(4):  # 2 + 2 samples fill the queue while the 300 ms window waits
        rt.submit(h, {"x": np.ones((2 if h < 2 else 1, 16), np.float32)}, 2 if h < 2 else 1, RequestOptions())
    c.wait(4)
    rt.close()
    statuses = [c.answers[h][0][1] for h in range(4)]
    assert statuses == [Status.OK, Status.OK, Status.UNAVAILABLE, Status.UNAVAILABLE]
    assert "queue is full" in c.answers[2][0][2]
    assert _count(metrics, "lazybatch_rejected_total", reason="queue_full") == 2
    assert _count(metrics, "lazybatch_requests_total", outcome="rejected") == 2
    assert _count(metrics, "lazybatch_requests_total", outcome="unavailable") == 0
    assert _count(metrics, "lazybatch_stage_batch_size_count") == 5  # one batch of 4 samples through 5 stages


def test_repo_add_writes_the_admission_knobs(tmp_path, mlp):  # noqa: F811
    from lazybatch.backend.config_pbtxt import load_config
    from lazybatch.cli import main

    model, _ = mlp
    repo = tmp_path / "repo"
    assert main(["repo", "add", str(model), "--repository", str(repo), "--max-queue-size", "32",
                 "--timeout-action", "reject", "--max-batch-size", "4", "--profile-reps", "1"]) == 0
    cfg = load_config(repo / "mlp_eager" / "config.pbtxt")
    s = BackendSettings.from_config(cfg, repo / "mlp_eager" / "1")
    assert (s.max_queue_size, s.timeout_action) == (32, "REJECT")
    assert main(["repo", "add", str(model), "--repository", str(repo), "--max-queue-size", "-1", "--name", "x"]) == 2
    assert main(["repo", "add", str(model), "--repository", str(repo), "--max-queue-size", "2", "--name", "z"]) == 2
    assert main(["repo", "add", str(model), "--repository", str(repo), "--policy", "triton:0",
                 "--timeout-action", "REJECT", "--name", "y"]) == 2
