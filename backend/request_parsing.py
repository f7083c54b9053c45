"""One request's tensors and parameters, checked against the model's config before it joins a batch: a bad request is
answered at once with a message that says what is wrong, instead of failing inside a batch that also holds good
requests.
"""

from __future__ import annotations

import functools
import json
import math
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from lazybatch.formats.stage_manifest import TensorSpec


def validate_request(tensors: Mapping[str, np.ndarray], inputs: list[TensorSpec], max_batch_size: int,
                     allow_nan: bool = True) -> tuple[int, str | None]:
    """Check one request: returns (batch size, None) or (0, what is wrong)."""
    want = {t.name: t for t in inputs}
    missing = [n for n in want if n not in tensors]
    if missing:
        return 0, f"missing input(s) {missing}; the model expects {sorted(want)}"
    extra = sorted(n for n in tensors if n not in want)
    if extra:
        return 0, f"unexpected input(s) {extra}; the model expects {sorted(want)}"
    batch = None
    for name, spec in want.items():
        a = tensors[name]
        if a.dtype != spec.dtype:
            return 0, f"input {name!r} has dtype {a.dtype}, expected {spec.dtype} ({spec.data_type})"
        if a.ndim != len(spec.dims) + 1:
            return 0, (f"input {name!r} has shape {list(a.shape)}, expected [batch, "
                       f"{', '.join(map(str, spec.dims))}]")
        for got, exp in zip(a.shape[1:], spec.dims):
            if exp >= 0 and got != exp:
                return 0, (f"input {name!r} has shape {list(a.shape)}, expected [batch, "
                           f"{', '.join(map(str, spec.dims))}]")
        b = int(a.shape[0])
        if batch is None:
            batch = b
        elif b != batch:
            return 0, f"inputs disagree on the batch size ({batch} vs {b} for {name!r})"
        if not allow_nan and a.dtype.kind == "f" and a.size and not np.isfinite(a).all():
            bad = int(a.size - np.isfinite(a).sum())
            return 0, (f"input {name!r} holds {bad} NaN/Inf value(s); this model refuses them (allow_nan: false "
                       "in its config.pbtxt)")
    if not batch or batch < 1:
        return 0, "batch size must be at least 1"
    if batch > max_batch_size:
        return 0, f"batch size {batch} exceeds the model's max_batch_size {max_batch_size}"
    return batch, None


@dataclass
class RequestOptions:
    """Per-request scheduling options from Triton request parameters."""

    sla_s: float | None = None
    deadline_unix_s: float | None = None
    priority: int = 0


def parse_request_parameters(text: str | None, default_sla_ms: float | None) -> tuple[RequestOptions, str | None]:
    """``sla_ms``, ``deadline_unix_ms`` (absolute, wall clock) and ``request_priority`` from request parameters.

    Other parameters are ignored (clients and Triton add their own). Texts are parsed once and remembered (a client
    sends the same parameters with every request, and this runs on the request's path); each call gets its own
    ``RequestOptions``.
    """
    if not text:
        return RequestOptions(sla_s=None if default_sla_ms is None else default_sla_ms / 1e3), None
    if not isinstance(text, str):
        return _parse_request_parameters(text, default_sla_ms)
    sla_s, deadline, priority, err = _parsed_parameters(text, default_sla_ms)
    return RequestOptions(sla_s, deadline, priority), err


@functools.lru_cache(maxsize=256)
def _parsed_parameters(text: str, default_sla_ms: float | None) -> tuple[float | None, float | None, int, str | None]:
    opts, err = _parse_request_parameters(text, default_sla_ms)
    return opts.sla_s, opts.deadline_unix_s, opts.priority, err


def _parse_request_parameters(text: Any, default_sla_ms: float | None) -> tuple[RequestOptions, str | None]:
    opts = RequestOptions(sla_s=None if default_sla_ms is None else default_sla_ms / 1e3)
    try:
        params = json.loads(text) if isinstance(text, str) else dict(text)
    except (ValueError, TypeError):
        return opts, f"request parameters are not valid JSON: {text!r}"
    if not isinstance(params, dict):
        return opts, f"request parameters must be a JSON object, got {text!r}"
    if "sla_ms" in params and "deadline_unix_ms" in params:
        return opts, "give either sla_ms or deadline_unix_ms, not both"
    if "sla_ms" in params:
        v = params["sla_ms"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            return opts, f"request parameter sla_ms must be a positive number, got {v!r}"
        opts.sla_s = float(v) / 1e3
    if "deadline_unix_ms" in params:
        v = params["deadline_unix_ms"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return opts, f"request parameter deadline_unix_ms must be a number (ms since the epoch), got {v!r}"
        opts.sla_s = None
        opts.deadline_unix_s = float(v) / 1e3
    key = "request_priority" if "request_priority" in params else "priority"  # "priority" is Triton-reserved
    if key in params:
        v = params[key]
        if isinstance(v, bool) or not isinstance(v, int):
            return opts, f"request parameter {key} must be an integer, got {v!r}"
        opts.priority = v
    return opts, None


def check_deadline(opts: RequestOptions) -> str | None:
    """An error message for a request whose own deadline passed before it reached the model, else None."""
    if opts.deadline_unix_s is not None:
        left = opts.deadline_unix_s - time.time()
        if left <= 0:
            return f"the request's deadline passed {-left * 1e3:.1f} ms before it reached the model"
    return None


def sample_classes(batches: Sequence[int], options: Sequence[RequestOptions]) -> list[tuple[float, int]]:
    """(SLA in seconds, inf for none; priority level) per sample of requests of ``batches`` samples with these
    ``options``: the classes of a group that the policy reads (``InlineHooks.inline_batch``)."""
    now = time.time()
    out: list[tuple[float, int]] = []
    for batch, opts in zip(batches, options):
        if opts.deadline_unix_s is not None:
            sla = opts.deadline_unix_s - now
        else:
            sla = opts.sla_s if opts.sla_s is not None else math.inf
        out += [(sla, opts.priority)] * batch
    return out
