"""fuse_stages: where lazy's batch cap is 1 the backend runs whole passes (backend/fusion.py), with the same results."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import onnxruntime as ort
import pytest

from lazybatch.backend.config import BackendSettings, RequestOptions, parse_config_text
from lazybatch.backend.fusion import FUSED_STAGE, fuse, fuse_reason, fused_table
from lazybatch.backend.runtime import BackendRuntime
from lazybatch.backend.stages import StageRunner
from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.graph import ModelGraph, StageType
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.policies import parse_policy
from lazybatch.batcher.request import Status
from lazybatch.repo import add_model
from lazybatch.staging import make_mlp, split_model
from tests.backendhelpers import initialize_model

SIZES = [1, 2, 4]


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuse")
    model = make_mlp(root / "mlp.onnx", in_dim=16, width=32, depth=4, out_dim=8)
    other = make_mlp(root / "other.onnx", in_dim=16, width=32, depth=4, out_dim=8, seed=9)
    stages = split_model(model, root / "stages", max_stages=4)
    return model, other, stages


def _table(runner: StageRunner, per_extra: float) -> LatencyTable:
    """Each stage 1 ms at batch 1 plus ``per_extra`` ms per further sample: 0.95 is a model with no batching gain
    (ResNet-50 on a CPU), 0.1 one where batching pays."""
    rows = [[1e-3 * (1 + per_extra * (b - 1)) for b in SIZES] for _ in range(runner.n_stages)]
    return LatencyTable(runner.manifest.graph(), SIZES, rows)


def test_fuse_reason_follows_the_batch_cap_and_the_mode(mlp):
    runner = StageRunner(mlp[2], execution_provider="cpu")
    flat, steep = _table(runner, 0.95), _table(runner, 0.1)
    lazy = parse_policy("lazy").build(max_batch_size=4)
    assert "batch cap is 1" in fuse_reason("auto", lazy, flat)
    assert fuse_reason("auto", lazy, steep) is None  # batching pays: the boundaries are where lazy works
    assert fuse_reason("auto", parse_policy("oracle").build(max_batch_size=4), flat) is not None
    assert fuse_reason("auto", parse_policy("lazy:min_batch_gain=0").build(max_batch_size=4), flat) is None
    serial = parse_policy("serial").build()
    assert fuse_reason("auto", serial, flat) is None  # the layer-wise baseline stays layer-wise
    assert fuse_reason("true", serial, steep) == "fuse_stages: true"
    assert fuse_reason("false", lazy, flat) is None


def test_fused_table_sums_the_stages(mlp):
    runner = StageRunner(mlp[2], execution_provider="cpu")
    table = _table(runner, 0.5)
    fused = fused_table(table)
    assert fused.graph.n == 1 and fused.graph.stages[0].name == FUSED_STAGE
    for b in SIZES:
        assert fused.dense[0][b] == pytest.approx(sum(table.dense[s][b] for s in range(runner.n_stages)))
    assert fused.meta["fused_from_stages"] == runner.n_stages


def test_fused_runner_gives_the_stages_result(mlp):
    model, _, stages = mlp
    runner = StageRunner(stages, execution_provider="cpu")
    fused, table = fuse(runner, _table(runner, 0.95), model, execution_provider="cpu", intra_op_threads=1, name="m")
    assert fused.n_stages == 1 and table.graph.n == 1
    x = np.random.default_rng(3).standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_allclose(fused.run_all({"x": x})["y"], runner.run_all({"x": x})["y"], rtol=1e-5, atol=1e-6)


def test_a_whole_graph_that_differs_from_the_stages_is_not_used(mlp, capsys):
    _, other, stages = mlp
    runner = StageRunner(stages, execution_provider="cpu")
    assert fuse(runner, _table(runner, 0.95), other, execution_provider="cpu", intra_op_threads=1, name="m") is None
    assert "does not give the stages' result" in capsys.readouterr().err
    import onnx  # the same graph with a fixed batch dimension of 1: it cannot serve batches
    fixed = onnx.load(str(mlp[0]))
    for v in (*fixed.graph.input, *fixed.graph.output):
        v.type.tensor_type.shape.dim[0].dim_value = 1
    onnx.save(fixed, str(stages.parent / "fixed.onnx"))
    assert fuse(runner, _table(runner, 0.95), stages.parent / "fixed.onnx", execution_provider="cpu",
                intra_op_threads=1, name="m") is None
    assert "cannot stand in for the stages" in capsys.readouterr().err
    missing = stages / "nope.onnx"
    assert fuse(runner, _table(runner, 0.95), missing, execution_provider="cpu", intra_op_threads=1, name="m") is None
    assert "serving stage by stage" in capsys.readouterr().err


class _Collector:
    def __init__(self) -> None:
        self.answers: dict[int, list] = {}
        self.lock = threading.Lock()

    def respond(self, handle, outputs, status, error):
        with self.lock:
            self.answers.setdefault(handle, []).append((outputs, status, error))


def test_fused_runtime_answers_every_request_with_its_result(mlp):
    """Lazy over the fused runner: one stage run per batch, each request answered once with the whole graph's result."""
    model, _, stages = mlp
    runner = StageRunner(stages, execution_provider="cpu")
    fused, table = fuse(runner, _table(runner, 0.95), model, execution_provider="cpu", intra_op_threads=1, name="m")
    c = _Collector()
    rt = BackendRuntime(fused, table, parse_policy("lazy").build(max_batch_size=4), c.respond)
    rng = np.random.default_rng(0)
    xs = {h: rng.standard_normal((int(rng.integers(1, 4)), 16)).astype(np.float32) for h in range(30)}
    for h, x in xs.items():
        assert rt.submit(h, {"x": x}, x.shape[0], RequestOptions(sla_s=5.0)) is None
    end = time.monotonic() + 30
    while len(c.answers) < len(xs) and time.monotonic() < end:
        time.sleep(0.01)
    rt.close()
    sess = ort.InferenceSession(str(model))
    assert sorted(c.answers) == sorted(xs)
    for h, ans in c.answers.items():
        assert len(ans) == 1 and ans[0][1] is Status.OK, ans
        np.testing.assert_allclose(ans[0][0]["y"], sess.run(None, {"x": xs[h]})[0], rtol=1e-5, atol=1e-6)
    assert rt.stats.stage_runs == sum(rt.stats.batch_hist.values()) and set(rt.stats.batch_hist) == {1}


