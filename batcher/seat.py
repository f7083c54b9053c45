"""A model's seat on a shared device: which gate its scheduler asks before each job, if any.

Why an object of its own: a device group's membership appears after the model loaded (when a second member loads)
and changes while it serves (the arbiter restarts, or goes and the model schedules alone). The ``Scheduler`` takes
its seat at construction and reads the gate through it at each decision; who holds the seat changes only through
the seat's own methods (``take``, ``leave``), never by writing the scheduler's attributes from outside. A seat
nobody took is a model with the device to itself: nothing is asked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .device import DeviceMember


class DeviceSeat:
    """The gate a scheduler asks (``DeviceMember``: batcher/device.py, or a device group's ``ArbiterGate``)."""

    __slots__ = ("gate",)

    def __init__(self) -> None:
        self.gate: DeviceMember | None = None  # None: the device is the model's own

    def take(self, gate: "DeviceMember") -> None:
        """``gate`` is asked before each job from now on: a join, or a rejoin after the arbiter restarted."""
        self.gate = gate

    def leave(self, gate: "DeviceMember") -> None:
        """``gate`` is gone (its arbiter died): the model has the device to itself again. A seat another gate took
        since is left as it is."""
        if self.gate is gate:
            self.gate = None
