"""CUDA graphs per (stage, batch bucket) (sessions/cuda_graphs.py) on onnxruntime's CPU provider: the same static
buffers, padding, copies out and load-time check that the CUDA provider runs, without the capture itself."""

from __future__ import annotations

import numpy as np
import pytest

from lazybatch.backend.stages import StageRunner
from lazybatch.sessions.cuda_graphs import build_graphs, bucket_of, graph_buckets
from lazybatch.sessions.device_tensors import DeviceTensors, Rows

from tests.backendhelpers import relu_split_mlp

BUCKETS = (1, 2, 4, 8)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    return relu_split_mlp(tmp_path_factory.mktemp("graphs_mlp"), depth=5)


def test_buckets_are_powers_of_two_up_to_the_largest_batch():
    assert graph_buckets(1) == (1,)
    assert graph_buckets(8) == (1, 2, 4, 8)
    assert graph_buckets(12) == (1, 2, 4, 8, 12)
    assert [bucket_of(n, graph_buckets(12)) for n in (1, 3, 5, 9, 12, 13)] == [1, 4, 8, 12, 12, None]
    with pytest.raises(ValueError):
        graph_buckets(0)


def test_pad_into_writes_the_rows_and_repeats_the_last():
    dev = DeviceTensors(["CPUExecutionProvider"])
    a = np.arange(15, dtype=np.float32).reshape(5, 3)
    buf = dev.empty_like_rows(a, 4)
    dev.pad_into(Rows(dev.value(a), 1, 2), buf)  # rows 1-2 of a, by pointer
    assert buf.numpy().tobytes() == a[[1, 2, 2, 2]].tobytes()
    dev.pad_into(a[:4], buf)  # a full bucket, from a host array
    assert buf.numpy().tobytes() == a[:4].tobytes()


@pytest.mark.parametrize("batch", [1, 3, 5, 8, 9])
def test_padded_replays_answer_as_the_host_path(mlp, batch):
    """Batches inside a bucket (padded), at one (not), and above the largest (a plain run): bit for bit."""
    _, stages = mlp
    host = StageRunner(stages, execution_provider="cpu")
    r = StageRunner(stages, execution_provider="cpu", device_tensors=True, graph_buckets=BUCKETS)
    assert sorted(r.graphs) == list(range(r.n_stages)) and r.graphs_refused == []
    x = host.sample_inputs(batch, seed=batch)
    want = host.run_all({k: v.copy() for k, v in x.items()})
    got = r.run_all_resident({k: v.copy() for k, v in x.items()})
    assert all(got[k].tobytes() == want[k].tobytes() for k in want)
    assert all(g.replays == (1 if batch <= 8 else 0) for g in r.graphs.values())  # 9: above every bucket


def test_a_held_output_survives_the_next_replay_of_its_bucket(mlp):
    """The scheduler keeps a preempted sub-batch's tensors while another runs the same stage: outputs are copies."""
    _, stages = mlp
    r = StageRunner(stages, execution_provider="cpu", device_tensors=True, graph_buckets=BUCKETS)
    x1, x2 = r.sample_inputs(3, seed=1)["x"], r.sample_inputs(3, seed=2)["x"]
    first = r.run_resident(0, {"x": r.join([(x1, k) for k in range(3)])})
    before = r.resident.host(next(iter(first.values())))
    r.run_resident(0, {"x": r.join([(x2, k) for k in range(3)])})
    assert r.resident.host(next(iter(first.values()))).tobytes() == before.tobytes()


