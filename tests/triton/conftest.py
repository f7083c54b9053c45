"""A real tritonserver (nvidia-pytriton's binary) on free ports, serving small lazybatch models.

Session-scoped: the repository is built once (triton_models.build_repository) and one server serves every test.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from lazybatch.serving import TritonServer, free_port
from triton_models import Served, build_repository, crash_at_stop


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Served:
    root = tmp_path_factory.mktemp("triton")
    repo, mlp, slow = build_repository(root)
    stats_dir = root / "stats"
    log = root / "tritonserver.log"
    server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          log_file=log, env={"LAZYBATCH_STATS_DIR": str(stats_dir), "OMP_NUM_THREADS": "1"})
    server.start(timeout=240)
    try:
        yield Served(server, repo, stats_dir, log, mlp, slow)
    finally:
        code = server.stop()
        crash = crash_at_stop(code, log)
        assert code == 0 or crash, f"tritonserver exited with {code}; see {log}"
        if crash:  # an open defect, reported on every run it happens in (triton_models.crash_at_stop)
            warnings.warn(f"tritonserver crashed at its stop after the tests ({code}: {crash}); see {log}")


@pytest.fixture(scope="session")
def reference(served: Served):
    """onnxruntime on the whole graph: what every model must answer."""
    import onnxruntime as ort

    sessions = {"mlp": ort.InferenceSession(str(served.mlp), providers=["CPUExecutionProvider"]),
                "slow": ort.InferenceSession(str(served.slow), providers=["CPUExecutionProvider"])}

    def run(which: str, x: np.ndarray) -> np.ndarray:
        return sessions[which].run(None, {"x": x})[0]

    return run
