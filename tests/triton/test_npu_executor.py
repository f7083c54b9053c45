"""The NPU-time executor through a real Triton server: real outputs, stages released at the modelled NPU time."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.client.api import Client

from triton_models import MAX_BATCH, NPU_SCALE

TOL = dict(rtol=1e-4, atol=1e-5)


def _x(batch: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 32)).astype(np.float32)


def _table(served) -> LatencyTable:
    return LatencyTable.load(served.repo / "mlp_npu" / "1" / "latency.json")


def test_config_and_table_are_the_npu_models(served):
    cfg = (served.repo / "mlp_npu" / "config.pbtxt").read_text()
    assert '"npu"' in cfg and f'"{NPU_SCALE}"' in cfg
    table = _table(served)
    assert "npu" in table.meta and "systolic" in table.provenance


def test_outputs_are_onnxruntimes_and_never_early(served, reference):
    """Served answers equal the whole graph's; a lone request takes at least the modelled NPU time of every stage at
    batch 1 (times the scale): the release is held back to the NPU's time, never earlier."""
    floor = NPU_SCALE * sum(_table(served).dense[s][1] for s in range(_table(served).graph.n))
    with Client(served.grpc) as c:
        for batch in (1, 3, MAX_BATCH):
            x = _x(batch, seed=batch)
            t0 = time.perf_counter()
            y = c.infer("mlp_npu", {"x": x})["y"]
            took = time.perf_counter() - t0
            np.testing.assert_allclose(y, reference("mlp", x), **TOL)
            assert took >= floor


def test_concurrent_clients_and_npu_accounting(served, reference):
    """Under concurrency every answer is right, and the executor's own account of modelled time equals the NPU
    table summed over the stage runs the scheduler really executed (its batch-size histogram)."""
    before = served.stats("mlp_npu")

    def client(k: int) -> None:
        rng = np.random.default_rng(k)
        with Client(served.grpc) as c:
            for j in range(3):
                x = _x(int(rng.integers(1, MAX_BATCH + 1)), seed=100 * k + j)
                np.testing.assert_allclose(c.infer("mlp_npu", {"x": x})["y"], reference("mlp", x), **TOL)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(client, range(16)))
    after = served.stats("mlp_npu")
    table = _table(served)
    n = table.graph.n
    hist = {int(b): after["batch_hist"].get(b, 0) - before.get("batch_hist", {}).get(b, 0)
            for b in after["batch_hist"]}
    assert sum(hist.values()) == after["npu"]["stage_runs"] - before.get("npu", {}).get("stage_runs", 0)
    assert max(hist) > 1  # the scheduler batched on NPU timings
    # every stage runs once per sub-batch: the same histogram for each stage, so sum over b of count * mean latency
    per_b = {b: sum(table.dense[s][b] for s in range(n)) / n for b in hist}
    want = NPU_SCALE * sum(c * per_b[b] for b, c in hist.items())
    got = after["npu"]["modelled_s"] - before.get("npu", {}).get("modelled_s", 0.0)
    assert abs(got - want) <= 0.02 * want
    assert json.dumps(after["npu"])  # overruns are reported (a count, whatever it is on this machine)
    assert 0.0 <= after["npu"]["overrun_fraction"] <= 1.0
