"""Inference requests as the scheduler tracks them."""

from __future__ import annotations

import math
from enum import Enum
from typing import Any

from .errors import ConfigError


class Status(str, Enum):
    """How a request ended. Names follow Triton's error codes where one applies."""

    OK = "OK"
    ERROR = "INTERNAL"
    CANCELLED = "CANCELLED"
    REJECTED = "UNAVAILABLE"  # admission refused (queue full, deadline impossible, scheduler closed)
    UNAVAILABLE = "UNAVAILABLE"  # held when the model was unloaded


class Request:
    """One inference request.

    ``enc_steps`` is known on arrival (the input length); ``dec_steps`` is the true output length when it is known
    in advance (the simulator); a live backend leaves it None and its executor reports when decoding ends.
    Progress fields (``loop_iter``, ``start``, ``first_token``, ``finish``, ``status``) are written by the scheduler
    only; ``first_token`` is when the request's first decoder step ended (its first token, on a decoder model).
    """

    __slots__ = ("id", "arrival", "deadline", "enc_steps", "dec_steps", "priority", "payload",
                 "loop_iter", "start", "first_token", "finish", "status", "error", "est", "cancelled")

    def __init__(self, id: int, arrival: float, *, sla: float | None = None, deadline: float | None = None,
                 enc_steps: int = 1, dec_steps: int | None = None, priority: int = 0, payload: Any = None) -> None:
        if not isinstance(arrival, (int, float)) or not math.isfinite(arrival):
            raise ConfigError(f"arrival time must be a finite number, got {arrival!r}", field="arrival")
        if sla is not None and deadline is not None:
            raise ConfigError("give either an SLA target or an absolute deadline, not both", field="sla")
        if sla is not None:
            if not isinstance(sla, (int, float)) or not (sla > 0):
                raise ConfigError(f"SLA target must be a positive number of seconds, got {sla!r}", field="sla")
            deadline = arrival + sla
        elif deadline is not None:
            if not isinstance(deadline, (int, float)) or not (deadline > arrival):
                raise ConfigError(f"deadline {deadline!r} must be later than the arrival time {arrival!r}",
                                  field="deadline")
        else:
            deadline = math.inf
        if not isinstance(enc_steps, int) or enc_steps < 1:
            raise ConfigError(f"enc_steps must be a positive integer, got {enc_steps!r}", field="enc_steps")
        if dec_steps is not None and (not isinstance(dec_steps, int) or dec_steps < 1):
            raise ConfigError(f"dec_steps must be a positive integer, got {dec_steps!r}", field="dec_steps")
        self.id = id
        self.arrival = float(arrival)
        self.deadline = float(deadline)
        self.enc_steps = enc_steps
        self.dec_steps = dec_steps
        self.priority = priority
        self.payload = payload
        self.loop_iter = 0
        self.start: float | None = None
        self.first_token: float | None = None
        self.finish: float | None = None
        self.status: Status | None = None
        self.error: str | None = None
        self.est = 0.0  # predicted single-input execution time, filled in by a policy
        self.cancelled = False

    @property
    def sla(self) -> float:
        return self.deadline - self.arrival

    @property
    def latency(self) -> float | None:
        return None if self.finish is None else self.finish - self.arrival

    @property
    def done(self) -> bool:
        return self.status is not None

    def __repr__(self) -> str:
        return f"Request(id={self.id}, arrival={self.arrival:.6g}, status={self.status and self.status.name})"
