"""Latency queries without a server (what the npu_timing Triton model answers): a split model and layer descriptors."""

from __future__ import annotations

import pytest

from lazybatch.batcher.errors import ConfigError
from lazybatch.npu_model import NPUConfig
from lazybatch.npu_model.query import StageSet, parse_layer
from lazybatch.npu_model.tables import latency_table


def test_split_model_query_equals_the_latency_table(small_split):
    d = small_split("resnet50")
    cfg = NPUConfig()
    table, costs = latency_table(d, [1, 4], cfg)
    ans = StageSet.from_split(d).query([table.graph.n - 1, 0], [4, 1], cfg)
    last = table.graph.n - 1
    assert ans.stage_names == [table.graph.stages[last].name, table.graph.stages[0].name]
    assert ans.cycles == [[round(costs[last][1].cycles), round(costs[last][0].cycles)],
                          [round(costs[0][1].cycles), round(costs[0][0].cycles)]]
    assert ans.latency_us[1][1] == pytest.approx(table.measured[0][0] * 1e6)
    assert ans.energy_uj[0][0] == pytest.approx(costs[last][1].energy_pj * 1e-6)


def test_layers_and_default_stages():
    cfg = NPUConfig()
    ans = StageSet.from_layers(["gemm:1,256,256", " conv:10,10,8,3,3,16,1"]).query(None, [2], cfg)
    assert ans.stages == [0, 1] and ans.stage_names == ["gemm:1,256,256", "conv:10,10,8,3,3,16,1"]
    assert ans.cycles[0][0] == round(parse_layer("gemm:1,256,256")(2, cfg).cycles)


@pytest.mark.parametrize("layers, stages, batches, says", [
    (["gemm:1,2,3"], [1], [1], r"stage id\(s\) \[1\] out of range: layers has 1 stage\(s\), ids 0..0"),
    (["gemm:1,2,3"], None, [0], r"batch size\(s\) \[0\] invalid"),
    (["gemm:1,2,3"], None, [], "no batch sizes"),
    (["gemm:1,2"], None, [1], "expected 3 positive integers"),
    (["conv:3,3,1,5,5,1,1"], None, [1], "kernel is larger"),
    (["pool:2"], None, [1], "conv:H,W,C,R,S,M,STRIDE"),
    ([], None, [1], "no layer descriptors"),
])
def test_bad_queries(layers, stages, batches, says):
    with pytest.raises(ConfigError, match=says):
        StageSet.from_layers(layers).query(stages, batches, NPUConfig())