@pytest.mark.parametrize("policy, mode, fused", [("lazy", "auto", True), ("lazy", "false", False),
                                                 ("serial", "auto", False), ("serial", "true", True)])
def test_model_fuses_where_the_table_shows_no_gain(tmp_path, mlp, policy, mode, fused):
    model, _, _ = mlp
    mdir = add_model(model, tmp_path / "repo", name="m", policy=policy, max_batch_size=4, max_stages=4,
                     profile_reps=1, execution_provider="cpu")
    runner = StageRunner(mdir / "1" / "stages", execution_provider="cpu")
    _table(runner, 0.95).save(mdir / "1" / "latency.json")  # a model where one more sample costs a whole run
    m = initialize_model(mdir, fuse_stages=mode)
    try:
        assert (m.runtime.runner.n_stages == 1) is fused
        assert (m.fused is not None) is fused
        if fused:
            assert m.runtime.runner.manifest.stages[0].name == FUSED_STAGE
    finally:
        m.finalize()


def test_fuse_stages_value_is_checked(tmp_path):
    cfg = parse_config_text('name: "m" backend: "python" max_batch_size: 4\n'
                            'input { name: "x" data_type: TYPE_FP32 dims: [ 16 ] }\n'
                            'output { name: "y" data_type: TYPE_FP32 dims: [ 8 ] }\n'
                            'parameters { key: "fuse_stages" value { string_value: "sometimes" } }')
    with pytest.raises(ConfigError, match="fuse_stages must be auto, true or false"):
        BackendSettings.from_config(cfg, tmp_path)
    assert json.dumps(BackendSettings.from_config(parse_config_text(
        str(cfg).replace("sometimes", "TRUE")), tmp_path).fuse_stages) == '"true"'


def test_eager_keeps_the_stages_and_the_whole_graph_for_spans():
    """fuse_stages auto: eager (spans) wants the whole graph beside its stages, and is never fused outright (its
    boundaries are decided per job); lazy keeps its batch-cap rule; true/false override."""
    from lazybatch.backend.fusion import wants_whole_graph_spans

    eager = parse_policy("eager").build(max_batch_size=8)
    assert wants_whole_graph_spans("auto", eager)
    assert not wants_whole_graph_spans("false", eager) and not wants_whole_graph_spans("true", eager)
    assert not wants_whole_graph_spans("auto", parse_policy("eager:spans=false").build(max_batch_size=8))
    assert not wants_whole_graph_spans("auto", parse_policy("lazy").build(max_batch_size=8))
    g = ModelGraph("t", [(f"s{i}", StageType.STATIC) for i in range(3)])
    flat = LatencyTable(g, [1, 2, 4, 8], [[1e-3 * b for b in (1, 2, 4, 8)] for _ in range(3)])  # no batching gain
    assert fuse_reason("auto", eager, flat) is None
    assert fuse_reason("auto", parse_policy("lazy").build(max_batch_size=8), flat) is not None
