"""Triton's gRPC frontend and client cancellation, with no lazybatch code in the server.

A stock Python-backend model (doubles its input; no scheduler, no response sender, no ``is_cancelled``) is served by
nvidia-pytriton's tritonserver and sent gRPC requests, each cancelled by its client. Two ways, fresh server per trial:

- ``racing``: a cancel 0-1 ms after its request, while the answer (well under a millisecond) is on its way;
- ``held``: the model sleeps 30 ms and each cancel comes 3 ms after its request, long before the answer.

Prints each trial's exit code at SIGINT (0: a clean stop; anything else, -11, -6 or 1 seen here, a crash). With
Triton 2.51 (the server nvidia-pytriton 0.7 bundles) racing cancels crash it, held ones do not (docs/operations.md,
Cancellation).

    python scripts/grpc_cancel_race.py --trials 4
"""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from lazybatch.serving import TritonServer, free_port

MODEL = '''import time
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        time.sleep({sleep})
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", 2 * pb_utils.get_input_tensor_by_name(r, "x")
                .as_numpy())]) for r in requests]
'''
CONFIG = '''backend: "python"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 32 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 32 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
dynamic_batching { }
'''


def trial(root: Path, way: str, n: int, seed: int) -> int | None:
    """One server, ``n`` cancelled requests; the server's exit code at SIGINT."""
    repo = root / way / "repo"
    (repo / "double" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "double" / "1" / "model.py").write_text(MODEL.format(sleep=0.03 if way == "held" else 0))
    (repo / "double" / "config.pbtxt").write_text(CONFIG)
    server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          log_file=root / way / f"tritonserver{seed}.log").start(timeout=120)
    try:
        client = grpcclient.InferenceServerClient(server.endpoints.grpc)
        done = threading.Semaphore(0)
        rng = random.Random(seed)
        x = np.ones((1, 32), np.float32)
        for i in range(n):
            t = grpcclient.InferInput("x", [1, 32], "FP32")
            t.set_data_from_numpy(x)
            call = client.async_infer("double", [t], lambda result, error: done.release())
            time.sleep(rng.choice([0, 0, 1e-4, 5e-4, 1e-3]) if way == "racing" else 0.003)
            call.cancel()
            time.sleep(0.002 if way == "racing" and i % 50 else 0.01)
        for _ in range(n):
            done.acquire(timeout=30)
        client.close()
    finally:  # stopped whatever happened: its exit code is the result
        code = server.stop()
    return code


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=4, help="fresh servers per way")
    ap.add_argument("--requests", type=int, default=1000, help="cancelled requests per trial")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for way in ("racing", "held"):
            codes = [trial(Path(tmp), way, a.requests, seed) for seed in range(a.trials)]
            print(f"{way}: exit codes {codes} ({sum(c != 0 for c in codes)} of {len(codes)} crashed)", flush=True)


if __name__ == "__main__":
    main()
