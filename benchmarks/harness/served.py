"""A tritonserver for one benchmark: started on free ports, ready before the first request, stopped on the way out
(an error included), and the counters it and the backend keep (Triton's statistics, the backend's stats file)."""

from __future__ import annotations

import json
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from lazybatch.serving import TritonServer, free_port


def start_server(repo: str | Path, log_file: str | Path | None, *, stats_dir: str | Path | None = None,
                 env: dict[str, str] | None = None, extra_args: Sequence[str] = (),
                 timeout: float = 180.0) -> TritonServer:
    """A started, ready tritonserver serving ``repo`` on free ports (its log in ``log_file``); the caller stops it.
    ``stats_dir``: where the backend writes its statistics files (LAZYBATCH_STATS_DIR)."""
    env = {**({"LAZYBATCH_STATS_DIR": str(stats_dir)} if stats_dir is not None else {}), **(env or {})}
    server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          log_file=log_file, env=env, extra_args=extra_args)
    return server.start(timeout=timeout)


@contextmanager
def served(repo: str | Path, log_file: str | Path | None, *, stats_dir: str | Path | None = None,
           env: dict[str, str] | None = None, extra_args: Sequence[str] = (),
           timeout: float = 180.0) -> Iterator[TritonServer]:
    """``with served(repo, log) as server:`` a ready tritonserver (``start_server``), stopped when the block ends."""
    server = start_server(repo, log_file, stats_dir=stats_dir, env=env, extra_args=extra_args, timeout=timeout)
    try:
        yield server
    finally:
        server.stop()


def triton_stats(http: str, model: str) -> dict[str, int]:
    """Triton's own counters for a model: successful requests, inferences (samples) and executions (batches)."""
    with urllib.request.urlopen(f"http://{http}/v2/models/{model}/stats", timeout=10) as f:
        data = json.loads(f.read())
    s = data["model_stats"][0]
    inf = s.get("inference_stats", {})
    return {"success": int(inf.get("success", {}).get("count", 0)), "fail": int(inf.get("fail", {}).get("count", 0)),
            "inference_count": int(s.get("inference_count", 0)), "execution_count": int(s.get("execution_count", 0))}


def settled_stats(http: str, model: str, before: dict[str, int], expect: int, timeout: float = 3.0) -> dict:
    """Triton's counters once they cover ``expect`` more requests than ``before``: it counts a request after its
    response has left, so a read right after the client's last answer can miss the newest ones."""
    end = time.monotonic() + timeout
    while True:
        now = triton_stats(http, model)
        if now["success"] + now["fail"] - before["success"] - before["fail"] >= expect or time.monotonic() > end:
            return now
        time.sleep(0.05)
