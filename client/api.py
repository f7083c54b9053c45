"""A small client for lazybatch models on a Triton server (tritonclient underneath, gRPC or HTTP).

Scheduling options travel as Triton request parameters: ``sla_ms`` (the request's own SLA target),
``deadline_unix_ms`` (an absolute deadline, ms since the epoch) and ``request_priority``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from lazybatch.batcher.errors import LazyBatchError
from lazybatch.formats.dtypes import DATATYPES, NP_TO_DATATYPE
from lazybatch.formats.example_dims import feed_shape, parse_example_dims


class InferError(LazyBatchError):
    """The server answered with an error (``status`` is the gRPC/HTTP status name when known)."""

    def __init__(self, message: str, status: str | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class TensorInfo:
    name: str
    datatype: str
    shape: tuple[int, ...]  # as the server reports it; -1 for the batch dimension

    @property
    def dtype(self) -> np.dtype:
        return DATATYPES[self.datatype]


@dataclass(frozen=True)
class ModelInfo:
    name: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]


def request_parameters(sla_ms: float | None = None, deadline_unix_ms: float | None = None,
                       priority: int | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if sla_ms is not None:
        params["sla_ms"] = float(sla_ms)
    if deadline_unix_ms is not None:
        params["deadline_unix_ms"] = float(deadline_unix_ms)
    if priority is not None:
        params["request_priority"] = int(priority)
    return params


def make_inputs(module: Any, inputs: Mapping[str, np.ndarray]) -> list[Any]:
    out = []
    for name, arr in inputs.items():
        arr = np.ascontiguousarray(arr)
        dt = NP_TO_DATATYPE.get(arr.dtype)
        if dt is None:
            raise InferError(f"input {name!r}: numpy dtype {arr.dtype} has no Triton datatype")
        t = module.InferInput(name, list(arr.shape), dt)
        t.set_data_from_numpy(arr)
        out.append(t)
    return out


class Client:
    """``Client("127.0.0.1:8001")`` (gRPC) or ``Client("127.0.0.1:8000", protocol="http")``."""

    def __init__(self, url: str = "127.0.0.1:8001", protocol: str = "grpc", *, timeout_s: float | None = None) -> None:
        protocol = protocol.lower()
        if protocol == "grpc":
            import tritonclient.grpc as mod
        elif protocol == "http":
            import tritonclient.http as mod
        else:
            raise InferError(f"protocol must be grpc or http, got {protocol!r}")
        self.module = mod
        self.protocol = protocol
        self.url = url
        self.timeout_s = timeout_s
        self._client = mod.InferenceServerClient(url)
        self._info: dict[str, ModelInfo] = {}

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def is_ready(self, model: str | None = None) -> bool:
        try:
            return bool(self._client.is_model_ready(model) if model else self._client.is_server_ready())
        except Exception:
            return False

    def model_info(self, model: str) -> ModelInfo:
        if model not in self._info:
            try:
                md = self._client.get_model_metadata(model)
            except Exception as e:
                raise InferError(f"cannot get metadata of model {model!r}: {_msg(e)}", _status(e)) from None
            if self.protocol == "grpc":
                ins = [TensorInfo(t.name, t.datatype, tuple(int(d) for d in t.shape)) for t in md.inputs]
                outs = [TensorInfo(t.name, t.datatype, tuple(int(d) for d in t.shape)) for t in md.outputs]
            else:
                ins = [TensorInfo(t["name"], t["datatype"], tuple(int(d) for d in t["shape"])) for t in md["inputs"]]
                outs = [TensorInfo(t["name"], t["datatype"], tuple(int(d) for d in t["shape"]))
                        for t in md["outputs"]]
            self._info[model] = ModelInfo(model, tuple(ins), tuple(outs))
        return self._info[model]

    def model_parameters(self, model: str) -> dict[str, str]:
        """The model config's ``parameters`` (e.g. a seq2seq model's max_source_length, vocab_size)."""
        try:
            cfg = self._client.get_model_config(model)
        except Exception as e:
            raise InferError(f"cannot get the config of model {model!r}: {_msg(e)}", _status(e)) from None
        from .seq2seq import grpc_parameters, http_parameters

        return grpc_parameters(cfg) if self.protocol == "grpc" else http_parameters(cfg.get("config", cfg))

    def is_decoupled(self, model: str) -> bool:
        """Whether the model answers on gRPC streams only (``model_transaction_policy { decoupled: true }``: a
        decoupled lazybatch seq2seq model streams its tokens, client/stream.py)."""
        try:
            cfg = self._client.get_model_config(model)
        except Exception as e:
            raise InferError(f"cannot get the config of model {model!r}: {_msg(e)}", _status(e)) from None
        if self.protocol == "grpc":
            return bool(cfg.config.model_transaction_policy.decoupled)
        return bool(cfg.get("config", cfg).get("model_transaction_policy", {}).get("decoupled", False))

    def example_dims(self, model: str) -> dict[str, tuple[int, ...]]:
        """Sizes the model accepts for its dynamic input dims (the config's ``example_dims``; formats/example_dims.py),
        by input name; empty where it declares none."""
        return parse_example_dims(self.model_parameters(model).get("example_dims"))

    def random_inputs(self, model: str, batch: int = 1, seed: int | None = None) -> dict[str, np.ndarray]:
        """Random inputs of the model's shapes (wildcard dims at the model's ``example_dims``, else 1)."""
        rng = np.random.default_rng(seed)
        out = {}
        examples = self.example_dims(model)
        for t in self.model_info(model).inputs:
            shape = (batch, *feed_shape(t.shape[1:], examples.get(t.name)))
            if t.dtype.kind == "f":
                out[t.name] = rng.standard_normal(shape).astype(t.dtype)
            else:
                out[t.name] = rng.integers(0, 10, shape).astype(t.dtype)
        return out

    def infer(self, model: str, inputs: Mapping[str, np.ndarray], *, sla_ms: float | None = None,
              deadline_unix_ms: float | None = None, priority: int | None = None,
              outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """One request; returns every output (or the named ones) as numpy arrays."""
        mod = self.module
        req_out = [mod.InferRequestedOutput(o) for o in outputs] if outputs else None
        params = request_parameters(sla_ms, deadline_unix_ms, priority)
        kw: dict[str, Any] = {"parameters": params} if params else {}
        if priority:  # Triton's own request priority too: its dynamic batcher orders its queue by it
            kw["priority"] = int(priority)
        if self.timeout_s is not None and self.protocol == "grpc":
            kw["client_timeout"] = self.timeout_s
        try:
            res = self._client.infer(model, make_inputs(mod, inputs), outputs=req_out, **kw)
        except Exception as e:
            raise InferError(_msg(e), _status(e)) from None
        names = list(outputs) if outputs else [t.name for t in self.model_info(model).outputs]
        return {n: res.as_numpy(n) for n in names}

    def timed_infer(self, model: str, inputs: Mapping[str, np.ndarray], **kw: Any) -> tuple[dict[str, np.ndarray],
                                                                                            float]:
        t0 = time.perf_counter()
        out = self.infer(model, inputs, **kw)
        return out, time.perf_counter() - t0

    def latencies(self, model: str, inputs: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]],
                  n: int, *, warmup: int = 3, **kw: Any) -> list[float]:
        """Seconds of each of ``n`` sequential requests after ``warmup`` untimed ones. ``inputs`` is one feed or a
        list of feeds used in turn (seq2seq requests differ in length)."""
        feeds = [inputs] if isinstance(inputs, Mapping) else list(inputs)
        for i in range(warmup):
            self.infer(model, feeds[i % len(feeds)], **kw)
        return [self.timed_infer(model, feeds[i % len(feeds)], **kw)[1] for i in range(n)]

    def median_latency(self, model: str, inputs: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]],
                       n: int, *, warmup: int = 3, **kw: Any) -> float:
        """Median of ``latencies``: with one-sample inputs, the model's batch-1 service time as the server delivers
        it (the benchmarks' reference point)."""
        return statistics.median(self.latencies(model, inputs, n, warmup=warmup, **kw))


def _msg(e: Exception) -> str:
    m = getattr(e, "message", None)
    return str(m() if callable(m) else (m or e))


def _status(e: Exception) -> str | None:
    s = getattr(e, "status", None)
    s = s() if callable(s) else s
    return None if s is None else str(s)