def _row_mixing_stages(root):
    """x -> Relu(x W) -> Relu(h - mean over the batch) -> y: the second stage mixes rows, so padding changes it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from lazybatch.staging import split_model

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h0"]), helper.make_node("Relu", ["h0"], ["h"]),
             helper.make_node("ReduceMean", ["h"], ["m"], axes=[0], keepdims=1),
             helper.make_node("Sub", ["h", "m"], ["d"]), helper.make_node("Relu", ["d"], ["y"])]
    g = helper.make_graph(nodes, "mix", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, str(root / "mix.onnx"))
    return split_model(root / "mix.onnx", root / "stages", cut_after=[1])


def test_a_stage_that_mixes_rows_is_refused_and_served_plainly(tmp_path):
    stages = _row_mixing_stages(tmp_path)
    host = StageRunner(stages, execution_provider="cpu")
    r = StageRunner(stages, execution_provider="cpu", device_tensors=True, graph_buckets=BUCKETS)
    assert sorted(r.graphs) == [0]
    assert len(r.graphs_refused) == 1 and "differs from the unpadded run" in r.graphs_refused[0]
    x = host.sample_inputs(3, seed=4)
    want = host.run_all({k: v.copy() for k, v in x.items()})
    got = r.run_all_resident({k: v.copy() for k, v in x.items()})
    assert all(got[k].tobytes() == want[k].tobytes() for k in want)


def test_a_stage_onnxruntime_will_not_capture_is_named():
    """Where onnxruntime refuses a graph session (a node off the CUDA provider), the stage runs without one."""
    dev = DeviceTensors(["CPUExecutionProvider"])

    def refuse(index):
        raise RuntimeError("This session cannot use the graph capture feature as requested by the user as all "
                           "compute graph nodes have not been partitioned to the CUDA execution provider")

    graphs, refused = build_graphs([(0, "stage_000")], refuse, dev, lambda i: ["y"], BUCKETS, capture=True,
                                   warm_feeds=lambda i, n: {}, plain_run=lambda i, f: {})
    assert graphs == {} and refused[0].startswith("stage_000: onnxruntime will not capture it (RuntimeError")


def test_graphs_need_the_device_path(mlp):
    _, stages = mlp
    r = StageRunner(stages, execution_provider="cpu", device_tensors=False, graph_buckets=BUCKETS)
    assert r.graphs == {} and "device_tensors is off" in r.graphs_refused[0]


def test_the_latency_table_is_a_step_function_of_the_bucket():
    from lazybatch.batcher.graph import ModelGraph
    from lazybatch.batcher.latency_table import LatencyTable

    t = LatencyTable(ModelGraph("m", ["a", "b"]), [1, 2, 4, 8], [[1.0, 2.0, 4.0, 8.0], [1.0, 1.5, 2.5, 4.5]])
    s = t.bucketed((1, 2, 4, 8), stages=[0])
    assert [s.latency(0, b) for b in range(1, 9)] == [1.0, 2.0, 4.0, 4.0, 8.0, 8.0, 8.0, 8.0]
    assert [s.latency(1, b) for b in range(1, 9)] == [t.latency(1, b) for b in range(1, 9)]  # no graph: as it was
    assert s.meta["buckets"] == [1, 2, 4, 8]
    assert not s.is_monotone(), "per sample a padded batch costs more than a full bucket: a step, not the fit's shape"


def _served(tmp_path, **params):
    from lazybatch.repo import add_model
    from lazybatch.staging import make_mlp

    from tests.backendhelpers import initialize_model

    model = make_mlp(tmp_path / "mlp.onnx", in_dim=16, width=32, depth=4, out_dim=8)
    mdir = add_model(model, tmp_path / "repo", name="m", policy="lazy", max_batch_size=8, max_stages=4,
                     profile_reps=1, execution_provider="cpu")
    return initialize_model(mdir, fuse_stages="false", **params)


def test_cuda_graphs_off_cuda_is_refused_with_a_log_line(tmp_path, capfd):
    m = _served(tmp_path, cuda_graphs="true")
    try:
        assert m.runtime.runner.graphs == {}
        assert "cuda_graphs off: it needs the CUDA execution provider" in capfd.readouterr().err
    finally:
        m.finalize()


def test_a_model_with_graphs_plans_with_bucket_costs_and_answers(tmp_path, monkeypatch):
    """The backend's wiring with the capture itself stood in for (no CUDA here): graphs on every stage, the
    scheduler's table a step function of the bucket, and a request answered as the model answers."""
    import onnxruntime as ort

    from lazybatch.backend import model as model_module

    monkeypatch.setattr(model_module, "cuda_graph_buckets", lambda s, kind: (graph_buckets(8), None))
    m = _served(tmp_path, device_tensors="true")
    try:
        runner, table = m.runtime.runner, m.parts.table
        assert len(runner.graphs) == runner.n_stages
        assert table.meta["buckets"] == [1, 2, 4, 8]
        assert all(table.latency(s, 5) == table.latency(s, 8) for s in range(runner.n_stages))
        x = np.random.default_rng(3).standard_normal((3, 16)).astype(np.float32)
        got = runner.run_all_resident({"x": x})["y"]
        want = ort.InferenceSession(str(tmp_path / "mlp.onnx")).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert all(g.replays > 0 for g in runner.graphs.values())
    finally:
        m.finalize()
