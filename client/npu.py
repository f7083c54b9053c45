"""Client of the ``npu_timing`` Triton model: ``npu_query(url, model="resnet50_eager", batches=[1, 8])``.

Returns the answer as a plain dict (stage names, latencies in microseconds, cycles, energy in microjoules, one row
per stage, one column per batch size); a refused query raises ``InferError`` with the server's message.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .api import InferError, _msg, _status


def npu_query(url: str, *, model: str | None = None, layers: Sequence[str] | None = None,
              stages: Sequence[int] | None = None, batches: Sequence[int] = (1,), protocol: str = "grpc",
              timing_model: str = "npu_timing", timeout_s: float | None = None) -> dict[str, Any]:
    if protocol == "grpc":
        import tritonclient.grpc as mod
    elif protocol == "http":
        import tritonclient.http as mod
    else:
        raise InferError(f"protocol must be grpc or http, got {protocol!r}")
    inputs = []

    def add(name: str, arr: np.ndarray, dtype: str) -> None:
        t = mod.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        inputs.append(t)

    if model is not None:
        add("model", np.array([model.encode()], dtype=np.object_), "BYTES")
    if layers:
        add("layer", np.array([x.encode() for x in layers], dtype=np.object_), "BYTES")
    if stages:
        add("stage", np.asarray(list(stages), dtype=np.int32), "INT32")
    add("batch", np.asarray(list(batches), dtype=np.int32), "INT32")
    client = mod.InferenceServerClient(url)
    try:
        kw = {"client_timeout": timeout_s} if timeout_s is not None and protocol == "grpc" else {}
        res = client.infer(timing_model, inputs, **kw)
    except Exception as e:
        raise InferError(_msg(e), _status(e)) from None
    finally:
        client.close()
    names = [x.decode() if isinstance(x, bytes) else str(x) for x in res.as_numpy("stage_name")]
    return {"stage_name": names, "batch": [int(b) for b in batches],
            "latency_us": res.as_numpy("latency_us").tolist(), "cycles": res.as_numpy("cycles").tolist(),
            "energy_uj": res.as_numpy("energy_uj").tolist()}
