"""`lazybatch split --graph-optimization-level`: cut the graph onnxruntime optimised, still proven equal."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from lazybatch.batcher.errors import ConfigError
from lazybatch.sessions.chain import StageChain, random_feeds
from lazybatch.sessions.ort_optimize import host_signature


def _ops_after_ort(path: Path, tmp: Path) -> collections.Counter[str]:
    """The operators onnxruntime actually runs for this file (its optimised graph, level all)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.optimized_model_filepath = str(tmp / f"opt_{path.parent.name}_{path.name}")
    ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
    return collections.Counter(n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node)


def _stage_ops(d: Path, tmp: Path) -> collections.Counter[str]:
    man = json.loads((d / "manifest.json").read_text())
    total: collections.Counter[str] = collections.Counter()
    for st in man["stages"]:
        total += _ops_after_ort(d / st["file"], tmp)
    return total


@pytest.fixture(scope="module")
def resnet_small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lazybatch.onnx_tools.zoo import export_model

    p = tmp_path_factory.mktemp("m") / "resnet50_small.onnx"
    export_model("resnet50", p, small=True, seed=0)
    return p


def test_all_level_stages_run_exactly_the_whole_graphs_kernels(resnet_small: Path, tmp_path: Path, cli) -> None:
    """Cut after level 'all': the stages together run the operators the whole graph runs, no layout conversion
    or unfused Add/Relu added at the boundaries (which the plain split does add), and --verify still passes
    against the unoptimised model and the original file."""
    rc, out, err = cli("split", resnet_small, "--out", tmp_path / "all", "--graph-optimization-level", "all",
                       "--verify")
    assert rc == 0, err
    assert "verify: passed" in out
    man = json.loads((tmp_path / "all" / "manifest.json").read_text())
    opt = man["ort_optimization"]
    assert opt["level"] == "all" and opt["hardware_specific"] is True
    assert opt["cpu_features"] == host_signature()["cpu_features"]
    assert (tmp_path / "all" / opt["whole_model"]).is_file() and (tmp_path / "all" / "model.onnx").is_file()
    v = man["verify"]
    assert v["passed"] and v["rel_err"] <= 1e-5 and v["boundaries_checked"] == len(man["stages"]) - 1
    for b in ("1", "8"):
        assert f"unoptimized:{man['outputs'][0]['name']}" in v["per_batch"][b]
    assert f"original:{man['outputs'][0]['name']}" in v["per_batch"]["1"]
    assert len(man["stages"]) >= 5
    whole = _ops_after_ort(tmp_path / "all" / "model.onnx", tmp_path)
    assert _stage_ops(tmp_path / "all", tmp_path) == whole
    assert cli("split", resnet_small, "--out", tmp_path / "plain")[0] == 0
    plain = _stage_ops(tmp_path / "plain", tmp_path)
    assert sum(plain.values()) >= sum(whole.values())  # equal only where onnxruntime has no NCHWc kernels


def test_extended_level_is_portable_and_verified(tmp_path: Path, cli) -> None:
    from .onnx_helpers import light

    rc, out, err = cli("split", light("squeezenet"), "--out", tmp_path / "s", "--graph-optimization-level",
                       "extended", "--verify")
    assert rc == 0, err
    man = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert man["ort_optimization"]["hardware_specific"] is False
    assert man["verify"]["passed"] and man["verify"]["boundaries_checked"] >= 3
    StageChain(tmp_path / "s", dict(man, ort_optimization=dict(man["ort_optimization"], cpu_features=["x"])))


def test_all_level_stages_are_refused_on_another_host(resnet_small: Path, tmp_path: Path, cli) -> None:
    assert cli("split", resnet_small, "--out", tmp_path / "s", "--graph-optimization-level", "all")[0] == 0
    man_path = tmp_path / "s" / "manifest.json"
    man = json.loads(man_path.read_text())
    rc, out, err = cli("profile", tmp_path / "s", "--batch-sizes", "1,2", "--repeat", "1", "--no-plot")
    assert rc == 0, err
    table = json.loads((tmp_path / "s" / "latency.json").read_text())
    assert table["meta"]["graph_optimization_level"] == "all"
    chain = StageChain(tmp_path / "s", man)  # this host: fine, and the Triton backend's runner agrees
    from lazybatch.backend.stages import StageRunner

    feeds = random_feeds(man["graph_inputs"], 3, np.random.default_rng(1))
    want = chain.run_whole(feeds)
    got = StageRunner(tmp_path / "s", execution_provider="cpu").run_all(feeds)
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-5, atol=1e-6 * float(np.abs(ref).max()))
    man["ort_optimization"]["cpu_features"] = ["sse4_1"]
    with pytest.raises(ConfigError, match="another host.*cpu_features.*split the model again"):
        StageChain(tmp_path / "s", man)
    man_path.write_text(json.dumps(man))
    rc, out, err = cli("profile", tmp_path / "s", "--batch-sizes", "1", "--repeat", "1", "--no-plot")
    assert rc == 2 and "another host" in err and "cpu_features" in err
    with pytest.raises(ConfigError, match="another host"):
        StageRunner(tmp_path / "s", execution_provider="cpu")


def test_unknown_level_is_a_usage_error(resnet_small: Path, tmp_path: Path, cli) -> None:
    with pytest.raises(SystemExit) as e:
        cli("split", resnet_small, "--out", tmp_path / "s", "--graph-optimization-level", "fast")
    assert e.value.code == 2
    assert not (tmp_path / "s").exists()


def test_external_data_model_optimised_then_split(tmp_path: Path, cli) -> None:
    """A PyTorch (dynamo) export with its weights in a .data file: optimised, split and verified; every file the
    directory needs is in it (stages, model.onnx and the optimised whole graph each with their own .data)."""
    src = Path(__file__).resolve().parent / "data" / "torch_resnetish_dynamo.onnx"
    rc, out, err = cli("split", src, "--out", tmp_path / "s", "--graph-optimization-level", "all", "--verify")
    assert rc == 0, err
    man = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert man["verify"]["passed"] and man["external_data"]
    names = {p.name for p in (tmp_path / "s").iterdir()}
    assert {"model.onnx.data", "ort_optimized.onnx.data"} <= names
    assert all(f"{st['file']}.data" in names for st in man["stages"])
