"""Every exported small model, and several third-party graphs, split with --verify through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from lazybatch.onnx_tools.zoo import MODELS

from .onnx_helpers import light


@pytest.mark.parametrize("name", list(MODELS))
def test_export_small_then_split_verify(name: str, tmp_path: Path, cli) -> None:
    model = tmp_path / f"{name}.onnx"
    rc, out, err = cli("export", name, "--small", "--seed", "3", "--out", model)
    assert rc == 0, err
    m = onnx.load(str(model))
    assert m.ir_version <= 13  # onnxruntime 1.31 reads at most IR 13
    onnx.checker.check_model(m)
    rc, out, err = cli("split", model, "--out", tmp_path / "stages", "--verify")
    assert rc == 0, err
    assert "verify: passed" in out
    man = json.loads((tmp_path / "stages" / "manifest.json").read_text())
    v = man["verify"]
    assert v["passed"] and v["batch_sizes"] == [1, 8] and v["rel_err"] <= 1e-5
    assert len(man["stages"]) >= 2
    types = {s["type"] for s in man["stages"]}
    if MODELS[name].seq2seq:
        assert "DECODER" in types and "seq2seq" in man
    else:
        assert types == {"STATIC"}


def test_export_is_deterministic_per_seed(tmp_path: Path, cli) -> None:
    for seed, name in ((1, "a"), (1, "b"), (2, "c")):
        assert cli("export", "mobilenet_v1", "--small", "--seed", seed, "--out", tmp_path / f"{name}.onnx")[0] == 0
    a, b, c = (onnx.load(str(tmp_path / f"{n}.onnx")) for n in "abc")
    assert a.graph.initializer[0].raw_data == b.graph.initializer[0].raw_data
    assert a.graph.initializer[0].raw_data != c.graph.initializer[0].raw_data


@pytest.mark.parametrize("name", ["resnet50", "squeezenet", "inception_v1", "inception_v2", "shufflenet",
                                  "densenet121", "bvlc_alexnet", "zfnet512", "vgg19"])
def test_light_model_zoo_graphs_split_and_verify(name: str, tmp_path: Path, cli) -> None:
    rc, out, err = cli("split", light(name), "--out", tmp_path / "s", "--verify")
    assert rc == 0, err
    man = json.loads((tmp_path / "s" / "manifest.json").read_text())
    v = man["verify"]
    assert v["passed"]
    # the light_* weights are constants, so the softmax output is uniform whatever the input: the proof rests on
    # the tensors between stages, which do depend on the input
    assert v["boundaries_checked"] >= len(man["stages"]) - 1
    scales = [r["scale"] for k, r in v["per_batch"]["8"].items() if k.startswith("boundary:")]
    assert len(scales) == v["boundaries_checked"] and min(scales) > 0
    assert "original:" + man["outputs"][0]["name"] in v["per_batch"]["1"]
    assert man["inputs"][0]["dims"] == [3, 224, 224]
    assert any("batch dimension 1" in f for f in man["batch_fixes"])
    assert len(man["stages"]) > 5


def test_light_resnet50_cuts_between_residual_blocks(tmp_path: Path, cli) -> None:
    """16 bottleneck blocks -> stem + 16 blocks + head; no block is cut (one tensor crosses every cut)."""
    assert cli("split", light("resnet50"), "--out", tmp_path / "s")[0] == 0
    man = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert len(man["stages"]) == 18
    assert all(s["cut_width"] == 1 for s in man["stages"][1:])
    sums = [s for s in man["stages"] if s["heavy_ops"] in (3, 4)]  # a bottleneck: 3 convs (+1 projection)
    assert len(sums) == 16


def test_light_shufflenet_reshapes_made_batchable(tmp_path: Path, cli) -> None:
    """ShuffleNet's channel shuffle hard-codes batch 1 in 33 Reshape shapes: all rewritten, verified at batch 8."""
    assert cli("split", light("shufflenet"), "--out", tmp_path / "s", "--verify")[0] == 0
    man = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert sum(f.startswith("Reshape") for f in man["batch_fixes"]) == 33


def test_full_size_resnet50_export_split_verify(tmp_path: Path, cli) -> None:
    """The one full-size model in the suite (about 10 s): 25.6M weights, 18 stages, verified at batch 1 and 8."""
    rc, out, err = cli("export", "resnet50", "--out", tmp_path / "r.onnx")
    assert rc == 0, err
    assert 95e6 < (tmp_path / "r.onnx").stat().st_size < 110e6
    rc, out, err = cli("split", tmp_path / "r.onnx", "--out", tmp_path / "s", "--verify")
    assert rc == 0, err
    man = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert man["inputs"][0]["dims"] == [3, 224, 224] and man["outputs"][0]["dims"] == [1000]
    assert len(man["stages"]) == 18 and man["verify"]["passed"]
    assert [s["heavy_ops"] for s in man["stages"]] == [1] + [4, 3, 3] + [4, 3, 3, 3] + [4] + [3] * 5 + [4, 3, 3] + [1]


DATA = Path(__file__).resolve().parent / "data"


@pytest.mark.parametrize("name,stages", [("torch_resnetish_dynamo", 5), ("torch_encoder_dyn_ts", 5)])
def test_pytorch_exported_models(name: str, stages: int, tmp_path: Path, cli) -> None:
    """Graphs from torch.onnx.export (see data/make_torch_models.py): the new exporter's external data and
    run-time shape arithmetic, the TorchScript exporter's attention with a dynamic batch."""
    rc, out, err = cli("split", DATA / f"{name}.onnx", "--out", tmp_path / "s", "--verify")
    assert rc == 0, err
    man = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert len(man["stages"]) == stages and man["verify"]["passed"]


def test_pytorch_batch1_attention_is_refused(tmp_path: Path, cli) -> None:
    """PyTorch's attention at a fixed batch of 1 folds the batch into a sequence-first Reshape: refused, with the
    node that fails at batch 2 named, and nothing written."""
    rc, out, err = cli("split", DATA / "torch_encoder_b1_ts.onnx", "--out", tmp_path / "s")
    assert rc == 2 and "failed at batch size 2" in err and "self_attn/Reshape" in err
    assert not (tmp_path / "s").exists()
