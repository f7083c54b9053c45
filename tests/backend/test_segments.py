"""fuse_segments: consecutive stages merged into one onnxruntime session each (sessions/segments.py,
backend/fusion.py ``segment``), with the stages' result, and served so by the backend."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from lazybatch.backend.settings import BackendSettings
from lazybatch.backend.config_pbtxt import parse_config_text
from lazybatch.backend.fusion import segment, segment_table
from lazybatch.backend.stages import StageRunner
from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.repo import add_model
from lazybatch.sessions.segments import SegmentError, balanced_cuts, merge_stages, segment_ranges
from lazybatch.staging import batchable_light_model, make_mlp, split_model
from tests.backendhelpers import initialize_model
from tests.onnx.onnx_graphs import shared_weight_mlp

SIZES = [1, 2, 4]


def _table(runner: StageRunner, times: list[float] | None = None) -> LatencyTable:
    times = times or [1e-3] * runner.n_stages
    return LatencyTable(runner.manifest.graph(), SIZES, [[t * (1 + 0.5 * (b - 1)) for b in SIZES] for t in times])


def test_balanced_cuts_split_the_time_evenly():
    assert balanced_cuts([1.0] * 8, 4) == [2, 4, 6]
    assert balanced_cuts([1.0] * 8, 1) == []
    assert balanced_cuts([1.0] * 3, 10) == [1, 2]  # at most one segment per stage
    # one heavy stage: it is a segment of its own, the light ones share the rest
    assert balanced_cuts([1, 1, 1, 9, 1, 1], 2) == [3]
    cuts = balanced_cuts([5, 0.1, 0.1, 0.1, 0.1, 5], 3)
    assert cuts == sorted(set(cuts)) and len(cuts) == 2 and 0 < cuts[0] and cuts[-1] < 6
    assert segment_ranges(6, [2, 4]) == [(0, 2), (2, 4), (4, 6)]


def test_segments_give_the_stages_result_and_read_across_segments(tmp_path):
    """A residual graph (ResNet-50: shortcuts cross the cuts) in 3 segments: each reads what it needs from the
    model or an earlier segment, and the chain gives the stages' result at several batch sizes."""
    model = batchable_light_model("resnet50", tmp_path / "r.onnx")
    stages = split_model(model, tmp_path / "stages", max_stages=9)
    runner = StageRunner(stages, execution_provider="cpu")
    assert runner.n_stages > 3
    seg, table = segment(runner, _table(runner), 3, tmp_path / "seg", execution_provider="cpu", intra_op_threads=1,
                         name="r")
    assert seg.n_stages == 3 and table.graph.n == 3 and len(table.meta["segments"]) == 3
    for j, st in enumerate(seg.manifest.stages):
        assert all(i.source is None or i.source < j for i in st.inputs)
    for b in (1, 3):
        x = runner.sample_inputs(b, seed=b)
        want, got = runner.run_all(x), seg.run_all(x)
        for o in runner.output_names:
            np.testing.assert_allclose(got[o], want[o], rtol=1e-4, atol=1e-5)


def test_shared_weights_and_mid_graph_inputs_and_outputs(tmp_path):
    """One weight read by three stages is kept once; a model input read mid-graph and a model output produced
    mid-graph stay the segment's input and output."""
    model = shared_weight_mlp(tmp_path / "shared.onnx")
    stages = split_model(model, tmp_path / "stages", max_stages=3)
    runner = StageRunner(stages, execution_provider="cpu")
    seg, _ = segment(runner, _table(runner), 1 if runner.n_stages == 1 else runner.n_stages - 1, tmp_path / "seg",
                     execution_provider="cpu", intra_op_threads=1, name="s")
    merged = onnx.load(str(tmp_path / "seg" / seg.manifest.stages[0].file))
    assert [t.name for t in merged.graph.initializer].count("W") <= 1
    rng = np.random.default_rng(0)
    x = {"a": rng.standard_normal((1, 16)).astype(np.float32), "b": rng.standard_normal((1, 16)).astype(np.float32)}
    want, got = runner.run_all(x), seg.run_all(x)
    for o in ("h1", "out2"):
        np.testing.assert_allclose(got[o], want[o], rtol=1e-5, atol=1e-6)


