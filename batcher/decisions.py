"""Why the scheduler did what it did: one small record per decision, cheap enough to leave on."""

from __future__ import annotations

from collections import deque
from typing import Iterator, NamedTuple

DISPATCH = "dispatch"  # a (sub-)batch was formed and started
PREEMPT = "preempt"  # the active sub-batch was set aside at a stage boundary for newer requests
MERGE = "merge"  # the two topmost sub-batches reached the same stage and became one
SPLIT = "split"  # a sub-batch left a loop body partly (requests with different timestep counts)
REJECT = "reject"  # a request was refused or dropped without running to the end
KINDS = (DISPATCH, PREEMPT, MERGE, SPLIT, REJECT)
# which co-located model got a shared device, and why (batcher/device.py); counted only in the logs of models that
# share a device (SharedDevice.join adds the key), so a model alone reports exactly the kinds above
DEVICE = "device"
# the CPU share moved the model's threads to another nice (backend/cpu_share.py): its own log, counted beside the
# scheduler's only for models in the share
WEIGHT = "weight"
# the CPU share moved the model's threads to another set of cores (cpu_share_split): its own log, as WEIGHT
CORES = "cores"


class Decision(NamedTuple):
    time: float
    kind: str
    stage: int
    batch_size: int
    reason: str
    value: float | None = None  # e.g. the predicted slack in seconds for a preemption

    def explain(self) -> str:
        extra = f" ({self.value * 1e3:+.3f} ms)" if self.value is not None else ""
        return f"t={self.time:.6f}s {self.kind} stage={self.stage} batch={self.batch_size}: {self.reason}{extra}"


class DecisionLog:
    """Counts every decision and keeps the newest ``capacity`` records (a ring buffer)."""

    __slots__ = ("records", "counts", "enabled")

    def __init__(self, capacity: int = 100_000, enabled: bool = True) -> None:
        self.records: deque[Decision] = deque(maxlen=capacity)
        self.counts: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.enabled = enabled

    def add(self, time: float, kind: str, stage: int, batch_size: int, reason: str,
            value: float | None = None) -> None:
        self.counts[kind] += 1
        if self.enabled:
            self.records.append(Decision(time, kind, stage, batch_size, reason, value))

    def __iter__(self) -> Iterator[Decision]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def of(self, kind: str) -> list[Decision]:
        return [d for d in self.records if d.kind == kind]
