"""Batch dimensions written as -1 (Paddle2ONNX and other exporters) and dynamic dimensions besides the batch.

onnxruntime takes a dim_value of -1 as dynamic; split, repo add and profile must too, and what they write (stage
files, manifest, config.pbtxt) must say the batch is symbolic and keep every other dynamic dimension dynamic.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from lazybatch.backend.config_pbtxt import load_config
from lazybatch.backend.stages import StageRunner
from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.onnx_tools.probe import parse_input_shapes
from lazybatch.onnx_tools.profile import profile_dir
from lazybatch.onnx_tools.split import split_model
from lazybatch.onnx_tools.verify import verify_dir
from lazybatch.repo import add_model
from lazybatch.sessions.chain import StageChain


def _save(model: onnx.ModelProto, path: Path) -> Path:
    model.ir_version = 7
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def mlp_minus_one(path: Path) -> Path:
    """x[-1, 16] -> 3 MatMul layers -> y[-1, 8]; value_info also written with -1, as Paddle2ONNX does."""
    rng = np.random.default_rng(0)
    sizes = [16, 32, 32, 8]
    inits, nodes, vis = [], [], []
    cur = "x"
    for k in range(3):
        w = numpy_helper.from_array((rng.standard_normal((sizes[k], sizes[k + 1])) / 4).astype(np.float32), f"W{k}")
        inits.append(w)
        mm = f"mm{k}" if k < 2 else "y"
        nodes.append(helper.make_node("MatMul", [cur, f"W{k}"], [mm], name=f"MatMul_{k}"))
        if k < 2:
            vis.append(helper.make_tensor_value_info(mm, TensorProto.FLOAT, [-1, sizes[k + 1]]))
            nodes.append(helper.make_node("Relu", [mm], [f"r{k}"], name=f"Relu_{k}"))
            vis.append(helper.make_tensor_value_info(f"r{k}", TensorProto.FLOAT, [-1, sizes[k + 1]]))
            cur = f"r{k}"
    g = helper.make_graph(nodes, "mlp_minus_one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 8])], inits, value_info=vis)
    return _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)


def convnet_minus_one(path: Path) -> Path:
    """An image model as Paddle2ONNX writes it: x[-1, 3, -1, -1] (batch, height and width dynamic), two strided
    convs, global pooling, a Reshape(0, -1) flatten and a Gemm; intermediate value_info with -1 too."""
    rng = np.random.default_rng(1)
    w1 = numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) / 3).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((16, 8, 3, 3)) / 8).astype(np.float32), "w2")
    fc = numpy_helper.from_array((rng.standard_normal((16, 4)) / 4).astype(np.float32), "fc")
    shape = numpy_helper.from_array(np.array([0, -1], np.int64), "flat")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["a1"], name="relu1"),
        helper.make_node("Conv", ["a1", "w2"], ["c2"], name="conv2", strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["a2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["a2"], ["p"], name="pool"),
        helper.make_node("Reshape", ["p", "flat"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc"], ["y"], name="fc"),
    ]
    vis = [helper.make_tensor_value_info("c1", TensorProto.FLOAT, [-1, 8, -1, -1]),
           helper.make_tensor_value_info("a2", TensorProto.FLOAT, [-1, 16, -1, -1])]
    g = helper.make_graph(nodes, "conv_minus_one", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                    [-1, 3, -1, -1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4])], [w1, w2, fc, shape],
                          value_info=vis)
    return _save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)


def _dims(vi: onnx.ValueInfoProto) -> list[int | str | None]:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in vi.type.tensor_type.shape.dim]


def _stage_files_dynamic(out: Path) -> list[onnx.ModelProto]:
    """Every stage file: batch symbolic in position 0 of each input/output, no negative dimension anywhere."""
    man = json.loads((out / "manifest.json").read_text())
    models = []
    for st in man["stages"]:
        m = onnx.load(str(out / st["file"]))
        onnx.checker.check_model(m)
        for vi in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
            dims = _dims(vi)
            assert not any(isinstance(d, int) and d < 0 for d in dims), (st["file"], vi.name, dims)
        for vi in list(m.graph.input) + list(m.graph.output):
            assert _dims(vi)[0] == "batch", (st["file"], vi.name, _dims(vi))
        models.append(m)
    return models


def test_minus_one_batch_splits_and_verifies(tmp_path: Path, cli) -> None:
    src = mlp_minus_one(tmp_path / "m.onnx")
    rc, out, err = cli("split", src, "--out", tmp_path / "s", "--verify")
    assert rc == 0, err
    assert "verify: passed" in out
    man = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert man["verify"]["passed"] and len(man["stages"]) == 3
    assert man["graph_inputs"] == [{"name": "x", "dtype": "float32", "data_type": "TYPE_FP32", "dims": [16]}]
    assert man["graph_outputs"][0]["dims"] == [8]
    assert "input x: batch dimension -1 -> 'batch'" in man["batch_fixes"]
    assert "output y: batch dimension -1 -> 'batch'" in man["batch_fixes"]
    _stage_files_dynamic(tmp_path / "s")
    whole = onnx.load(str(tmp_path / "s" / man["whole_model"]))
    assert _dims(whole.graph.input[0]) == ["batch", 16] and not whole.graph.value_info
    # the chained stages against the untouched original file, at a batch verify did not use
    x = np.random.default_rng(5).standard_normal((5, 16)).astype(np.float32)
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = StageChain(tmp_path / "s", man).run_chain({"x": x})["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_other_negative_first_dims_are_still_refused(tmp_path: Path, cli) -> None:
    """Only -1 means dynamic; a fixed batch other than 1 is refused as before."""
    m = onnx.load(str(mlp_minus_one(tmp_path / "m.onnx")))
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 4
    onnx.save(m, str(tmp_path / "fixed.onnx"))
    rc, _, err = cli("split", tmp_path / "fixed.onnx", "--out", tmp_path / "s")
    assert rc == 2 and "fixed first dimension 4" in err and not (tmp_path / "s").exists()


def test_repo_add_minus_one_batch_writes_valid_config(tmp_path: Path) -> None:
    from tests.backendhelpers import initialize_model

    src = mlp_minus_one(tmp_path / "m.onnx")
    mdir = add_model(src, tmp_path / "repo", name="neg", max_batch_size=4, profile_reps=1)
    cfg = load_config(mdir / "config.pbtxt")
    assert cfg.max_batch_size == 4
    assert [(t.name, list(t.dims)) for t in cfg.input] == [("x", [16])]
    assert [(t.name, list(t.dims)) for t in cfg.output] == [("y", [8])]
    table = LatencyTable.load(mdir / "1" / "latency.json")
    assert len(table.graph.stages) == 3 and max(table.batch_sizes) >= 4
    # the backend loads what repo add wrote: config and manifest agree, the stages run (warm-up)
    initialize_model(mdir, cfg).finalize()


def test_profile_minus_one_batch(tmp_path: Path, cli) -> None:
    split_model(mlp_minus_one(tmp_path / "m.onnx"), tmp_path / "s")
    table = profile_dir(tmp_path / "s", batch_sizes=[1, 2, 4], warmup=0, repeat=1, progress=False)
    assert table.batch_sizes == (1, 2, 4) and len(table.graph.stages) == 3
    rc, out, err = cli("profile", tmp_path / "s", "--batch-sizes", "1,2", "--repeat", "1", "--warmup", "0",
                       "--no-plot")
    assert rc == 0, err
    assert "wrote" in out


def test_dynamic_height_width_stay_dynamic_in_stages(tmp_path: Path, cli) -> None:
    """x[-1, 3, -1, -1]: the splitter runs the model at an example size, records it, and writes stages whose
    spatial dims are still dynamic, so that the stages run at another size too."""
    src = convnet_minus_one(tmp_path / "c.onnx")
    rc, out, err = cli("split", src, "--out", tmp_path / "s", "--verify", "--max-cross", "1")
    assert rc == 0, err
    man = json.loads((tmp_path / "s" / "manifest.json").read_text())
    x = man["graph_inputs"][0]
    assert x["dims"] == [3, -1, -1] and x["example_dims"] == [3, 64, 64]
    assert "x=3,64,64" in out
    assert len(man["stages"]) >= 2
    for st in man["stages"]:
        for t in st["inputs"] + st["outputs"]:
            if len(t["shape"]) == 4:  # NCHW activations: height and width never frozen at the example's
                assert t["shape"][0] == "batch", t
                assert all(d is None or isinstance(d, str) for d in t["shape"][2:]), t
    _stage_files_dynamic(tmp_path / "s")
    # the stages at a size verify never saw (and not a multiple of the example) equal the original model
    img = np.random.default_rng(2).standard_normal((3, 3, 37, 50)).astype(np.float32)
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"x": img})[0]
    got = StageChain(tmp_path / "s", man).run_chain({"x": img})["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_input_shape_is_recorded_and_used_by_profile_and_backend(tmp_path: Path, cli) -> None:
    src = convnet_minus_one(tmp_path / "c.onnx")
    rc, _, err = cli("split", src, "--out", tmp_path / "s", "--input-shape", "x=3,40,24")
    assert rc == 0, err
    man = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert man["graph_inputs"][0]["example_dims"] == [3, 40, 24]
    runner = StageRunner(tmp_path / "s", execution_provider="cpu")
    assert runner.sample_inputs(2)["x"].shape == (2, 3, 40, 24)
    assert runner.run_all(runner.sample_inputs(2))["y"].shape == (2, 4)
    assert verify_dir(tmp_path / "s", man, batch_sizes=(1, 3))["passed"]
    table = profile_dir(tmp_path / "s", batch_sizes=[1, 2], warmup=0, repeat=1, progress=False)
    assert table.batch_sizes == (1, 2)


def test_repo_add_input_shape(tmp_path: Path, cli) -> None:
    src = convnet_minus_one(tmp_path / "c.onnx")
    rc, out, err = cli("repo", "add", src, "--repository", tmp_path / "repo", "--name", "c", "--max-batch-size",
                       "2", "--profile-reps", "1", "--input-shape", "x=3,32,32")
    assert rc == 0, err
    cfg = load_config(tmp_path / "repo" / "c" / "config.pbtxt")
    assert cfg.max_batch_size == 2 and list(cfg.input[0].dims) == [3, -1, -1] and list(cfg.output[0].dims) == [4]
    man = json.loads((tmp_path / "repo" / "c" / "1" / "stages" / "manifest.json").read_text())
    assert man["graph_inputs"][0]["example_dims"] == [3, 32, 32]


@pytest.mark.parametrize("arg, needle", [
    ("y=3,32,32", "not an input of the model"),
    ("x=32,32", "does not fit input 'x'"),
    ("x=4,32,32", "does not fit input 'x'"),
    ("x=3,0,32", "is not NAME=D1,D2"),
    ("3,32,32", "is not NAME=D1,D2"),
])
def test_bad_input_shape_says_what_to_write(arg: str, needle: str, tmp_path: Path, cli) -> None:
    src = convnet_minus_one(tmp_path / "c.onnx")
    rc, _, err = cli("split", src, "--out", tmp_path / "s", "--input-shape", arg)
    assert rc == 2 and needle in err, err
    assert not (tmp_path / "s").exists()


def test_parse_input_shapes() -> None:
    assert parse_input_shapes(["images=3,640,640", "m=1x2"]) == {"images": [3, 640, 640], "m": [1, 2]}
    assert parse_input_shapes(None) == {}
    with pytest.raises(ConfigError, match="NAME=D1,D2"):
        parse_input_shapes(["x=a,b"])
