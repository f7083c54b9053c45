"""The backend's parts without a server: config parsing, request validation, the scheduler thread, the splitter.

The end-to-end tests (tests/triton/) run the same code inside a real tritonserver; these pin the edge cases that are
hard to provoke through one (an onnxruntime failure mid-batch, unloading with requests held).
"""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import onnxruntime as ort
import pytest

from lazybatch.backend.settings import BackendSettings
from lazybatch.backend.config_pbtxt import load_config, parse_config_text
from lazybatch.backend.request_parsing import parse_request_parameters, RequestOptions, validate_request
from lazybatch.backend.model import TritonPythonModel
from lazybatch.backend.runtime import BackendRuntime
from lazybatch.backend.stages import StageRunner
from lazybatch.formats.stage_manifest import TensorSpec, load_manifest
from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.policies import parse_policy
from lazybatch.batcher.request import Status
from lazybatch.cli import main
from lazybatch.repo import add_model
from lazybatch.staging import batchable_light_model, split_model
from tests.backendhelpers import relu_split_mlp

SPEC = [TensorSpec("x", np.dtype(np.float32), (4, -1))]


@pytest.mark.parametrize("tensors, needle", [
    ({}, "missing input"),
    ({"x": np.zeros((1, 4, 2), np.float32), "y": np.zeros(1)}, "unexpected input"),
    ({"x": np.zeros((1, 4, 2), np.float64)}, "dtype float64, expected float32"),
    ({"x": np.zeros((4, 2), np.float32)}, "expected [batch, 4, -1]"),
    ({"x": np.zeros((1, 3, 2), np.float32)}, "has shape [1, 3, 2]"),
    ({"x": np.zeros((0, 4, 2), np.float32)}, "at least 1"),
    ({"x": np.zeros((9, 4, 2), np.float32)}, "exceeds the model's max_batch_size 8"),
    ({"x": np.array([[[0, np.inf]] * 4], np.float32)}, "4 NaN/Inf"),
])
def test_validate_request_says_what_is_wrong(tensors, needle):
    batch, err = validate_request(tensors, SPEC, 8, allow_nan=False)
    assert batch == 0 and needle in err


def test_validate_request_accepts_good_and_wildcards():
    assert validate_request({"x": np.zeros((3, 4, 7), np.float32)}, SPEC, 8) == (3, None)
    # NaN/Inf pass by default, as in Triton's own backends (perf_analyzer's default random data holds them)
    assert validate_request({"x": np.full((1, 4, 1), np.nan, np.float32)}, SPEC, 8) == (1, None)
    assert validate_request({"x": np.full((1, 4, 1), np.inf, np.float32)}, SPEC, 8, allow_nan=True) == (1, None)


def test_request_parameters():
    opts, err = parse_request_parameters(None, 100)
    assert err is None and opts.sla_s == pytest.approx(0.1)
    opts, err = parse_request_parameters(json.dumps({"sla_ms": 20, "request_priority": 3, "other": "x"}), 100)
    assert err is None and opts.sla_s == pytest.approx(0.02) and opts.priority == 3
    opts, err = parse_request_parameters(json.dumps({"deadline_unix_ms": 5e12}), 100)
    assert err is None and opts.sla_s is None and opts.deadline_unix_s == 5e9
    for bad, needle in [({"sla_ms": 0}, "positive"), ({"sla_ms": "x"}, "positive"),
                        ({"sla_ms": 1, "deadline_unix_ms": 2}, "not both"), ({"request_priority": 1.5}, "integer")]:
        assert needle in parse_request_parameters(json.dumps(bad), None)[1]
    assert "not valid JSON" in parse_request_parameters("{", None)[1]
    assert "must be a JSON object" in parse_request_parameters("5", None)[1]  # once a TypeError, not an answer


def test_request_parameters_parsed_once_but_each_call_gets_its_own_options():
    """The same text is parsed once (it is on every request's path), and execute may still rewrite one request's
    options (its priority level) without touching the next request's."""
    text = json.dumps({"sla_ms": 30, "request_priority": 2})
    a, _ = parse_request_parameters(text, None)
    a.priority = 9
    b, err = parse_request_parameters(text, None)
    assert err is None and b is not a and b.priority == 2 and b.sla_s == pytest.approx(0.03)
    c, _ = parse_request_parameters(text, 500)  # another default SLA is another entry
    assert c.sla_s == pytest.approx(0.03)
    assert parse_request_parameters("{}", 500)[0].sla_s == pytest.approx(0.5)


CONFIG = '''
name: "m" backend: "python" max_batch_size: 4
input { name: "x" data_type: TYPE_FP32 dims: [ 16 ] }
output { name: "y" data_type: TYPE_FP32 dims: [ 8 ] }
parameters { key: "policy" value { string_value: "graph:5" } }
parameters { key: "sla_ms" value { string_value: "50" } }
'''


def test_settings_from_config(tmp_path):
    s = BackendSettings.from_config(parse_config_text(CONFIG), tmp_path / "1")
    assert (s.policy, s.sla_ms, s.max_batch_size, s.scheduler_max_batch_size) == ("graph:5", 50.0, 4, 4)
    assert s.stage_dir == tmp_path / "1" / "stages" and s.allow_nan  # NaN/Inf accepted unless allow_nan: false
    assert s.inputs == [TensorSpec("x", np.dtype(np.float32), (16,))]
    # one onnxruntime pool per model instance unless asked; cancellation paced by the stage times (auto)
    assert not s.use_per_session_threads and s.cancel_poll_ms == 0.0
    own = BackendSettings.from_config(parse_config_text(
        CONFIG + 'parameters { key: "use_per_session_threads" value { string_value: "true" } }'), tmp_path / "1")
    assert own.use_per_session_threads
    # one CPU arena per model instance unless asked (sessions/arena.py)
    assert s.use_env_allocators
    per = BackendSettings.from_config(parse_config_text(
        CONFIG + 'parameters { key: "use_env_allocators" value { string_value: "false" } }'), tmp_path / "1")
    assert not per.use_env_allocators


