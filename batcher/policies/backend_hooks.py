"""What a policy may offer the Triton backend beyond the ``Policy`` interface: the inline route's three questions,
and the serving costs the backend measures for a policy that weighs decision points against them.

The simulator never asks them; the backend (``backend/inline.py``, ``backend/table_keeper.py``) asks only a policy
that has them (``inline_hooks``, ``serving_costs``), so ``Policy`` stays the five-method contract with the scheduler
and a new policy owes nothing here. Today only the default (``eager``) implements them.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from ..interfaces import StageJob


@runtime_checkable
class InlineHooks(Protocol):
    """Whether a group that reaches Triton's ``execute`` may run there as whole-graph passes, outside the
    scheduler (``InlineRoute.run``), as Triton's own backends do."""

    @property
    def needs_classes(self) -> bool:
        """Whether ``inline_batch`` reads its ``classes`` (the caller need not compute them otherwise); a trait of
        the policy as built, which the backend reads once."""
        ...

    def inline_batch(self, now: float, n: int, classes: "Sequence[tuple[float, int]] | None" = None) -> int:
        """May ``n`` samples that find the device idle run as whole-graph passes outside the scheduler? The batch
        size of those passes (``n``: one pass; less: the group served in passes of that size, one after the
        other), or 0: no, the scheduler must see them.

        Only right where this policy would itself start them so and place no decision point in their passes.
        ``classes``: one (SLA in seconds, inf for none; priority level) per sample, where the caller knows them."""
        ...

    def inline_done(self, start: float, end: float, n: int) -> None:
        """Passes allowed by ``inline_batch`` ran from ``start`` to ``end``: count its arrivals and busy time."""
        ...

    def inline_wait(self, now: float, running: StageJob | None, pending: int) -> float | None:
        """A group handed to ``execute`` finds the scheduler busy (``running``: the job onnxruntime runs now, if
        any; ``pending``: samples handed over but not yet queued). The seconds until the scheduler should hold
        nothing, where that group could not use any decision point of the work held (it would only start after
        that work, as under Triton's batcher), so the backend may hold it in ``execute`` and run it inline then;
        None: the group goes to the scheduler (it may preempt or merge).

        Called from another thread than the scheduler's, without its lock: an answer read from a state that
        changes meanwhile only makes the group wait up to a bound, or go to the scheduler."""
        ...


@runtime_checkable
class ServingCosts(Protocol):
    """A policy that weighs a decision point against what it costs on this server takes the backend's
    measurements (the simulator has none: its policies keep what they were built with)."""

    def measured_costs(self, *, boundary_s: float | None = None, fused_ratio: float | None = None) -> None:
        """``boundary_s``: what one job costs the scheduler thread besides onnxruntime (a moving average);
        ``fused_ratio``: a whole-graph pass / the stages' times summed at the same batch size. None: unchanged."""
        ...


def serving_costs(policy: object) -> ServingCosts | None:
    """The policy as ``ServingCosts`` where it takes them; None: nothing to tell it."""
    return policy if isinstance(policy, ServingCosts) else None


def inline_hooks(policy: object) -> InlineHooks | None:
    """The policy as ``InlineHooks`` where it offers them; None: every request goes through the scheduler."""
    return policy if isinstance(policy, InlineHooks) else None
