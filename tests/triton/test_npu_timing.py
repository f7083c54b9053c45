"""The npu_timing model through a real Triton server: queries by model name and by layer descriptor, bad queries
answered with their own errors while good ones in flight at the same time succeed."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.client.api import InferError
from lazybatch.client.npu import npu_query
from lazybatch.npu_model import NPUConfig
from lazybatch.npu_model.query import parse_layer
from lazybatch.npu_model.tables import latency_table


def test_model_query_equals_the_npu_table(served):
    """Every stage of a served model at three batch sizes: the same numbers `lazybatch npu latency` gives."""
    stages = served.repo / "mlp_lazy" / "1" / "stages"
    table, costs = latency_table(stages, [1, 3, 8], NPUConfig())
    ans = npu_query(served.grpc, model="mlp_lazy", batches=[1, 3, 8])
    assert ans["stage_name"] == [s.name for s in table.graph.stages]
    np.testing.assert_allclose(np.array(ans["latency_us"]), np.array(table.measured) * 1e6, rtol=1e-9)
    assert ans["cycles"] == [[round(c.cycles) for c in row] for row in costs]
    np.testing.assert_allclose(ans["energy_uj"], table.meta["energy_uj"], rtol=1e-9)


def test_stage_subset_and_http(served):
    full = npu_query(served.grpc, model="mlp_lazy", batches=[2])
    part = npu_query(served.http, model="mlp_lazy", stages=[2, 0], batches=[2], protocol="http")
    assert part["stage_name"] == [full["stage_name"][2], full["stage_name"][0]]
    assert part["latency_us"] == [full["latency_us"][2], full["latency_us"][0]]


def test_layer_descriptors(served):
    cfg = NPUConfig()
    ans = npu_query(served.grpc, layers=["conv:58,58,64,3,3,64,1", "gemm:1,1024,4096"], batches=[1, 8])
    assert ans["stage_name"] == ["conv:58,58,64,3,3,64,1", "gemm:1,1024,4096"]
    for i, desc in enumerate(ans["stage_name"]):
        for j, b in enumerate((1, 8)):
            assert ans["cycles"][i][j] == round(parse_layer(desc)(b, cfg).cycles)
    assert ans["latency_us"][0][1] > ans["latency_us"][0][0]  # a batch of 8 convolutions takes longer than one


BAD = [
    (dict(model="no_such_model", batches=[1]), "unknown model 'no_such_model'"),
    (dict(model="mlp_lazy", stages=[99], batches=[1]), "out of range"),
    (dict(model="mlp_lazy", batches=[0]), "batch size(s) [0]"),
    (dict(model="mlp_lazy", batches=[-3, 2]), "batch size(s) [-3]"),
    (dict(layers=["conv:1,2,3"], batches=[1]), "expected 7 positive integers"),
    (dict(layers=["fft:8"], batches=[1]), "layer 'fft:8'"),
]


@pytest.mark.parametrize("kw, says", BAD, ids=[b[1][:20] for b in BAD])
def test_bad_queries_get_clear_errors(served, kw, says):
    with pytest.raises(InferError, match=None) as e:
        npu_query(served.grpc, **kw)
    assert says in str(e.value)


def test_one_bad_query_never_harms_the_others(served):
    """Good and bad queries at once, from many clients: each bad one fails with its own message, every good one is
    answered with the right numbers."""
    want = npu_query(served.grpc, model="mlp_lazy", batches=[4])

    def one(k: int):
        kw = BAD[k % len(BAD)][0] if k % 3 == 0 else dict(model="mlp_lazy", batches=[4])
        try:
            return k, npu_query(served.grpc, **kw)
        except InferError as e:
            return k, str(e)

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(one, range(36)))
    for k, res in results:
        if k % 3 == 0:
            assert isinstance(res, str) and BAD[k % len(BAD)][1] in res
        else:
            assert res == want


def test_cli_query(served, cli):
    rc, out, err = cli("npu", "query", "--model", "mlp_lazy", "--batch", "1,8", "-u", served.grpc)
    assert rc == 0, err
    assert "b=8 us" in out and len(out.strip().splitlines()) == 1 + len(LatencyTable.load(
        served.repo / "mlp_lazy" / "1" / "latency.json").graph.stages)
    rc, out, err = cli("npu", "query", "--model", "nope", "-u", served.grpc)
    assert rc == 2 and "unknown model 'nope'" in err