@pytest.mark.parametrize("extra, needle", [
    ('parameters { key: "polcy" value { string_value: "lazy" } }', "unknown parameters ['polcy']"),
    ('parameters { key: "allow_nan" value { string_value: "maybe" } }', "true or false"),
    ('parameters { key: "sla_ms" value { string_value: "-1" } }', "sla_ms"),
    ('parameters { key: "use_per_session_threads" value { string_value: "yes please" } }', "true or false"),
    ('parameters { key: "use_env_allocators" value { string_value: "shared" } }', "true or false"),
    ('parameters { key: "priority_levels" value { string_value: "3" } }', "default_priority_level must be in 1"),
    ('parameters { key: "default_priority_level" value { string_value: "1" } }', "needs priority_levels"),
])
def test_settings_errors(tmp_path, extra, needle):
    text = CONFIG.replace('parameters { key: "sla_ms" value { string_value: "50" } }', "") + extra
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        BackendSettings.from_config(parse_config_text(text), tmp_path)


def test_request_priority_levels(tmp_path):
    off = BackendSettings.from_config(parse_config_text(CONFIG), tmp_path / "1")
    assert off.request_level(7) == (0, None)  # no priority_levels: priorities are ignored, queues are FIFO
    text = CONFIG + ('parameters { key: "priority_levels" value { string_value: "3" } }\n'
                     'parameters { key: "default_priority_level" value { string_value: "2" } }')
    s = BackendSettings.from_config(parse_config_text(text), tmp_path / "1")
    assert [s.request_level(p)[0] for p in (0, 1, 2, 3)] == [2, 1, 2, 3]
    level, err = s.request_level(4)
    assert "request_priority 4 is outside 1..3" in err and "default level 2" in err


def test_config_parse_error_names_the_file(tmp_path):
    (tmp_path / "config.pbtxt").write_text("name: 'm' max_batch_size: banana")
    with pytest.raises(ConfigError, match="config.pbtxt"):
        load_config(tmp_path / "config.pbtxt")


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return relu_split_mlp(tmp_path_factory.mktemp("mlp"), depth=5)


def test_split_stages_compose_to_the_whole_graph(mlp):
    model, stages = mlp
    man = load_manifest(stages)
    assert len(man.stages) == 5
    assert any(i.source is not None and i.source < s.index - 1 for s in man.stages for i in s.inputs), \
        "the skip connection should feed a stage from an earlier, non-adjacent stage"
    x = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)
    ref = ort.InferenceSession(str(model)).run(None, {"x": x})[0]
    np.testing.assert_allclose(StageRunner(stages).run_all({"x": x})["y"], ref, rtol=1e-5, atol=1e-6)


def test_resnet50_batchable_and_split(tmp_path):
    model = batchable_light_model("resnet50", tmp_path / "resnet50.onnx")
    stages = split_model(model, tmp_path / "stages", max_stages=8)
    man = load_manifest(stages)
    assert len(man.stages) == 8 and man.inputs[0].dims == (3, 224, 224) and man.outputs[0].dims == (1000,)
    x = np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)
    sess = ort.InferenceSession(str(model))
    ref = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    assert ref.shape == (2, 1000) and np.isfinite(ref).all()
    got = StageRunner(stages).run_all({sess.get_inputs()[0].name: x})[man.outputs[0].name]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("manifest_edit, needle", [
    (lambda m: m.update(format="other/1"), "unsupported format"),
    (lambda m: m["stages"][1]["inputs"][0].update({"from": 3}), "not an earlier stage"),
    (lambda m: m["outputs"][0].update(name="nope"), "produced by no stage"),
])
def test_manifest_errors(mlp, tmp_path, manifest_edit, needle):
    _, stages = mlp
    data = json.loads((stages / "manifest.json").read_text())
    manifest_edit(data)
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=needle):
        load_manifest(tmp_path)


