"""A model repository written by an older lazybatch serves as it did: upgrading the package must not break a user's
repository on disk.

tests/fixtures/repository_8aaa5fd is what `build_default_repository(kind="tiny")` wrote at commit 8aaa5fd
(2026-11-27: before the example_dims parameter, the one default policy and the backend built whole), under eager,
lazy, serial, graph:5 and Triton's own batcher, copied as it was (tests/fixtures/README.md says how it was made).
One real tritonserver loads all of it with today's backend; every model answers what onnxruntime answers on the
whole graph the repository ships, for batches of 1 and 3, and a bad request gets its error without harming the
next.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from lazybatch.client.api import Client
from lazybatch.serving import TritonServer, free_port

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "repository_8aaa5fd"
MODELS = sorted(p.name for p in FIXTURE.iterdir() if (p / "config.pbtxt").exists())


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> TritonServer:
    root = tmp_path_factory.mktemp("old_repository")
    repo = root / "models"
    shutil.copytree(FIXTURE, repo)  # a copy: the backend may write beside a model (a profiled table, stats)
    srv = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                       log_file=root / "tritonserver.log")
    srv.start(timeout=300)
    try:
        yield srv
    finally:
        assert srv.stop() == 0


def test_the_fixture_holds_every_policy_of_its_day() -> None:
    assert MODELS == ["tiny_eager", "tiny_graph_5ms", "tiny_lazy", "tiny_serial", "tiny_triton_0us"]
    for m in MODELS:  # as written then: no example_dims parameter (the backend falls back to the manifest)
        assert "example_dims" not in (FIXTURE / m / "config.pbtxt").read_text()


@pytest.mark.parametrize("model", MODELS)
def test_every_model_of_the_old_repository_answers_the_whole_graphs_result(server: TritonServer, model: str) -> None:
    whole = ort.InferenceSession(str(FIXTURE / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    with Client(server.endpoints.grpc) as c:
        assert c.is_ready(model)
        for batch in (1, 3):
            x = rng.standard_normal((batch, 64)).astype(np.float32)
            got = c.infer(model, {"x": x})["y"]
            np.testing.assert_allclose(got, whole.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
        with pytest.raises(Exception, match=r"(?i)shape"):  # the wrong width: an error that says so
            c.infer(model, {"x": np.zeros((1, 63), np.float32)})
        x = rng.standard_normal((1, 64)).astype(np.float32)
        np.testing.assert_allclose(c.infer(model, {"x": x})["y"], whole.run(None, {"x": x})[0], rtol=1e-5,
                                   atol=1e-6)
