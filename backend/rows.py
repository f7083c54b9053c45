"""A Triton request split into samples, and the samples' rows joined back into batches.

A Triton request with batch size b becomes b scheduler requests (one ``Sample`` each): the latency table, the slack
predictor and max_batch_size all count samples. Its ``Parent`` is answered once all its samples are done, or at once
when one fails. The seq2seq runtime (``backend/seq2seq.py``) extends ``Sample`` with a sequence's state. And the items
on the runtime's inbox, which its scheduler thread takes (``BackendRuntime.take_inputs``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import numpy as np

from lazybatch.batcher.request import Request

if TYPE_CHECKING:
    from .request_parsing import RequestOptions

# A sample's tensor is a row of a batched array: (array, row). Kept as the pair, not a 1-row view, so that a
# sub-batch whose members are the rows of one array, in order, is passed on without a copy. On the device path the
# array is an onnxruntime OrtValue on the provider's device (sessions/device_tensors.py).
Row = tuple[np.ndarray, int]


class Parent:
    """One client request (possibly several samples)."""

    __slots__ = ("handle", "inputs", "samples", "remaining", "rows", "answered", "checked", "cancel_seen")

    def __init__(self, handle: Any, inputs: dict[str, np.ndarray], batch: int) -> None:
        self.handle = handle
        self.inputs = inputs
        self.samples: list[Request] = []
        self.remaining = batch
        self.rows: list[dict[str, Row] | None] = [None] * batch
        self.answered = False
        self.checked = 0.0  # when is_cancelled() was last asked (backend/cancel_watch.py)
        self.cancel_seen = False


class Sample:
    """One sample of a ``Parent``: a scheduler request's payload, with the tensors earlier stages left it."""

    __slots__ = ("parent", "row", "tensors")

    def __init__(self, parent: Parent, row: int) -> None:
        self.parent = parent
        self.row = row
        self.tensors: dict[str, Row] = {}


def join_rows(parts: list[Row]) -> np.ndarray:
    """The rows as one batch: a slice of the shared array when they are consecutive rows of it, else a copy."""
    a0, k0 = parts[0]
    n = len(parts)
    if all(a is a0 and k == k0 + i for i, (a, k) in enumerate(parts)):
        return a0 if k0 == 0 and n == a0.shape[0] else a0[k0:k0 + n]
    return np.concatenate([a[k:k + 1] for a, k in parts], axis=0)


def gather(inp: Any, reqs: list[Request], join: Callable[[list[Row]], Any] = join_rows) -> Any:
    """One stage input (a model input, or a tensor an earlier stage left with each request) as one batch:
    ``join_rows``, or the runner's own join where its tensors live on a device (``StageRunner.join``)."""
    if inp.source is None:
        return join([(r.payload.parent.inputs[inp.name], r.payload.row) for r in reqs])
    return join([r.payload.tensors[inp.name] for r in reqs])


class Group(NamedTuple):
    """Inbox item: the requests of one execute call, admitted together (``BackendRuntime.submit_group``)."""

    items: list[tuple[Parent, RequestOptions, float]]


class Call(NamedTuple):
    """Inbox item: a call to make on the scheduler thread (a grant from the device group's arbiter, which only
    that thread may hand to the scheduler)."""

    fn: Callable[[], None]


WAKE = object()  # inbox item: wake the scheduler thread to look again (the inline route switched on or off)