class Collector:
    """Stands in for Triton's response senders: records every answer per handle."""

    def __init__(self) -> None:
        self.answers: dict[int, list] = {}
        self.lock = threading.Lock()
        self.cancelled: set[int] = set()

    def respond(self, handle, outputs, status, error):
        with self.lock:
            self.answers.setdefault(handle, []).append((outputs, status, error))

    def is_cancelled(self, handle):
        return handle in self.cancelled

    def wait(self, n, timeout=30.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if len(self.answers) >= n:
                    return
            time.sleep(0.01)
        raise AssertionError(f"{len(self.answers)} of {n} answered")

    def wait_for(self, handles, timeout=30.0):
        """Until every one of ``handles`` is answered: a count would also count answers from before."""
        want = set(handles)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                missing = want - self.answers.keys()
            if not missing:
                return
            time.sleep(0.01)
        raise AssertionError(f"{len(missing)} of {len(want)} unanswered, e.g. {sorted(missing)[:5]}")


def _runtime(stages, policy="lazy", collector=None, mbs=8, whole_model=None, **kw):
    """A runtime built whole; ``whole_model``: with the verified whole graph of that model for its spans."""
    from lazybatch.backend.fusion import fuse

    runner = StageRunner(stages, execution_provider="cpu")
    table = runner.profile([1, 2, 4, 8], reps=1)
    c = collector or Collector()
    if whole_model is not None:
        got = fuse(runner, table, whole_model, execution_provider="cpu", intra_op_threads=0, name="t")
        assert got is not None
        kw["whole_runner"] = got[0]
    rt = BackendRuntime(runner, table, parse_policy(policy).build(max_batch_size=mbs), c.respond,
                        is_cancelled=c.is_cancelled, cancel_poll_s=0.0, **kw)
    return rt, c


@pytest.mark.parametrize("policy", ["eager", "eager:spans=false", "lazy", "oracle", "graph:1", "serial"])
def test_runtime_answers_each_request_once_with_its_result(mlp, policy):
    model, stages = mlp
    rt, c = _runtime(stages, policy)
    sess = ort.InferenceSession(str(model))
    xs = {}

    def producer(k):
        rng = np.random.default_rng(k)
        for j in range(10):
            h = k * 100 + j
            x = rng.standard_normal((int(rng.integers(1, 5)), 16)).astype(np.float32)
            xs[h] = x
            assert rt.submit(h, {"x": x}, x.shape[0], RequestOptions(sla_s=float(rng.choice([0.001, 0.05, 1])))) \
                is None

    threads = [threading.Thread(target=producer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c.wait(80)
    rt.close()
    assert sorted(c.answers) == sorted(xs)
    for h, ans in c.answers.items():
        assert len(ans) == 1
        outputs, status, error = ans[0]
        assert status is Status.OK, error
        np.testing.assert_allclose(outputs["y"], sess.run(None, {"x": xs[h]})[0], rtol=1e-5, atol=1e-6)
    assert rt.stats.samples == sum(x.shape[0] for x in xs.values())


def test_runtime_onnxruntime_failure_fails_only_that_request(mlp):
    _, stages = mlp
    rt, c = _runtime(stages, "graph:50")  # a window, so that good and bad requests share batches
    rt.submit("good1", {"x": np.ones((1, 16), np.float32)}, 1, RequestOptions())
    rt.submit("bad", {"x": np.ones((1, 15), np.float32)}, 1, RequestOptions())  # bypassed validation
    rt.submit("good2", {"x": np.ones((2, 16), np.float32)}, 2, RequestOptions())
    c.wait(3)
    rt.close()
    assert c.answers["good1"][0][1] is Status.OK and c.answers["good2"][0][1] is Status.OK
    assert c.answers["good2"][0][0]["y"].shape == (2, 8)
    bad = c.answers["bad"]
    assert len(bad) == 1 and bad[0][1] is Status.ERROR and "stage 'stage_000' failed" in bad[0][2]


def test_runtime_close_answers_everything_held_unavailable(mlp):
    _, stages = mlp
    rt, c = _runtime(stages, "graph:10000")  # a 10 s window and 6 < 8 samples: everything stays queued
    for h in range(3):
        rt.submit(h, {"x": np.ones((2, 16), np.float32)}, 2, RequestOptions())
    time.sleep(0.1)
    rt.close()
    assert sorted(c.answers) == list(range(3))
    assert all(len(a) == 1 and a[0][1] is Status.UNAVAILABLE and "unloaded" in a[0][2] for a in c.answers.values())
    assert rt.submit(9, {"x": np.ones((1, 16), np.float32)}, 1, RequestOptions()) == \
        "the model is shutting down; retry on another instance"


def test_runtime_shutdown_answers_groups_still_in_the_inbox(mlp):
    """Items the scheduler thread had not taken when it stopped (a group of one execute call, a cancellation wake-up
    behind the close) are answered UNAVAILABLE: nothing is lost, and a wake-up is no request."""
    from lazybatch.backend.rows import WAKE, Group, Parent

    _, stages = mlp
    rt, c = _runtime(stages)
    x = np.ones((1, 16), np.float32)
    with rt.route.lock:  # the thread stops at the first item and finds the others behind it
        rt.inbox.put(None)
        rt.inbox.put(WAKE)
        rt.inbox.put(Group([(Parent(h, {"x": x}, 1), RequestOptions(), time.monotonic()) for h in (7, 8)]))
    rt.loop.thread.join(10)
    assert not rt.loop.thread.is_alive()
    assert sorted(c.answers) == [7, 8]
    assert all(len(a) == 1 and a[0][1] is Status.UNAVAILABLE for a in c.answers.values())


def test_runtime_cancellation_while_queued(mlp):
    _, stages = mlp
    c = Collector()
    rt, _ = _runtime(stages, "graph:300", c)
    for h in range(3):
        rt.submit(h, {"x": np.ones((1, 16), np.float32)}, 1, RequestOptions())
    c.cancelled |= {0, 2}
    c.wait(3)
    rt.close()
    assert [c.answers[h][0][1] for h in range(3)] == [Status.CANCELLED, Status.OK, Status.CANCELLED]
    assert rt.stats.stage_runs == 5  # one batch of one request through 5 stages


def test_runtime_deadline_in_the_past_is_refused(mlp):
    _, stages = mlp
    rt, c = _runtime(stages)
    err = rt.submit(1, {"x": np.ones((1, 16), np.float32)}, 1, RequestOptions(deadline_unix_s=time.time() - 1))
    rt.close()
    assert "deadline passed" in err and not c.answers


def _model_dir(tmp_path, mlp, **kw):
    model, _ = mlp
    return add_model(model, tmp_path / "repo", name="m", max_batch_size=4, profile_reps=1, **kw)


def test_initialize_without_latency_table_says_how_to_get_one(tmp_path, mlp):
    mdir = _model_dir(tmp_path, mlp)
    (mdir / "1" / "latency.json").unlink()
    from google.protobuf import json_format

    cfg = load_config(mdir / "config.pbtxt")
    args = {"model_config": json_format.MessageToJson(cfg), "model_repository": str(mdir), "model_version": "1"}
    with pytest.raises(ConfigError, match="profile_on_load"):
        TritonPythonModel().initialize(args)
    cfg.parameters["profile_on_load"].string_value = "true"
    args["model_config"] = json_format.MessageToJson(cfg)
    m = TritonPythonModel()
    m.initialize(args)
    m.finalize()
    assert (mdir / "1" / "latency.json").exists()


def test_repo_add_cli(tmp_path, mlp, capsys):
    model, stages = mlp
    repo = tmp_path / "repo"
    assert main(["repo", "add", str(model), "--repository", str(repo), "--policy", "oracle", "--sla-ms", "80",
                 "--max-batch-size", "4", "--profile-reps", "1"]) == 0
    cfg = load_config(repo / "mlp_oracle" / "config.pbtxt")
    assert cfg.parameters["policy"].string_value == "oracle" and cfg.parameters["sla_ms"].string_value == "80"
    assert (repo / "mlp_oracle" / "1" / "model.py").read_text().count("import TritonPythonModel") == 1
    assert main(["repo", "add", str(model), "--repository", str(repo), "--policy", "oracle"]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert main(["repo", "add", str(model), "--repository", str(repo), "--policy", "triton:5000", "--name", "t"]) == 0
    cfg = load_config(repo / "t" / "config.pbtxt")
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 5000
    assert cfg.parameters["policy"].string_value == "whole_graph"
    assert main(["repo", "add", str(model), "--repository", str(repo), "--name", "small", "--max-batch-size", "8",
                 "--scheduler-max-batch-size", "2", "--profile-reps", "1"]) == 0
    small = load_config(repo / "small" / "config.pbtxt")  # the default policy, eager
    assert small.parameters["scheduler_max_batch_size"].string_value == "2"
    # eager: Triton's batcher in front with no delay (inline passes)
    assert small.HasField("dynamic_batching") and small.dynamic_batching.max_queue_delay_microseconds == 0
    oracle = load_config(repo / "mlp_oracle" / "config.pbtxt")  # the other policies keep their setup
    assert not oracle.HasField("dynamic_batching")
    assert main(["repo", "add", str(model), "--repository", str(repo), "--name", "big", "--max-batch-size", "4",
                 "--scheduler-max-batch-size", "9"]) == 2
    assert "scheduler_max_batch_size must be in 1..max_batch_size" in capsys.readouterr().err
    assert main(["repo", "add", str(model), "--repository", str(repo), "--policy", "fastest"]) == 2
    assert "unknown policy" in capsys.readouterr().err
    assert main(["repo", "add", str(tmp_path / "none.onnx"), "--repository", str(repo)]) == 2
    assert "no such ONNX file" in capsys.readouterr().err
    assert not (repo / "none_eager").exists()
    assert main(["repo", "add", "--stages", str(stages), "--repository", str(repo), "--name", "s",
                 "--profile-reps", "1", "--max-batch-size", "4"]) == 0
    assert load_manifest(repo / "s" / "1" / "stages").model == load_manifest(stages).model


def test_cancellation_is_asked_off_the_scheduler_thread_and_answered_at_once(mlp):
    """is_cancelled() is a round trip to the server: the watcher thread asks it, never the scheduler thread, and a
    request cancelled while others run is answered without waiting for its turn; the others are served."""
    _, stages = mlp
    threads: set[str] = set()
    c = Collector()

    def is_cancelled(h):
        threads.add(threading.current_thread().name)
        return c.is_cancelled(h)

    rt, _ = _runtime(stages, "graph:300", collector=c)  # a 300 ms window: the requests wait, queued
    rt.watcher.is_cancelled = is_cancelled
    for h in range(3):
        rt.submit(h, {"x": np.ones((1, 16), np.float32)}, 1, RequestOptions())
    t0 = time.monotonic()
    c.cancelled.add(1)
    c.wait(1, timeout=5)
    answered_after = time.monotonic() - t0
    c.wait(3)
    rt.close()
    assert c.answers[1] == [(None, Status.CANCELLED, "request was cancelled by the client")]
    assert answered_after < 0.25, "the cancelled request waited for the batching window"
    assert c.answers[0][0][1] is Status.OK and c.answers[2][0][1] is Status.OK
    assert threads and all(name.endswith("cancel-watch") for name in threads), threads
    assert rt.watcher.checks > 0


@pytest.mark.parametrize("factor, expect_above", [(0.05, True), (50.0, False)])
def test_runtime_recalibrates_the_table_the_policy_reads(mlp, factor, expect_above, monkeypatch):
    """The stage runs the server observes rewrite the policy's latency table per stage and batch size
    (batcher/calibration.py), and the policy recomputes its slack predictor from it. (Rewrites are rate-limited
    in time, RECALIBRATE_INTERVAL_S: off here, where 80 requests take a fraction of it.)"""
    from lazybatch.backend import table_keeper as keeper_module
    from lazybatch.batcher.latency_table import LatencyTable

    monkeypatch.setattr(keeper_module, "RECALIBRATE_INTERVAL_S", 0.0)

    _, stages = mlp
    runner = StageRunner(stages, execution_provider="cpu")
    measured = runner.profile([1, 2, 4, 8], reps=1)
    table = LatencyTable(measured.graph, measured.batch_sizes, [[v * factor for v in row] for row in measured.measured])
    before = sum(table.single)
    policy = parse_policy("lazy").build(max_batch_size=8)
    c = Collector()
    rt = BackendRuntime(runner, table, policy, c.respond)
    predicted_before = policy.predictor.single_input_exec_time(1)
    x = np.ones((1, 16), np.float32)
    for h in range(80):
        assert rt.submit(h, {"x": x}, 1, RequestOptions(sla_s=1.0)) is None
    c.wait(80)
    rt.close()
    assert rt.calibrator.version >= 1 and policy.table is table
    after = sum(table.single)
    if expect_above:  # the table said 20x faster than the stages ran: it now says slower
        assert after > 3.0 * before and rt.stats.time_scale > 3.0
        assert policy.predictor.single_input_exec_time(1) > 3.0 * predicted_before
    else:  # the table said 50x slower: it comes down
        assert after < 0.8 * before and rt.stats.time_scale < 0.8
        assert policy.predictor.single_input_exec_time(1) < 0.8 * predicted_before


@pytest.mark.parametrize("whole", [False, True])
def test_runtime_runs_spans_of_stages_with_the_stages_result(mlp, whole):
    """eager asks for spans of stages (StageJob.stop): the runtime runs them chained, or as the verified whole graph
    when it holds one; every answer is still the whole graph's result, and spans really ran."""
    model, stages = mlp
    rt, c = _runtime(stages, "eager", whole_model=model if whole else None)
    sess = ort.InferenceSession(str(model))
    xs = {}
    for h in range(12):
        x = np.random.default_rng(h).standard_normal((1 + h % 3, 16)).astype(np.float32)
        xs[h] = x
        assert rt.submit(h, {"x": x}, x.shape[0], RequestOptions(sla_s=1.0)) is None
        time.sleep(0.01)  # apart: each runs alone, as one span
    c.wait(12)
    rt.close()
    for h, ans in c.answers.items():
        outputs, status, error = ans[0]
        assert status is Status.OK, error
        np.testing.assert_allclose(outputs["y"], sess.run(None, {"x": xs[h]})[0], rtol=1e-5, atol=1e-6)
    assert rt.stats.span_runs > 0
    assert rt.stats.host_per_job_s > 0.0 and rt.policy.boundary_cost == rt.stats.host_per_job_s
    if whole:  # what cutting a whole pass loses: measured once, at most 1
        from lazybatch.backend.fusion import measure_fused_ratio

        assert 0.0 < measure_fused_ratio(rt.runner, rt.whole_runner, reps=3) <= 1.0


def test_cancel_watcher_asks_a_bounded_number_per_sweep_in_turn():
    """Each ask is a message to the Triton process: a sweep asks at most ``budget`` held requests, and the next
    sweep goes on where it stopped, so every held request is asked in turn."""
    from lazybatch.backend.cancel_watch import CancelWatcher
    from lazybatch.backend.rows import Parent

    parents = [Parent(h, {}, 1) for h in range(40)]
    for p in parents:
        p.checked = -1e9  # never asked
    asked: list[int] = []
    w = CancelWatcher(lambda: parents, lambda h: asked.append(h) or False, lambda p: None, interval=3600.0)
    try:
        w.budget = 16
        w.sweep()
        assert asked == list(range(16))
        w.sweep()
        assert asked[16:] == list(range(16, 32))
    finally:
        w.close()


def _inline_runtime(mlp, on_idle=None, **kw):
    model, stages = mlp
    return _runtime(stages, "eager", whole_model=model, on_idle=on_idle, inline=True, **kw)


def test_inline_pass_gives_the_whole_graphs_result_and_is_counted(mlp):
    """A group that finds the scheduler idle, where eager would run it whole anyway, runs on the caller's thread
    (Triton's execute): each request gets its own rows of the whole graph's result; the policy counts the arrivals,
    the table is recalibrated, and the statistics hook still runs (the scheduler thread looks in on its own)."""
    model, _ = mlp
    idle_calls: list[int] = []
    rt, c = _inline_runtime(mlp, on_idle=lambda r: idle_calls.append(r.stats.inline_requests))
    sess = ort.InferenceSession(str(model))
    try:
        xs = [np.random.default_rng(k).standard_normal((1 + k % 2, 16)).astype(np.float32) for k in range(3)]
        outs = rt.route.run([(({"x": x}), x.shape[0]) for x in xs])
        assert outs is not None and len(outs) == 3
        for x, out in zip(xs, outs):
            np.testing.assert_allclose(out["y"], sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
        stats = rt.settled_stats()  # the pass's counters are the scheduler thread's to apply (apply_deferred)
        assert stats.inline_runs == 1 and stats.inline_requests == 3 and stats.samples == 4
        assert stats.batch_hist == {4: 1}
        assert rt.policy.rate(time.monotonic()) > 0.0  # the policy saw the arrivals
        assert c.answers == {}  # answered by the caller, not through respond
        deadline = time.monotonic() + 5.0
        while not idle_calls or idle_calls[-1] < 3:
            assert time.monotonic() < deadline, f"the idle hook did not run after the inline pass: {idle_calls}"
            time.sleep(0.02)
    finally:
        rt.close()


def test_idle_runtime_with_inline_passes_does_not_poll(mlp):
    """An idle model must cost next to nothing: the scheduler thread of a runtime with inline passes on looks in
    once an idle-hook interval (for statistics an inline pass may owe), not every millisecond (it did: 25 ms of CPU
    a second in each idle eager stub, taken from the cores onnxruntime uses)."""
    rt, _ = _inline_runtime(mlp, on_idle=lambda r: None)
    wakes = []
    take = rt.take_inputs
    rt.take_inputs = lambda timeout: (wakes.append(timeout), take(timeout))[1]
    try:
        x = np.ones((1, 16), np.float32)
        assert rt.route.run([({"x": x}, 1)]) is not None  # owes the hook once
        time.sleep(1.0)
    finally:
        rt.close()
    # one look-in per IDLE_HOOK_INTERVAL_S (0.1 s) and the hook the pass owed: about 11 in a second
    assert len(wakes) <= 25, f"{len(wakes)} wake-ups in an idle second"


def test_inline_pass_waits_out_the_scheduler_threads_bookkeeping(mlp):
    """The scheduler thread holds its lock for the idle hook (statistics file, metrics, memory given back) with no
    job: a group that comes meanwhile waits the few ms and runs inline, instead of going to the scheduler (it
    waited 2 ms and went; 4-7 groups a probe cell at 200% load on MobileNet)."""
    rt, _ = _inline_runtime(mlp)
    try:
        x = np.ones((1, 16), np.float32)
        held = threading.Event()

        def bookkeeping() -> None:
            with rt.route.lock:
                held.set()
                time.sleep(0.02)

        t = threading.Thread(target=bookkeeping)
        t.start()
        held.wait(5)
        assert rt.route.run([({"x": x}, 1)]) is not None
        t.join()
        assert rt.settled_stats().inline_runs == 1 and not rt.stats.inline_refused
    finally:
        rt.close()


def test_inline_pass_is_refused_while_the_scheduler_holds_work_or_too_large(mlp):
    """Inline only where it is what eager would do: not beside requests the scheduler holds (they would be
    overtaken), not for more than the batch limit, not when turned off; the caller then submits them."""
    rt, c = _inline_runtime(mlp)
    try:
        x = np.ones((1, 16), np.float32)
        assert rt.route.run([({"x": np.ones((9, 16), np.float32)}, 9)]) is None  # above max_batch_size 8
        rt.live[1] = object()  # the scheduler holds a request
        assert rt.route.run([({"x": x}, 1)]) is None
        rt.live.clear()
        rt.inline = False
        assert rt.route.run([({"x": x}, 1)]) is None
        rt.inline = True
        assert rt.route.run([({"x": x}, 1)]) is not None
        assert rt.settled_stats().inline_runs == 1
    finally:
        rt.close()


def test_group_that_could_only_follow_a_whole_pass_waits_for_it_then_runs_inline(mlp):
    """Past capacity every group used to find the previous one still held and go to the scheduler, for good. Now a
    group that finds the scheduler running a whole pass it could only follow waits in execute for that pass, then
    runs inline (Triton queues what arrives meanwhile); the request the scheduler held is answered first."""
    rt, c = _inline_runtime(mlp)
    try:
        pol = rt.policy
        for row in pol.table.dense:  # 8 stages of 10 ms in the table: the wait's bound is about twice the pass
            row[1:] = [10e-3] * (len(row) - 1)
        pol.table_changed()
        whole = rt.whole_runner
        run = whole.run
        calls: list[str] = []

        def slow_first(*a, **kw):  # the scheduler's pass takes 40 ms, the inline one runs as it is
            calls.append(threading.current_thread().name)
            if len(calls) == 1:
                time.sleep(0.04)
            return run(*a, **kw)

        whole.run = slow_first
        x = np.ones((1, 16), np.float32)
        assert rt.submit("held", {"x": x}, 1, RequestOptions()) is None
        end = time.monotonic() + 5.0
        while rt.running is None:
            assert time.monotonic() < end, "the scheduler did not start the pass"
            time.sleep(0.001)
        assert (rt.running.stage, rt.running.stop) == (0, rt.runner.n_stages)
        outs = rt.route.run([({"x": x}, 1)])
        assert outs is not None, rt.stats.inline_refused
        assert "held" in c.answers  # answered by the scheduler before the group ran
        assert rt.stats.inline_waits == 1 and rt.settled_stats().inline_runs == 1
        assert calls[1] == threading.current_thread().name  # the group ran on the caller's thread (execute)
        np.testing.assert_allclose(outs[0]["y"], c.answers["held"][0][0]["y"], rtol=1e-6)
    finally:
        rt.close()


def test_eager_keeps_boundaries_when_arrivals_come_mid_pass(mlp):
    """Under traffic that arrives while passes run (back to back), and with boundaries that are free, eager wants
    decision points inside the pass: the pass is then not run inline but by the scheduler."""
    rt, c = _inline_runtime(mlp)
    try:
        pol = rt.policy
        pol.measured_costs(boundary_s=0.0, fused_ratio=1.0)
        # A fixed table, not the profile's: whether a boundary pays depends on the stages' shares of the pass (a
        # profile of these ~10 us stages put 26% of the pass in stage 0 on one machine, and the gain of a boundary
        # after it fell below min_gain). Here stage 0 is short and batching free: the gain at boundary 1 is ~11%.
        for s, row in enumerate(pol.table.dense):
            row[1:] = [2e-6 if s == 0 else 10e-6] * (len(row) - 1)
        pol.table_changed()
        now = time.monotonic()
        whole = pol.whole[1]
        t = now - 200 * whole
        for _ in range(150):  # passes back to back, 3 arrivals handed to each
            pol.inline_done(t, t + whole, 3)
            t += whole + 1e-5
        assert pol.busy_rate(t) > 0.0
        assert pol.inline_batch(t, 1) == 0
        pol.rates.busy_arrivals.clear()
        pol.rates.arrivals.clear()
        assert pol.inline_batch(t + 10.0, 1) == 1  # nothing arrives mid-pass: no boundary can pay
    finally:
        rt.close()


def test_statistics_follow_inline_passes_after_the_first_write(mlp):
    """The statistics hook is rate-limited (IDLE_HOOK_INTERVAL_S); passes run after a write must still reach it."""
    seen: list[int] = []
    rt, c = _inline_runtime(mlp, on_idle=lambda r: seen.append(r.stats.inline_runs))
    try:
        x = np.ones((1, 16), np.float32)
        for k in range(3):
            assert rt.route.run([({"x": x}, 1)]) is not None
            deadline = time.monotonic() + 5.0
            while not seen or seen[-1] < k + 1:
                assert time.monotonic() < deadline, f"pass {k + 1} never reached the statistics: {seen}"
                time.sleep(0.02)
    finally:
        rt.close()


def test_the_idle_hook_tallies_the_inline_passes_without_the_lock(mlp, monkeypatch):
    """The scheduler thread's look-in takes the inline passes' rows under the lock the passes take, tallies them
    (counters, metrics) without it, and takes it again only to calibrate the table: a request that comes meanwhile
    runs at once instead of waiting for the tally (0.3 ms of every 0.1 s on a fast model at 90% load, served)."""
    from lazybatch.backend import runtime_hooks as runtime_mod

    rt, _ = _inline_runtime(mlp)
    seen: list[tuple[bool, str]] = []  # (the lock held, the thread) at each tally
    tally = runtime_mod.tally
    monkeypatch.setattr(runtime_mod, "tally", lambda rows, r, stats: (
        seen.append((rt.busy.locked(), threading.current_thread().name)), tally(rows, r, stats))[1])
    try:
        x = np.ones((1, 16), np.float32)
        for _ in range(5):
            assert rt.route.run_one({"x": x}, 1, RequestOptions()) is not None
        deadline = time.monotonic() + 5.0
        while not seen:
            assert time.monotonic() < deadline, "the scheduler thread never tallied the inline passes"
            time.sleep(0.01)
        assert seen[0] == (False, rt.loop.thread.name)
        assert rt.settled_stats().inline_requests == 5 and rt.stats.answered == {"OK": 5}
    finally:
        rt.close()


def test_statistics_file_and_memory_release_wait_for_a_quiet_moment(mlp):
    """Under steady load the statistics file (on_idle) and the memory release wait until nothing has run for
    QUIET_S (the file at most STATS_MAX_AGE_S late): written at every idle hook, the file cost eager 0.8 ms of CPU
    ten times a second beside its passes, which Triton's own path never pays. The metrics' idle hook keeps its
    interval meanwhile."""
    from lazybatch.backend import scheduler_loop

    writes: list[float] = []
    # memory under endless load at the latest after 4 x 0.3 s: longer than the load below
    rt, _ = _inline_runtime(mlp, on_idle=lambda r: writes.append(time.monotonic()), memory_release_s=0.3)
    hooks: list[float] = []
    idle_hook = rt.idle_hook
    rt.idle_hook = lambda: (hooks.append(time.monotonic()), idle_hook())[1]
    try:
        x = np.ones((1, 16), np.float32)
        assert rt.route.run([({"x": x}, 1)]) is not None
        deadline = time.monotonic() + 5.0
        while not writes:
            assert time.monotonic() < deadline, "the first pass never reached the statistics file"
            time.sleep(0.01)
        released = rt.stats.memory_releases
        start = time.monotonic()
        while time.monotonic() - start < 0.8:  # passes 20 ms apart: never QUIET_S without one
            assert rt.route.run([({"x": x}, 1)]) is not None
            time.sleep(0.02)
        end = time.monotonic()
        during = [t for t in writes if start + 0.05 < t < end]
        assert during == [], f"statistics written {len(during)} times under steady load"
        assert rt.stats.memory_releases == released, "memory given back under steady load"
        assert len([t for t in hooks if start < t < end]) >= 4, "the metrics' idle hook stopped under load"
        deadline = end + 5.0
        while not writes or writes[-1] < end:
            assert time.monotonic() < deadline, "the statistics file was not written once the load stopped"
            time.sleep(0.01)
        # at the quiet moment (QUIET_S after the last pass, plus the scheduler's wake-up), not by the file's age:
        # that write would come STATS_MAX_AGE_S after the last one, before the load began, at end + 1.2 s or later.
        # QUIET_S + 0.2 s was too tight on a loaded 2-core VM (a CI run read 0.77 s)
        assert writes[-1] - end < scheduler_loop.STATS_MAX_AGE_S / 2
        while rt.stats.memory_releases == released:  # the heap is trimmed just after the file, without the lock
            assert time.monotonic() < deadline, "memory not given back at the quiet moment"
            time.sleep(0.01)
        assert rt.stats.memory_releases == released + 1
    finally:
        rt.close()


def test_statistics_and_memory_under_endless_load(mlp, monkeypatch):
    """A load that never pauses still gets its statistics file at most STATS_MAX_AGE_S late, and its memory given
    back every MEMORY_RELEASE_UNDER_LOAD release intervals (a burst's high-water mark is not kept for good)."""
    from lazybatch.backend import scheduler_loop

    monkeypatch.setattr(scheduler_loop, "STATS_MAX_AGE_S", 0.3)
    writes: list[float] = []
    rt, _ = _inline_runtime(mlp, on_idle=lambda r: writes.append(time.monotonic()),
                            memory_release_s=0.1)  # at the latest every 0.4 s under load
    released = rt.stats.memory_releases
    try:
        x = np.ones((1, 16), np.float32)
        start = time.monotonic()
        while time.monotonic() - start < 1.5:
            assert rt.route.run([({"x": x}, 1)]) is not None
            time.sleep(0.02)
        during = [t for t in writes if start < t < time.monotonic()]
        assert 2 <= len(during) <= 8, f"{len(during)} writes in 1.5 s of load with a 0.3 s maximum age"
        assert 1 <= rt.stats.memory_releases - released <= 4, rt.stats.memory_releases - released
    finally:
        rt.close()


def test_table_rewrites_are_rate_limited_and_none_is_lost(mlp):
    """A rewrite of the table (and of what the policy derives from it) costs a pass over every stage and batch size:
    the runtime does it at most once per RECALIBRATE_INTERVAL_S however many runs ask for it, and a rewrite owed
    when the interval ends is done at the next run."""
    from lazybatch.backend import table_keeper as keeper_module
    from lazybatch.batcher.latency_table import LatencyTable

    _, stages = mlp
    runner = StageRunner(stages, execution_provider="cpu")
    measured = runner.profile([1, 2, 4, 8], reps=1)
    table = LatencyTable(measured.graph, measured.batch_sizes, [[v * 0.01 for v in row] for row in measured.measured])
    policy = parse_policy("lazy").build(max_batch_size=8)
    c = Collector()
    rt = BackendRuntime(runner, table, policy, c.respond)
    try:
        x = np.ones((1, 16), np.float32)
        for h in range(40):
            assert rt.submit(h, {"x": x}, 1, RequestOptions(sla_s=1.0)) is None
        c.wait(40)
        first = rt.calibrator.version
        assert first == 1, "one rewrite within the interval, however many were due"
        assert rt.keeper.owed
        time.sleep(keeper_module.RECALIBRATE_INTERVAL_S + 0.05)
        assert rt.submit(99, {"x": x}, 1, RequestOptions(sla_s=1.0)) is None
        c.wait(41)
        assert rt.calibrator.version == 2
    finally:
        rt.close()


def test_inline_group_served_in_smaller_passes_answers_early_ones_at_once(mlp):
    """Where eager serves a group in passes of k one after the other (no batching gain, light load), the requests
    of every pass but the last are handed to ``early`` as their pass ends, in order, and the list holds the rest;
    every request gets the whole graph's result exactly once."""
    model, _ = mlp
    rt, c = _inline_runtime(mlp)
    sess = ort.InferenceSession(str(model))
    try:
        rt.policy.inline_batch = lambda now, n, classes=None: 2  # the device-idle rule's choice, fixed for the test
        xs = [np.random.default_rng(k).standard_normal((1, 16)).astype(np.float32) for k in range(5)]
        early: list[int] = []
        got: dict[int, dict] = {}

        def on_early(i, out):
            early.append(i)
            got[i] = out

        outs = rt.route.run([({"x": x}, 1) for x in xs], on_early)
        assert outs is not None
        assert early == [0, 1, 2, 3]  # passes {0,1}, {2,3}, then {4} returned with the end of the call
        assert [o is None for o in outs] == [True, True, True, True, False]
        got[4] = outs[4]
        for i, x in enumerate(xs):
            np.testing.assert_allclose(got[i]["y"], sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
        stats = rt.settled_stats()
        assert stats.inline_runs == 3 and stats.batch_hist == {2: 2, 1: 1}
        # without an ``early`` to send them, a group that would need several passes goes to the scheduler
        assert rt.route.run([({"x": x}, 1) for x in xs]) is None
    finally:
        rt.close()


def test_a_lone_inline_request_gets_what_the_general_route_gives_it(mlp):
    """``run_one``, the lone request's straight line, answers and counts as ``run`` does: the whole graph's result,
    one pass in the statistics, an onnxruntime failure as its message; and where the scheduler holds work it takes
    ``run``'s way (the request then goes to the scheduler: None)."""
    model, _ = mlp
    rt, c = _inline_runtime(mlp)
    sess = ort.InferenceSession(str(model))
    general = []  # the requests run_one handed to the general route (run)
    one_by_run = rt.route._one_by_run
    rt.route._one_by_run = lambda *a: general.append(a) or one_by_run(*a)
    try:
        x = np.random.default_rng(3).standard_normal((2, 16)).astype(np.float32)
        out = rt.route.run_one({"x": x}, 2, RequestOptions())
        assert isinstance(out, dict)
        np.testing.assert_allclose(out["y"], sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
        bad = rt.route.run_one({"x": np.ones((1, 15), np.float32)}, 1, RequestOptions())
        assert isinstance(bad, str) and bad
        stats = rt.settled_stats()
        assert stats.inline_runs == 2 and stats.inline_requests == 2 and stats.samples == 3
        assert stats.answered == {"OK": 1, "ERROR": 1} and stats.batch_hist == {2: 1, 1: 1}
        assert not general, "a lone request on a solo route left the straight line"
        rt.scheduler.outstanding += 1  # as if the scheduler held a request: a lone one goes to it, not beside it
        try:
            assert rt.route.run_one({"x": x[:1]}, 1, RequestOptions()) is None
        finally:
            rt.scheduler.outstanding -= 1
        assert len(general) == 1
        assert rt.settled_stats().inline_refused == {"scheduler busy": 1}
    finally:
        rt.close()


def test_a_group_that_finds_the_scheduler_idle_is_one_pass_on_the_straight_line(mlp):
    """``run_group``, the straight line of a group Triton handed over together: one whole pass of every sample, each
    request its own rows of it, counted as one pass; a request that fails alone gets its error and the others their
    results; and where the scheduler holds work the group takes ``run``'s way (to the scheduler: None)."""
    model, _ = mlp
    rt, c = _inline_runtime(mlp)
    sess = ort.InferenceSession(str(model))
    general = []  # the groups run_group handed to the general route (run)
    run = rt.route.run
    rt.route.run = lambda *a: general.append(a) or run(*a)
    try:
        xs = [np.random.default_rng(k).standard_normal((b, 16)).astype(np.float32) for k, b in enumerate((2, 1, 1))]
        outs = rt.route.run_group([({"x": x}, x.shape[0]) for x in xs], lambda i, out: None, [RequestOptions()] * 3)
        assert outs is not None and len(outs) == 3
        for x, out in zip(xs, outs):
            np.testing.assert_allclose(out["y"], sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
        stats = rt.settled_stats()
        assert stats.inline_runs == 1 and stats.inline_requests == 3 and stats.batch_hist == {4: 1}
        assert not general, "a group on a solo route left the straight line"
        bad = rt.route.run_group([({"x": xs[1]}, 1), ({"x": np.ones((1, 15), np.float32)}, 1)],
                                 lambda i, out: None, [RequestOptions()] * 2)
        assert isinstance(bad[0], dict) and isinstance(bad[1], str) and bad[1]
        assert rt.settled_stats().answered == {"OK": 4, "ERROR": 1}
        rt.scheduler.outstanding += 1  # as if the scheduler held a request: the group goes to it, not beside it
        try:
            assert rt.route.run_group([({"x": xs[1]}, 1)] * 2, lambda i, out: None, [RequestOptions()] * 2) is None
        finally:
            rt.scheduler.outstanding -= 1
        assert len(general) == 1
    finally:
        rt.close()


def test_inline_batch_that_fails_fails_only_the_request_that_fails_alone(mlp):
    """An onnxruntime failure in an inline pass: each request is rerun alone, and only the one that fails on its
    own gets the error (a message, not an exception out of Triton's execute); the others get their results."""
    model, _ = mlp
    rt, c = _inline_runtime(mlp)
    try:
        good = np.ones((1, 16), np.float32)
        bad = np.ones((1, 15), np.float32)  # wrong width: the batch cannot even be joined, and onnxruntime refuses it
        outs = rt.route.run([({"x": good}, 1), ({"x": bad}, 1), ({"x": good}, 1)])
        assert outs is not None
        assert isinstance(outs[1], str) and outs[1], outs[1]
        assert outs[0]["y"].shape == (1, 8) and outs[2]["y"].shape == (1, 8)
        assert rt.settled_stats().answered == {"OK": 2, "ERROR": 1}
    finally:
        rt.close()

