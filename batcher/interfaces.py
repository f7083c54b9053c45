"""What the scheduler core and its drivers pass each other: a clock to read, the stage jobs the core returns and
the results the driver hands back.

The simulator runs a job by looking its latency up in a table on a virtual clock; the Triton backend runs it with
onnxruntime on wall time. Nothing here knows which.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping, Protocol, Sequence

from .request import Request


class Clock(Protocol):
    def now(self) -> float: ...


class StageJob:
    """Run ``stage`` on ``requests``; ``batch_size`` may exceed len(requests) when a policy pads (graph batching
    of seq2seq keeps finished sequences in the batch until the longest one ends).

    ``stop`` (static graphs only): run stages ``stage .. stop-1`` as one job, with no decision point between them.
    A policy asks for a span where it predicts that no boundary inside it would be used (batcher/policies/eager.py);
    the executor may then run the span as one call (the backend runs a whole-graph span as one onnxruntime
    session). ``stop`` defaults to ``stage + 1``: one stage, as every policy of the papers runs."""

    __slots__ = ("stage", "requests", "batch_size", "token", "started", "stop")

    def __init__(self, stage: int, requests: list[Request], batch_size: int, token: Any = None,
                 stop: int | None = None) -> None:
        self.stage = stage
        self.requests = requests
        self.batch_size = batch_size
        self.token = token
        self.started = 0.0
        self.stop = stage + 1 if stop is None else stop

    @property
    def span(self) -> range:
        """The stages this job runs."""
        return range(self.stage, self.stop)

    def __repr__(self) -> str:
        span = f", stop={self.stop}" if self.stop != self.stage + 1 else ""
        return f"StageJob(stage={self.stage}{span}, n={len(self.requests)}, batch_size={self.batch_size})"


class StageResult:
    """What an executor reports besides "done".

    ``loop_exits``: ids of requests whose loop (encoder/decoder) ends after this step; None lets the scheduler
    decide from each request's known ``enc_steps``/``dec_steps``. ``errors``: request id -> message for requests
    whose part of the batch failed; the rest of the batch goes on. ``parts``: streamed parts the step produced for
    requests that go on (a decoupled decoder's new tokens), opaque to the core: the next step returns them
    (``Step.parts``), ahead of its answers, so that a request's parts always precede its final answer.
    """

    __slots__ = ("loop_exits", "errors", "parts")

    def __init__(self, loop_exits: Collection[int] | None = None, errors: Mapping[int, str] | None = None,
                 parts: Sequence[Any] = ()) -> None:
        self.loop_exits = loop_exits
        self.errors = errors
        self.parts = parts

