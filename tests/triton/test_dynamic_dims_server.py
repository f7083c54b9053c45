"""A published detector with dynamic height and width, as a new user serves it: split once (`--input-shape`),
`repo add` under every policy the registry lists and Triton's own batcher, one real tritonserver. Every model
loads and answers what onnxruntime answers on the whole graph; `lazybatch load` and `lazybatch perf` (real
perf_analyzer) feed it at its example size without being told one.

Why this graph: NudeNet's 320n.onnx is an Ultralytics YOLOv8n export (batch, height and width as dim_params).
Fed 1 for each dynamic dim, its first Concat of feature maps fails ("non concat axis dimensions must match"),
which is how Triton's whole-graph warm-up used to fail the load of every `triton:<us>` model of it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lazybatch.batcher.policies.registry import ENTRIES
from lazybatch.cli import main
from lazybatch.client.api import Client
from lazybatch.repo import add_model
from lazybatch.serving import TritonServer, free_port
from tests.onnx.test_third_party_graphs import graph

SIZE = (3, 64, 64)  # small enough for 2 cores; a 1x1 image fails in this graph
POLICIES = {**{e.name: e.name for e in ENTRIES}, "triton_0us": "triton:0"}


@pytest.fixture(scope="module")
def detector(tmp_path_factory) -> tuple[TritonServer, Path]:
    root = tmp_path_factory.mktemp("dynamic_dims")
    src = graph("nudenet", "nudenet/320n.onnx")
    stages = root / "stages"
    rc = main(["split", str(src), "--out", str(stages), "--verify", "--input-shape",
               "images=" + ",".join(map(str, SIZE))])
    assert rc == 0
    repo = root / "repo"
    for name, policy in POLICIES.items():
        add_model(None, repo, name=f"det_{name}", policy=policy, stages=stages, max_batch_size=2, profile_reps=1,
                  execution_provider="cpu", intra_op_threads=1, sla_ms=5000)
    server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          log_file=root / "tritonserver.log")
    server.start(timeout=300)
    try:
        yield server, src
    finally:
        assert server.stop() == 0


def test_repo_add_records_the_example_size() -> None:
    """The config carries the split's size for the dynamic dims, in perf_analyzer's --shape form."""
    from lazybatch.backend.settings import BackendSettings
    from lazybatch.backend.config_pbtxt import parse_config_text
    from lazybatch.repo import build_config
    from lazybatch.formats.stage_manifest import TensorSpec

    x = TensorSpec("images", np.dtype(np.float32), (3, -1, -1), SIZE)
    y = TensorSpec("out", np.dtype(np.float32), (84, -1))
    cfg = build_config("m", [x], [y], max_batch_size=2, parameters={"policy": "whole_graph"})
    assert cfg.parameters["example_dims"].string_value == "images:3,64,64"
    s = BackendSettings.from_config(parse_config_text(str(cfg)), "/nonexistent")
    assert s.inputs[0].example == SIZE


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_policy_loads_and_answers_like_the_whole_graph(detector, name: str) -> None:
    import onnxruntime as ort

    server, src = detector
    model = f"det_{name}"
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    with Client(server.endpoints.grpc) as c:
        assert c.is_ready(model), f"{model} did not load; see the server log"
        x = c.random_inputs(model, 2, seed=1)["images"]
        assert x.shape == (2, *SIZE)  # the model's example_dims, not 1x1
        got = c.infer(model, {"images": x})
    want = ref.run(None, {"images": x})
    out = next(iter(got.values()))
    np.testing.assert_allclose(out, want[0], rtol=1e-3, atol=1e-3)


def test_load_and_perf_analyzer_feed_the_example_size(detector, tmp_path: Path) -> None:
    """`lazybatch load` and `lazybatch perf` on the triton:0 model with no shape given: every request answered."""
    server, _ = detector
    out = tmp_path / "load"
    assert main(["load", "det_triton_0us", "det_eager", "--url", server.endpoints.grpc, "--rates", "5",
                 "--duration", "2", "--out", str(out)]) == 0
    rows = json.loads((out / "load.json").read_text())
    assert rows and all(r["errors"] == 0 and r["ok"] == r["sent"] > 0 for r in rows), rows
    perf_out = tmp_path / "perf"
    assert main(["perf", "det_triton_0us", "--url", server.endpoints.grpc, "--rates", "5", "--measurement-ms", "1500",
                 "--stability-percentage", "1000", "--out", str(perf_out)]) == 0
    log = (perf_out / "perf_det_triton_0us.log").read_text()
    assert "--shape images:3,64,64" in log
    assert json.loads((perf_out / "perf.json").read_text())[0]["throughput"] > 0


def test_a_repository_written_before_example_dims_reads_the_manifest(detector) -> None:
    """A config.pbtxt without the example_dims parameter (written before it existed) takes the stage manifest's."""
    from lazybatch.backend.settings import BackendSettings
    from lazybatch.backend.config_pbtxt import load_config

    server, _ = detector
    mdir = Path(server.repo) / "det_triton_0us"
    cfg = load_config(mdir / "config.pbtxt")
    del cfg.parameters["example_dims"]
    assert BackendSettings.from_config(cfg, mdir / "1").inputs[0].example == SIZE
