"""The stage manifest contract, checked field by field and by chaining the stage files with plain onnxruntime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from . import onnx_graphs as G

TRITON_TYPES = {"float32": "TYPE_FP32", "int64": "TYPE_INT64", "bool": "TYPE_BOOL"}


def _split(cli, tmp_path: Path, model: Path, *extra: object) -> dict:
    rc, out, err = cli("split", model, "--out", tmp_path / "s", *extra)
    assert rc == 0, err
    return json.loads((tmp_path / "s" / "manifest.json").read_text())


def _check_contract(man: dict, d: Path) -> None:
    for key in ("format", "model", "source", "opset", "inputs", "outputs", "stages"):
        assert key in man
    assert man["format"] == "lazybatch.stages/1" and isinstance(man["opset"], int) and man["opset"] >= 9
    for io in man["inputs"] + man["outputs"] + man["graph_inputs"] + man["graph_outputs"]:
        assert set(io) >= {"name", "dtype", "data_type", "dims"}
        assert io["data_type"] == TRITON_TYPES[io["dtype"]]
        assert all(isinstance(x, int) for x in io["dims"])
    produced: dict[str, int] = {}
    graph_inputs = {i["name"] for i in man["graph_inputs"]}
    for k, st in enumerate(man["stages"]):
        assert st["index"] == k and st["name"] == f"stage_{k:03d}" and st["file"] == f"stage_{k:03d}.onnx"
        assert st["type"] in ("STATIC", "ENCODER", "DECODER")
        assert st["num_nodes"] >= 1 and isinstance(st["flops"], int) and st["flops"] >= 0
        sm = onnx.load(str(d / st["file"]))
        onnx.checker.check_model(sm)
        assert [i.name for i in sm.graph.input] == [i["name"] for i in st["inputs"]]
        assert [o.name for o in sm.graph.output] == [o["name"] for o in st["outputs"]]
        for i in st["inputs"]:
            if i["from"] == "model":
                assert i["name"] in graph_inputs
            else:
                assert isinstance(i["from"], int) and i["from"] < k and produced[i["name"]] == i["from"]
            assert i["shape"][0] == "batch"
        for o in st["outputs"]:
            assert o["shape"][0] == "batch"
            produced[o["name"]] = k
    assert {o["name"] for o in man["graph_outputs"]} <= set(produced)


def _chain_by_hand(man: dict, d: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The manifest's chaining rule implemented independently of lazybatch.sessions.chain."""
    env = dict(feeds)
    for st in man["stages"]:
        s = ort.InferenceSession(str(d / st["file"]), providers=["CPUExecutionProvider"])
        names = [o["name"] for o in st["outputs"]]
        env.update(zip(names, s.run(names, {i["name"]: env[i["name"]] for i in st["inputs"]})))
    return {o["name"]: env[o["name"]] for o in man["graph_outputs"]}


def test_resnet_manifest_contract(tmp_path: Path, cli) -> None:
    assert cli("export", "resnet50", "--small", "--out", tmp_path / "r.onnx")[0] == 0
    man = _split(cli, tmp_path, tmp_path / "r.onnx")
    _check_contract(man, tmp_path / "s")
    assert man["model"] == "resnet50_small" and man["source"] == "r.onnx" and man["opset"] == 17
    assert man["inputs"] == [{"name": "data", "dtype": "float32", "data_type": "TYPE_FP32", "dims": [3, 32, 32]}]
    assert man["outputs"] == [{"name": "prob", "dtype": "float32", "data_type": "TYPE_FP32", "dims": [10]}]
    assert man["stages"][0]["inputs"][0] == {"name": "data", "dtype": "float32", "shape": ["batch", 3, 32, 32],
                                             "from": "model"}
    assert man["verify"] is None  # filled only with --verify


def test_shared_weights_multi_io_opset9(tmp_path: Path, cli) -> None:
    """One weight used by three stages, two inputs (one consumed by a later stage), two outputs from two stages."""
    man = _split(cli, tmp_path, G.shared_weight_mlp(tmp_path / "mlp.onnx"), "--verify")
    d = tmp_path / "s"
    _check_contract(man, d)
    assert man["opset"] == 9 and man["verify"]["passed"]
    assert len(man["stages"]) == 3
    holders = [st["file"] for st in man["stages"]
               if "W" in {t.name for t in onnx.load(str(d / st["file"])).graph.initializer}]
    assert len(holders) == 3
    assert {i["name"]: i["from"] for i in man["stages"][1]["inputs"]} == {"h1": 0, "b": "model"}
    assert man["stages"][0]["outputs"][0] == {"name": "h1", "dtype": "float32", "shape": ["batch", 16], "to": [1],
                                              "model_output": True}
    rng = np.random.default_rng(1)
    feeds = {"a": rng.standard_normal((5, 16)).astype(np.float32), "b": rng.standard_normal((5, 16)).astype(np.float32)}
    whole = ort.InferenceSession(str(d / man["whole_model"]), providers=["CPUExecutionProvider"])
    ref = dict(zip(["h1", "out2"], whole.run(["h1", "out2"], feeds)))
    got = _chain_by_hand(man, d, feeds)
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-6, atol=1e-6)
    # and the whole model equals a numpy reference (the batchable rewrite kept the maths)
    W = onnx.numpy_helper.to_array(onnx.load(str(tmp_path / "mlp.onnx")).graph.initializer[0])
    h1 = np.maximum(feeds["a"] @ W, 0)
    np.testing.assert_allclose(ref["out2"], np.maximum(h1 @ W + feeds["b"], 0) @ W, rtol=1e-5, atol=1e-5)


