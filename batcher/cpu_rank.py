"""Which co-located models yield the CPU to which, and how far: the rank rule of the CPU share
(docs/colocation.md, "The CPU through the operating system").

Why deadline-monotonic: where the processor preempts (a CPU's kernel does, in microseconds), the fixed priority order
that meets the most deadlines gives the shorter relative deadline the higher priority (Leung and Whitehead, 1982). A
model's relative deadline is its SLA. A declared role comes before it, so that an operator can name a model
latency-critical or best effort whatever its SLA. Models of equal rank are left equal: latency moves between models
only where an SLA or a declared role asks for it.

How far: each rank above a model that is active (had a request within the share's window) lowers it one step of
``NICE_STEPS``. The kernel's fair scheduler weighs nice 0 / 10 / 19 as 1024 / 110 / 15, so each step yields about
ten times the CPU. Measured on the quickstart's pair, nice 10, 19 and SCHED_IDLE gave the small model the same
latency (docs/colocation.md): the step is not tuned finer than that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

LATENCY_CRITICAL, AUTO, BEST_EFFORT = "latency_critical", "auto", "best_effort"
ROLES = (LATENCY_CRITICAL, AUTO, BEST_EFFORT)
NICE_STEPS = (0, 10, 19)  # the nice value of a model with 0, 1, 2 or more ranks above it active


@dataclass(frozen=True)
class ShareMember:
    """One co-located model as the rank rule sees it."""

    name: str
    sla_ms: float | None = None  # its relative deadline; None: none (ranks after every SLA)
    role: str = AUTO
    split: bool = True  # whether it takes its part of the cores while ranks meet (cpu_share_split)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")

    def rank(self) -> tuple[int, float]:
        """Smaller is more urgent: the declared role, then the SLA."""
        return ROLES.index(self.role), self.sla_ms if self.sla_ms else math.inf


def nice_steps(first: int = NICE_STEPS[1]) -> tuple[int, ...]:
    """The steps with ``first`` (1..19) the nice under one active rank above: a model's ``cpu_share_nice``."""
    first = int(first)
    if not 1 <= first <= 19:
        raise ValueError(f"the nice under one more urgent model must be 1..19, got {first}")
    return (0, first, max(first, NICE_STEPS[2]))


def nice_for(me: ShareMember, active: Iterable[ShareMember], steps: tuple[int, ...] = NICE_STEPS) -> int:
    """The nice value ``me`` takes while ``active`` (the other members with recent requests) are active."""
    mine = me.rank()
    above = {m.rank() for m in active if m.rank() < mine}
    return steps[min(len(above), len(steps) - 1)]


def cores_for(me: ShareMember, active: Iterable[ShareMember], cores: Sequence[int]) -> tuple[int, ...] | None:
    """The cores ``me``'s threads keep while ``active`` (the other members with recent requests) are active, or None:
    every core.

    Why a partition on top of the nice: on two cores, weights did not keep a 1 ms model's p99 beside a neighbour
    that batches on both cores, and a core per model did (Triton's host policies carried 6.7-9.3x the best-effort
    traffic, docs/results/colocation_capacity.md). So while the most urgent active rank and a less urgent one are
    both active, the most urgent takes the first half of ``cores`` (at least one) and every member below it the
    rest; alone, beside equals, on one core, or where ``me`` or the others do not split, nothing is split. A member
    keeps its part while it is idle itself, so that its next request finds its cores free."""
    cs = sorted(cores)
    mine = me.rank()
    ranks = {m.rank() for m in active if m.split} | {mine}
    if not me.split or len(cs) < 2 or len(ranks) < 2:
        return None
    half = max(1, len(cs) // 2)
    return tuple(cs[:half]) if mine == min(ranks) else tuple(cs[half:])


# The kernel's fair-scheduler weight of each nice value, -20 .. 19 (kernel/sched/core.c, sched_prio_to_weight): a
# runnable thread's share of a contended core is its weight over the sum of the runnable threads' weights.
CFS_WEIGHTS = (88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916,
               9548, 7620, 6100, 4904, 3906, 3121, 2501, 1991, 1586, 1277,
               1024, 820, 655, 526, 423, 335, 272, 215, 172, 137,
               110, 87, 70, 56, 45, 36, 29, 23, 18, 15)


def cfs_weight(nice: int) -> int:
    """The fair scheduler's weight of ``nice`` (clamped to -20 .. 19, as setpriority clamps it)."""
    return CFS_WEIGHTS[min(max(int(nice), -20), 19) + 20]
