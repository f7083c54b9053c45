"""The NPU-time executor's parts without a server: its config parameters, the timed runner, repo add --executor npu.

The served behaviour (real outputs, releases at the NPU time, accounting) is tested through a real server in
tests/triton/test_npu_executor.py.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from lazybatch.backend.settings import BackendSettings
from lazybatch.backend.config_pbtxt import parse_config_text
from lazybatch.backend.npu_executor import NpuTimedRunner, maybe_wrap
from lazybatch.backend.stages import StageRunner
from lazybatch.batcher import LatencyTable, ModelGraph, StageType
from lazybatch.batcher.errors import ConfigError
from lazybatch.npu_repo import add_npu_model
from tests.backendhelpers import relu_split_mlp


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return relu_split_mlp(tmp_path_factory.mktemp("npu_exec"), depth=3)


def _cfg(params: dict[str, str]):
    text = 'name: "m" backend: "python" max_batch_size: 4 ' + " ".join(
        f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in params.items())
    return parse_config_text(text)


def _npu_table(n: int, us: float = 2000.0) -> LatencyTable:
    graph = ModelGraph("m", [(f"s{i}", StageType.STATIC) for i in range(n)])
    return LatencyTable(graph, [1, 4], [[us * 1e-6, 2 * us * 1e-6]] * n, meta={"npu": {"rows": 128}})


def test_parameters_are_known_to_the_backend_settings(tmp_path):
    cfg = _cfg({"executor": "npu", "npu_time_scale": "10"})
    cfg.input.add(name="x", data_type=11, dims=[16])  # TYPE_FP32
    cfg.output.add(name="y", data_type=11, dims=[8])
    BackendSettings.from_config(cfg, tmp_path)  # no "unknown parameters" error


@pytest.mark.parametrize("params, says", [
    ({"executor": "gpu"}, "executor must be onnxruntime or npu"),
    ({"executor": "npu", "npu_time_scale": "0"}, "npu_time_scale must be a positive number"),
    ({"executor": "npu", "npu_time_scale": "fast"}, "npu_time_scale must be a positive number"),
    ({"npu_time_scale": "5"}, "only read with executor: npu"),
])
def test_bad_parameters(params, says):
    with pytest.raises(ConfigError, match=says):
        maybe_wrap(_cfg(params), object(), _npu_table(2), 4)


def test_a_measured_table_is_refused():
    graph = ModelGraph("m", [("s0", StageType.STATIC)])
    measured = LatencyTable(graph, [1, 4], [[1e-3, 2e-3]])
    with pytest.raises(ConfigError, match="NPU-modelled latency table"):
        maybe_wrap(_cfg({"executor": "npu"}), object(), measured, 4)
    with pytest.raises(ConfigError, match="covers batch sizes up to 4"):
        maybe_wrap(_cfg({"executor": "npu"}), object(), _npu_table(1), 8)


def test_onnxruntime_executor_is_untouched():
    runner, table = object(), _npu_table(2)
    assert maybe_wrap(_cfg({}), runner, table, 4) == (runner, table)


def test_timed_runner_scales_the_table_and_holds_the_release(mlp):
    model, stages = mlp
    inner = StageRunner(stages, execution_provider="cpu")
    runner, table = maybe_wrap(_cfg({"executor": "npu", "npu_time_scale": "3"}), inner,
                               _npu_table(inner.n_stages), 4)
    assert isinstance(runner, NpuTimedRunner)
    assert table.latency(0, 4) == pytest.approx(3 * 4000e-6)
    spec = inner.manifest.stages[0]
    feeds = {i.name: np.zeros((4, 16), np.float32) for i in spec.inputs}
    t0 = time.monotonic()
    out = runner.run(0, feeds)
    assert time.monotonic() - t0 >= table.latency(0, 4)  # never released before the modelled time
    ref = inner.run(0, feeds)
    assert all(np.array_equal(out[k], ref[k]) for k in ref)
    s = runner.npu_stats()
    assert s["stage_runs"] == 1 and s["modelled_s"] == pytest.approx(table.latency(0, 4))
    assert runner.manifest is inner.manifest and runner.n_stages == inner.n_stages  # the rest is the runner's


def test_repo_add_executor_npu_writes_the_npu_table(mlp, tmp_path, cli):
    model, stages = mlp
    rc, out, err = cli("repo", "add", model, "--stages", stages, "--repository", tmp_path, "--name", "m",
                       "--executor", "npu", "--npu-time-scale", "50", "--max-batch-size", "4")
    assert rc == 0, err
    t = LatencyTable.load(tmp_path / "m" / "1" / "latency.json")
    assert "npu" in t.meta and t.batch_sizes == (1, 2, 4)
    cfg = (tmp_path / "m" / "config.pbtxt").read_text()
    assert '"executor"' in cfg and '"50"' in cfg
    with pytest.raises(ConfigError, match="executor npu needs a lazybatch scheduler policy"):
        add_npu_model(model, tmp_path, name="t", policy="triton:0", stages=stages)
    rc, out, err = cli("repo", "add", model, "--stages", stages, "--repository", tmp_path, "--name", "m2",
                       "--executor", "npu", "--npu-time-scale", "-1")
    assert rc == 2 and "npu_time_scale must be positive" in err