def test_bert_two_inputs_two_outputs(tmp_path: Path, cli) -> None:
    assert cli("export", "bert", "--small", "--out", tmp_path / "b.onnx")[0] == 0
    man = _split(cli, tmp_path, tmp_path / "b.onnx")
    _check_contract(man, tmp_path / "s")
    assert [(i["name"], i["dims"], i["range"]) for i in man["inputs"]] == [("input_ids", [16], [0, 99]),
                                                                          ("attention_mask", [16], [0, 1])]
    assert [o["name"] for o in man["outputs"]] == ["last_hidden_state", "pooler_output"]
    # the attention mask is read from the model input by every layer: it never crosses a cut
    assert all(i["from"] == "model" for st in man["stages"] for i in st["inputs"] if i["name"] == "attention_mask")


def test_external_data_model(tmp_path: Path, cli) -> None:
    rc, out, err = cli("export", "gnmt", "--small", "--external-data", "--out", tmp_path / "g.onnx")
    assert rc == 0, err
    assert (tmp_path / "g.onnx.data").is_file()
    assert any(t.data_location == onnx.TensorProto.EXTERNAL
               for t in onnx.load(str(tmp_path / "g.onnx"), load_external_data=False).graph.initializer)
    man = _split(cli, tmp_path, tmp_path / "g.onnx", "--verify")
    assert man["external_data"] is True and man["verify"]["passed"]
    assert any(p.name.endswith(".onnx.data") for p in (tmp_path / "s").iterdir())
    _check_contract(man, tmp_path / "s")


@pytest.mark.parametrize("k", [1, 3, 19])
def test_max_stages_gives_exactly_k(tmp_path: Path, cli, k: int) -> None:
    assert cli("export", "resnet50", "--small", "--out", tmp_path / "r.onnx")[0] == 0
    man = _split(cli, tmp_path, tmp_path / "r.onnx", "--max-stages", k, "--verify")
    assert len(man["stages"]) == k and man["verify"]["passed"] and man["granularity"] == {"max_stages": k}


def test_min_stage_cost_and_max_cross(tmp_path: Path, cli) -> None:
    assert cli("export", "vgg16", "--small", "--out", tmp_path / "v.onnx")[0] == 0
    default = _split(cli, tmp_path, tmp_path / "v.onnx")
    total = sum(s["flops"] for s in default["stages"])
    coarse = _split(cli, tmp_path, tmp_path / "v.onnx", "--force", "--min-stage-cost", f"{total / 4:.0f}")
    assert 2 <= len(coarse["stages"]) <= 4
    assert all(s["flops"] >= total / 4 for s in coarse["stages"][:-1])
    assert cli("export", "resnet50", "--small", "--out", tmp_path / "r.onnx")[0] == 0
    normal = _split(cli, tmp_path, tmp_path / "r.onnx", "--force")
    fine = _split(cli, tmp_path, tmp_path / "r.onnx", "--force", "--max-cross", "2", "--verify")
    assert len(fine["stages"]) > len(normal["stages"]) and fine["verify"]["passed"]
    assert max(s["cut_width"] for s in fine["stages"]) == 2


def test_verify_catches_a_wrong_stage(tmp_path: Path, cli) -> None:
    """--verify is a real check: perturb one weight of one stage file and it fails."""
    from lazybatch.onnx_tools.verify import verify_dir

    assert cli("export", "mobilenet_v1", "--small", "--out", tmp_path / "m.onnx")[0] == 0
    man = _split(cli, tmp_path, tmp_path / "m.onnx")
    d = tmp_path / "s"
    assert verify_dir(d, man)["passed"]
    f = d / man["stages"][2]["file"]
    sm = onnx.load(str(f))
    t = max(sm.graph.initializer, key=lambda t: len(t.raw_data))
    arr = onnx.numpy_helper.to_array(t).copy()
    arr.flat[0] += 1e-2
    t.CopyFrom(onnx.numpy_helper.from_array(arr, t.name))
    onnx.save(sm, str(f))
    v = verify_dir(d, man)
    assert not v["passed"] and v["rel_err"] > 1e-5


def test_max_stages_on_seq2seq_keeps_encoder_and_decoder_apart(tmp_path: Path, cli) -> None:
    assert cli("export", "gnmt", "--small", "--out", tmp_path / "g.onnx")[0] == 0
    man = _split(cli, tmp_path, tmp_path / "g.onnx", "--max-stages", 2, "--verify")
    assert [s["type"] for s in man["stages"]] == ["ENCODER", "DECODER"] and man["verify"]["passed"]
    assert man["seq2seq"]["encoder"]["stages"] == [0] and man["seq2seq"]["decoder"]["stages"] == [1]
    rc, _, err = cli("split", tmp_path / "g.onnx", "--out", tmp_path / "one", "--max-stages", 1)
    assert rc == 2 and "at least 2" in err and not (tmp_path / "one").exists()


def test_shape_computed_reshape_never_crosses_a_cut(tmp_path: Path, cli) -> None:
    """Shape(...) gives a tensor without a batch dimension: the cut after the conv is not allowed, the rest are."""
    man = _split(cli, tmp_path, G.shape_computed_flatten(tmp_path / "dyn.onnx"), "--verify")
    _check_contract(man, tmp_path / "s")
    assert man["verify"]["passed"] and man["inputs"][0]["dims"] == [3, 4, 4]
    crossing = [i["name"] for st in man["stages"] for i in st["inputs"] if i["from"] != "model"]
    assert "s" not in crossing and "target" not in crossing and "n" not in crossing
    assert len(man["stages"]) >= 2