def _stage(path, name_in: str, name_out: str, scale: float, inner: str = "t") -> None:
    w = numpy_helper.from_array(np.full((4,), scale, np.float32), "w")
    nodes = [helper.make_node("Mul", [name_in, "w"], [inner]), helper.make_node("Relu", [inner], [name_out])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(name_in, TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info(name_out, TensorProto.FLOAT, ["N", 4])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def test_names_two_stages_both_define_are_renamed(tmp_path):
    """Stage files written by another tool: both name their weight "w" (different values) and their inner tensor
    "t". The later stage's are renamed, so each stage keeps its own weight."""
    _stage(tmp_path / "a.onnx", "x", "h", 2.0)
    _stage(tmp_path / "b.onnx", "h", "y", -3.0)
    model = merge_stages(tmp_path, [{"file": "a.onnx"}, {"file": "b.onnx"}], keep=["y"])
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.array([[1, -1, 2, 0.5]], np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], np.maximum(np.maximum(x * 2, 0) * -3, 0))
    assert [i.name for i in model.graph.input] == ["x"] and [o.name for o in model.graph.output] == ["y"]
    with pytest.raises(SegmentError, match="do not produce"):
        merge_stages(tmp_path, [{"file": "a.onnx"}], keep=["y"])


def test_segment_table_sums_its_stages(tmp_path):
    model = make_mlp(tmp_path / "m.onnx", in_dim=8, width=8, depth=4, out_dim=2)
    runner = StageRunner(split_model(model, tmp_path / "st", max_stages=4), execution_provider="cpu")
    table = _table(runner, [1e-3 * (s + 1) for s in range(runner.n_stages)])
    ranges = segment_ranges(runner.n_stages, [1])
    seg = segment_table(table, ranges)
    for b in SIZES:
        assert seg.dense[0][b] == pytest.approx(table.dense[0][b])
        assert seg.dense[1][b] == pytest.approx(sum(table.dense[s][b] for s in range(1, runner.n_stages)))


def test_the_backend_serves_the_segments_and_removes_their_files(tmp_path):
    model = make_mlp(tmp_path / "m.onnx", in_dim=16, width=32, depth=6, out_dim=8)
    mdir = add_model(model, tmp_path / "repo", name="m", policy="eager:urgency=true", max_batch_size=4, max_stages=6,
                     profile_reps=1, execution_provider="cpu")
    n = StageRunner(mdir / "1" / "stages", execution_provider="cpu").n_stages
    assert n >= 4
    m = initialize_model(mdir, fuse_segments="2")
    try:
        runner = m.runtime.runner
        assert runner.n_stages == 2
        assert m.runtime.policy.graph.n == 2  # the scheduler's boundaries are the segments'
        assert m.runtime.whole_runner is not None  # a job over both still runs as the whole graph
        folder = m.parts.segment_dir
        assert folder.is_dir()
        x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
        np.testing.assert_allclose(runner.run_all({"x": x})["y"], ort.InferenceSession(str(model)).run(None, {"x": x})[0],
                                   rtol=1e-5, atol=1e-6)
    finally:
        m.finalize()
    assert not folder.exists()
    m = initialize_model(mdir, fuse_segments="0")
    try:
        assert m.runtime.runner.n_stages == n
    finally:
        m.finalize()


def test_fuse_segments_value_is_checked(tmp_path):
    text = ('name: "m" backend: "python" max_batch_size: 4\n'
            'input { name: "x" data_type: TYPE_FP32 dims: [ 16 ] }\n'
            'output { name: "y" data_type: TYPE_FP32 dims: [ 8 ] }\n'
            'parameters { key: "fuse_segments" value { string_value: "VALUE" } }')
    for bad in ("-1", "two", "1.5"):
        with pytest.raises(ConfigError, match="fuse_segments"):
            BackendSettings.from_config(parse_config_text(text.replace("VALUE", bad)), tmp_path)
    assert BackendSettings.from_config(parse_config_text(text.replace("VALUE", "4")), tmp_path).fuse_segments == 4
