"""Token streaming from a decoupled seq2seq model over gRPC: each request's parts as they come, and their timing.

A decoupled lazybatch model (``lazybatch repo add --decoupled``) answers a request with several responses: each
holds the tokens made since the previous one (``output_tokens`` padded with -1, ``output_len`` per row), and the
last carries Triton's final flag. Here every request gets a gRPC stream of its own on one shared channel, so that
an error response is always known to belong to its request (tritonclient's stream callback drops the request id of
an error), and the stream's end is the request's end.

Timing per request: time to first token (the first part that holds a token), time per output token after the first
((end - first) / (tokens - 1), what serving papers call TPOT or inter-token latency), and end-to-end latency.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping

import numpy as np

from .api import NP_TO_DATATYPE, request_parameters

FINAL = "triton_final_response"  # set on every streamed response when the request asks for it (below)


@dataclass
class Streamed:
    """One request's streamed answer."""

    tokens: list[list[int]] = field(default_factory=list)  # per row, the parts joined
    parts: int = 0  # responses received
    sent_at: float = 0.0  # perf_counter() when the request was written
    first_at: float = math.nan  # when the first token arrived
    first_tokens: int = 0  # tokens in the first part that held any (stream_interval_tokens K: up to K)
    done_at: float = math.nan  # when the final response arrived (or the error)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not math.isnan(self.done_at)

    @property
    def n_tokens(self) -> int:
        return max((len(t) for t in self.tokens), default=0)

    @property
    def ttft_s(self) -> float:
        return self.first_at - self.sent_at

    @property
    def latency_s(self) -> float:
        return self.done_at - self.sent_at

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first part's (NaN where the first part held them all): with a
        response every K tokens the first part brings K, and the rest take the time after it."""
        n, first = self.n_tokens, max(1, self.first_tokens)
        return (self.done_at - self.first_at) / (n - first) if n > first else math.nan


def infer_request(model: str, inputs: Mapping[str, np.ndarray], parameters: Mapping[str, Any] | None = None,
                  request_id: str = "") -> Any:
    """A ``ModelInferRequest`` with the tensors as raw contents, asking Triton to flag the final response."""
    from tritonclient.grpc import service_pb2

    req = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for name, arr in inputs.items():
        a = np.ascontiguousarray(arr)
        req.inputs.add(name=name, datatype=NP_TO_DATATYPE[a.dtype], shape=list(a.shape))
        req.raw_input_contents.append(a.tobytes())
    for k, v in (parameters or {}).items():
        p = req.parameters[k]
        if isinstance(v, bool):
            p.bool_param = v
        elif isinstance(v, int):
            p.int64_param = v
        elif isinstance(v, float):
            p.double_param = v
        else:
            p.string_param = str(v)
    req.parameters["triton_enable_empty_final_response"].bool_param = True
    return req


class StreamClient:
    """``async with StreamClient(url) as c: out = await c.generate(model, feeds)``: one request, streamed."""

    def __init__(self, url: str) -> None:
        import grpc.aio
        from tritonclient.grpc import service_pb2_grpc

        limit = 2**31 - 1  # as tritonclient's own channels: no message size cap of gRPC's
        self._channel = grpc.aio.insecure_channel(url, options=[("grpc.max_send_message_length", limit),
                                                                ("grpc.max_receive_message_length", limit)])
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    async def __aenter__(self) -> "StreamClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def parts(self, model: str, inputs: Mapping[str, np.ndarray], *, sla_ms: float | None = None,
                    timeout_s: float | None = None) -> AsyncIterator[tuple[dict[str, np.ndarray], bool]]:
        """(outputs, final) of each response; raises ``InferError`` on an error response."""
        from tritonclient.grpc import InferResult

        from .api import InferError

        req = infer_request(model, inputs, request_parameters(sla_ms))
        call = self._stub.ModelStreamInfer(iter([req]), timeout=timeout_s)
        ended = False
        try:
            async for resp in call:  # the server ends the stream after the final response (we sent one request)
                if resp.error_message:
                    ended = True
                    raise InferError(resp.error_message)
                res = InferResult(resp.infer_response)
                final = resp.infer_response.parameters[FINAL].bool_param
                outs = {o.name: res.as_numpy(o.name) for o in resp.infer_response.outputs}
                if outs:
                    yield outs, final
            ended = True
        except InferError:
            raise
        except Exception as e:  # grpc errors: deadline, server gone
            details = getattr(e, "details", None)
            raise InferError(str(details() if callable(details) else e)) from None
        finally:
            if not ended:  # the caller stopped early, or a gRPC error: the server stops the request
                call.cancel()

    async def generate(self, model: str, inputs: Mapping[str, np.ndarray], *, sla_ms: float | None = None,
                       timeout_s: float | None = None) -> Streamed:
        """Send one request and collect its parts with their arrival times; an error is recorded, not raised."""
        from .api import InferError

        out = Streamed(sent_at=time.perf_counter())
        rows = inputs["src_tokens"].shape[0] if "src_tokens" in inputs else 1
        out.tokens = [[] for _ in range(rows)]
        try:
            async for part, final in self.parts(model, inputs, sla_ms=sla_ms, timeout_s=timeout_s):
                now = time.perf_counter()
                out.parts += 1
                add_part(out.tokens, part)
                if math.isnan(out.first_at) and out.n_tokens:
                    out.first_at, out.first_tokens = now, out.n_tokens
                if final:
                    out.done_at = now
        except InferError as e:
            out.error = str(e)
            out.done_at = time.perf_counter()
        else:
            if math.isnan(out.done_at):
                out.error = "the stream ended without a final response"
                out.done_at = time.perf_counter()
        return out


def add_part(tokens: list[list[int]], part: Mapping[str, np.ndarray]) -> None:
    """Append one response's new tokens to each row's list (``output_len`` says how many of the row are real)."""
    toks, lens = part["output_tokens"], part["output_len"]
    for row, acc in enumerate(tokens):
        acc.extend(int(t) for t in toks[row, :int(lens[row, 0])])
