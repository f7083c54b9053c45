"""The ONNX front end: shapes from inference at any batch, per-node costs, stages summing to the whole model."""

from __future__ import annotations

import json

import pytest

from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.graph import StageType
from lazybatch.npu_model import ConvLayer, Gemm, NPUConfig, conv_cost, gemm_cost
from lazybatch.npu_model.onnx_front import OnnxModel
from lazybatch.npu_model.tables import latency_table, load_stages

from .npuhelpers import attention, conv_mlp

CFG = NPUConfig()


def test_nodes_get_batch_shapes_and_gemm_costs(tmp_path):
    m = OnnxModel(conv_mlp(tmp_path / "m.onnx"))
    for b in (1, 3):
        nodes = {nd.name: (nd, c) for nd, c in m.node_costs(b, CFG)}
        conv_nd, conv_c = nodes["conv"]
        assert conv_nd.inputs[0] == (b, 3, 10, 10) and conv_nd.outputs[0] == (b, 4, 10, 10)
        # pads 1 on a 10x10 input: SCALE-Sim's padded 12x12 view
        ref = conv_cost(ConvLayer("conv", 12, 12, 3, 3, 3, 4, 1), CFG, b)
        assert conv_c.array_cycles == ref.array_cycles
        assert conv_c.macs == b * 100 * 27 * 4
        fc_c = nodes["fc"][1]
        assert fc_c.array_cycles == gemm_cost(Gemm(m=b, k=400, n=16), CFG).array_cycles
        assert nodes["flatten"][1].cycles == 0  # a view
        assert nodes["relu"][1].vector_cycles == -(-b * 400 // 128)
        assert nodes["softmax"][1].vector_ops == 5 * b * 16


def test_attention_batched_matmuls_are_grouped(tmp_path):
    m = OnnxModel(attention(tmp_path / "a.onnx", seq=16, heads=2, dh=8))
    nodes = {nd.name: c for nd, c in m.node_costs(4, CFG)}
    # 4 x 2 independent [16 x 8] @ [8 x 16] GEMMs; both operands are activations (no weight traffic)
    assert nodes["scores"].array_cycles == 8 * gemm_cost(Gemm(16, 8, 16, b_is_weight=False), CFG).array_cycles
    assert nodes["scores"].macs == 8 * 16 * 8 * 16
    assert nodes["scores"].dram_bytes == 0
    assert nodes["context"].macs == 8 * 16 * 16 * 8


def test_unknown_op_is_priced_and_reported_or_refused(tmp_path):
    m = OnnxModel(conv_mlp(tmp_path / "u.onnx", extra_op="Hardmax"))
    c = m.cost(2, CFG)
    assert c.unknown_ops == ["Hardmax"]
    assert c.vector_ops >= 2 * 16
    with pytest.raises(ConfigError, match="Hardmax"):
        m.cost(2, CFG, strict=True)


def test_fixed_batch_model_refuses_other_batches(tmp_path):
    m = OnnxModel(conv_mlp(tmp_path / "f.onnx", batch=1))
    assert m.cost(1, CFG).cycles > 0
    with pytest.raises(ConfigError, match="symbolic batch"):
        m.cost(2, CFG)


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="no such"):
        OnnxModel(tmp_path / "missing.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00not a model")
    with pytest.raises(ConfigError):
        OnnxModel(junk)
    with pytest.raises(ConfigError, match="manifest"):
        load_stages(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ConfigError, match="format"):
        load_stages(tmp_path)


@pytest.mark.parametrize("model", ["resnet50", "gnmt", "transformer"])
def test_stages_sum_to_the_whole_model(small_split, model):
    d = small_split(model)
    table, costs = latency_table(d, [1, 2, 8], CFG)
    whole = OnnxModel(d / "model.onnx")
    for j, b in enumerate((1, 2, 8)):
        w = whole.cost(b, CFG)
        assert sum(row[j].cycles for row in costs) == pytest.approx(w.cycles, rel=1e-9)
        assert sum(row[j].macs for row in costs) == w.macs
        assert sum(row[j].dram_bytes for row in costs) == pytest.approx(w.dram_bytes)
    manifest = json.loads((d / "manifest.json").read_text())
    assert [s.type.value for s in table.graph.stages] == [s["type"] for s in manifest["stages"]]
    assert table.meta["unknown_ops"] == []  # every op of the zoo models has a cost


def test_seq2seq_tables_are_typed_like_their_manifests(small_split):
    gnmt, _ = latency_table(small_split("gnmt"), [1, 4], CFG)
    types = {s.type for s in gnmt.graph.stages}
    assert types == {StageType.ENCODER, StageType.DECODER}
    trf, _ = latency_table(small_split("transformer"), [1, 4], CFG)
    assert {s.type for s in trf.graph.stages} == {StageType.STATIC, StageType.DECODER}


@pytest.mark.parametrize("dataflow", ["os", "ws"])
def test_stage_latency_is_monotone_in_batch(small_split, dataflow):
    table, _ = latency_table(small_split("resnet50"), [1, 2, 4, 8, 16, 32, 64], CFG.replace(dataflow=dataflow))
    for row in table.measured:
        assert row == sorted(row)
