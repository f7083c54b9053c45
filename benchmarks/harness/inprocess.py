"""The backend's runtime driven in-process, with no server: what the cost benchmarks time (the 8-stage MLP split
one stage per layer, requests sent one at a time through a runtime as Triton's ``execute`` hands them over, and the
whole graph's t1 beside them)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from typing import Any

import numpy as np

from lazybatch.backend.request_parsing import RequestOptions
from lazybatch.backend.runtime import BackendRuntime


def mlp_stages(work: Path) -> tuple[Path, Path]:
    """The 8 x 2048 MLP and its stages, one per layer (the model the backend's own cost is measured on)."""
    import onnx

    from lazybatch.staging import make_mlp, split_model

    model = make_mlp(work / "mlp.onnx", in_dim=2048, width=2048, depth=8, out_dim=1000, seed=0)
    relus = [i for i, n in enumerate(onnx.load(str(model)).graph.node) if n.op_type == "Relu"]
    return model, split_model(model, work / "stages", cut_after=relus, name="mlp")


class Answered:
    """The ``respond`` of a runtime timed here (build it with one): wakes the sender of the one request in flight
    (``runtime_latencies``)."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def __call__(self, *answer: Any) -> None:
        self.event.set()


def runtime_latencies(rt: BackendRuntime, x: np.ndarray, n: int) -> list[float]:
    """Latency of ``n`` requests sent one at a time (the next after the previous answer), each as Triton's
    ``execute`` hands it over: inline where the runtime takes it, else through the scheduler thread. The runtime
    answers through an ``Answered``."""
    if not isinstance(rt.respond, Answered):
        raise TypeError("build the runtime with respond=Answered() to time it here")
    done = rt.respond.event
    out = []
    for _ in range(n):
        done.clear()
        t0 = time.perf_counter()
        if not rt.inline or rt.route.run([({"x": x}, 1)]) is None:
            rt.submit(None, {"x": x}, 1, RequestOptions(sla_s=1.0))
            done.wait()
        out.append(time.perf_counter() - t0)
    return out


def whole_graph_latencies(whole, x: np.ndarray, n: int) -> list[float]:
    """t1: the backend's own whole-graph session run directly, ``n`` times."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        whole.run(0, {"x": x})
        out.append(time.perf_counter() - t0)
    return out
