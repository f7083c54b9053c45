"""Eager's urgency classes (rule 5 of batcher/policies/eager/policy.py, ``eager:urgency=true``): a queued request
whose class (``class_key``: priority level, then SLA) outranks members of the running sub-batch, and which would
miss its deadline behind it but meets it by going now, preempts at the next boundary (``preemption``); it merges
with the sub-batch it set aside only where the merged batch still meets its deadline (``keeps_apart``); a queue
that starts on an idle device lets such requests run ahead (``split``); while outranking traffic arrives, jobs are
cut (``cut``) and sub-batches kept small (``batch``) so that a boundary is there when it is needed."""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from ...decisions import PREEMPT
from ...request import Request
from ..lazy import Entry
from .work_conserving import MAX_UTILISATION

if TYPE_CHECKING:
    from .policy import EagerBatching

# While outranking traffic arrives, a job runs at most (tightest SLA - URGENT_ALONE x the batch-1 pass): an urgent
# request that arrives as a job starts must still have room for that job and for its own pass, with a margin for
# the table's error and the boundary's hand-off.
URGENT_ALONE = 1.25


def class_key(r: Request) -> tuple[int, float]:
    """A request's urgency class: its priority level (Triton's: smaller is more urgent), then its SLA (rounded to
    0.1 ms, so that deadlines sent as wall-clock times do not make a class of every request). A smaller key
    outranks a larger one; requests with equal keys are one class, served in Triton's order."""
    return r.priority, round(r.sla, 4)


class UrgencyRule:
    """The classes seen lately (in the arrival-rate window) and what they make the policy do."""

    def __init__(self, policy: EagerBatching) -> None:
        self.policy = policy
        self.rates = policy.rates
        self.classes: deque[tuple[float, tuple[int, float]]] = deque()  # (arrival, class_key) in the rate window
        self.class_count: dict[tuple[int, float], int] = {}

    def observe(self, now: float, key: tuple[int, float]) -> None:
        """Count an arrival's class in the rate window (the classes seen lately decide where boundaries stay)."""
        self.classes.append((now, key))
        self.class_count[key] = self.class_count.get(key, 0) + 1
        edge = now - self.rates.window
        classes, count = self.classes, self.class_count
        while classes and classes[0][0] < edge:
            _, old = classes.popleft()
            left = count[old] - 1
            if left:
                count[old] = left
            else:
                del count[old]

    def budget(self) -> float | None:
        """The tightest SLA (s) among the recent arrivals that outrank the loosest recent class; None with one class
        (or none with an SLA)."""
        keys = self.class_count
        if len(keys) < 2:
            return None
        loosest = max(keys)
        tight = min(k[1] for k in keys if k < loosest)
        return tight if math.isfinite(tight) else None

    def batch(self, now: float) -> int:
        """While outranking traffic arrives, the largest sub-batch whose every stage fits the room its tightest SLA
        leaves (``cut``'s room): an urgent request that arrives as a stage of that batch starts waits for that
        stage at least, however short the jobs are cut. On a model whose batches cost about a run per sample
        (ResNet-50 on a CPU), a batch of 8 makes one stage, or one merged segment (``fuse_segments``), longer than
        an interactive SLA of 2 x t1. Never below the batch the arrival rate needs (``MAX_UTILISATION``, as
        ``WorkConserving.batch_size``), unless a sample costs no more in the smaller batch than in the largest
        (within ``min_gain``): then no batch size keeps up better. ``max_batch_size`` with one class, or where even
        batch 1 does not fit."""
        pol = self.policy
        cap = pol.max_batch_size
        budget = self.budget()
        if budget is None:
            return cap
        scale = pol.time_scale
        room = budget - URGENT_ALONE * pol.whole[1] * scale
        b = 0
        longest = pol.longest
        while b < cap and longest[b + 1] * scale <= room:
            b += 1
        if b == 0:
            return cap
        # past capacity the queue grows whatever the batch; a smaller batch then costs only where a sample costs
        # more in it than in the largest batch (the model's batching gain): allowed within min_gain of it
        whole = pol.whole
        lam = self.rates.rate(now) * scale
        floor = whole[cap] / cap * (1.0 + pol.min_gain)
        while b < cap and lam * whole[b] > MAX_UTILISATION * b and whole[b] / b > floor:
            b += 1
        return b

    def cut(self, now: float, s: int, m: int) -> int:
        """The last boundary a job of ``m`` from stage ``s`` may run to while outranking requests arrive: an urgent
        request that turns up as the job starts waits for all of it, and then needs its own pass within its SLA.
        The end of the graph where no outranking class was seen lately, or where its SLA is too tight for even
        that (a boundary cannot save it)."""
        pol = self.policy
        n = pol.graph.n
        budget = self.budget()
        if budget is None or s + 1 >= n:
            return n
        scale = pol.time_scale
        room = budget - URGENT_ALONE * pol.whole[1] * scale
        if room <= 0.0:
            return n
        pre = pol.prefix[m]
        for b in range(s + 1, n):
            if (pre[b + 1] - pre[s]) * scale > room:
                return b
        return n

    def finish_times(self, now: float, s: int, m: int, k: int) -> tuple[float, float, bool]:
        """``k`` urgent requests that preempt a sub-batch of ``m`` at stage ``s``: when they finish (running ahead
        alone, or merging at ``s`` where that is sooner), when the sub-batch then finishes, and whether they
        merge."""
        pol = self.policy
        pre = pol.prefix
        scale = pol.time_scale
        n = pol.graph.n
        alone = now + pol.whole[k] * scale
        rest = (pre[m][n] - pre[m][s]) * scale
        mk = m + k
        if mk <= pol.max_batch_size:
            merged = now + (pre[k][s] + pre[mk][n] - pre[mk][s]) * scale
            if merged <= alone:
                return merged, merged, True
        return alone, alone + rest, False

    def preemption(self, now: float) -> bool:
        """Preempt for queued requests that outrank members of the running sub-batch and would miss their deadline
        behind the running sub-batch, where going now meets it; True if it did.

        Without: they start when the top sub-batch ends, as one batch (Triton's order). With: they run stages
        0..s-1 and merge at s, or run ahead alone (``finish_times``). The running sub-batch keeps every deadline
        that holds without the preemption, whatever its priority level: a preemption spends slack only, the
        slack predictor's principle. (Simulated on ResNet-50's table at 100% load with 20% interactive requests,
        letting a more urgent level break bulk deadlines cut interactive misses from 19% to 11% but raised bulk
        misses from 15% to 19%, against 13% under Triton's batcher: the bulk was paying for it.)"""
        pol = self.policy
        stack = pol.stack
        top = stack[-1]
        # outranking some of the running sub-batch is enough: its members keep every deadline they would meet
        # (below), and a member whose deadline is lost protects nothing
        outranked = max(class_key(r) for r in top.reqs)
        cands = [r for r in pol.infq if class_key(r) < outranked and not r.cancelled]
        if not cands:
            return False
        s, m = top.node, len(top.reqs)
        scale = pol.time_scale
        rest = (pol.prefix[m][pol.graph.n] - pol.prefix[m][s]) * scale
        waiting = [r for r in cands if r.deadline < now + rest + pol.whole[min(len(cands),
                                                                               pol.max_batch_size)] * scale]
        if not waiting:
            return False  # they meet their deadlines after the running sub-batch: no reason to set it aside
        group: list[Request] = []
        for r in sorted(waiting, key=lambda r: r.deadline):
            if len(group) >= pol.max_batch_size:
                break
            done, _, _ = self.finish_times(now, s, m, len(group) + 1)
            if done <= (group[0].deadline if group else r.deadline):
                group.append(r)
        if not group:
            return False  # lost even if they went now: a preemption would only delay the others
        # as many queued requests as the group's deadline allows go with it (a pass of one wastes what a batch
        # would share; near saturation that is the bulk's throughput)
        dmin = min(r.deadline for r in group)
        chosen = set(map(id, group))
        for r in pol.infq:
            if len(group) >= pol.max_batch_size:
                break
            if id(r) in chosen or r.cancelled:
                continue
            if self.finish_times(now, s, m, len(group) + 1)[0] > min(dmin, r.deadline):
                break
            group.append(r)
        _, top_done, merges = self.finish_times(now, s, m, len(group))
        if any(now + rest <= q.deadline < top_done for q in top.reqs):
            return False
        pol.run_ahead(now, group, f"{len(group)} outranking request(s) would miss their deadline behind the running "
                      "batch" + ("; they merge at this stage" if merges else "; they run ahead alone"))
        return True

    def split(self, now: float) -> Entry | None:
        """The batch just started on an idle device (the top entry, at stage 0): its members that outrank the
        loosest class in it and would miss their deadline in the whole batch's pass, but meet it in a pass of
        their own, run ahead of the rest (the entry returned, which the policy pushes above it, unmerged), with as
        many of the rest as their deadline allows. The rest keeps every deadline that holds in the whole pass.
        None: the batch runs whole."""
        pol = self.policy
        e = pol.stack[-1]
        reqs = e.reqs
        if len(reqs) < 2:
            return None
        loosest = max(class_key(r) for r in reqs)
        urgent = [r for r in reqs if class_key(r) < loosest]
        if not urgent:
            return None
        scale = pol.time_scale
        whole = pol.whole
        together = now + whole[len(reqs)] * scale
        # those the whole batch would make late and a pass of their own would not
        urgent = [r for r in urgent if r.deadline < together]
        urgent = [r for r in urgent if r.deadline >= now + whole[len(urgent)] * scale]
        if not urgent:
            return None
        dmin = min(r.deadline for r in urgent)
        if dmin < now + whole[len(urgent)] * scale:
            return None
        taken = set(map(id, urgent))
        rest = [r for r in reqs if id(r) not in taken]
        while rest and now + whole[len(urgent) + 1] * scale <= min(dmin, rest[0].deadline):
            dmin = min(dmin, rest[0].deadline)
            urgent.append(rest.pop(0))  # as many as their deadline allows go ahead with them
        if not rest:
            return None
        k = len(urgent)
        after = now + (whole[k] + whole[len(rest)]) * scale
        if any(together <= q.deadline < after for q in rest):
            return None
        e.reqs = rest
        e.rem = sum(r.est for r in rest)
        e.dmin = min(r.deadline for r in rest)
        u = Entry(0, urgent, sum(r.est for r in urgent), dmin)
        u.urgent = True
        pol.log.add(now, PREEMPT, 0, len(rest), f"{k} outranking request(s) run ahead of the batch for their "
                                                "deadline")
        return u

    def keeps_apart(self, now: float, a: Entry, size: int) -> bool:
        """Whether urgent sub-batch ``a`` stays apart from the one below (merged: ``size``): where the merged batch
        would miss a deadline of its own that running ahead alone keeps. The merged pass's rest is taken at
        ``URGENT_ALONE`` x the table's time, the margin the cut keeps for the table's error: merged on the bare
        prediction, an urgent request served in-process missed its SLA by 8% (20.8 ms against 19.2 ms; the merged
        pass of 5 ran 13% over a table profiled with 3 repetitions; tests/backend/test_urgency_runtime.py)."""
        pol = self.policy
        pre, s, n, scale = pol.prefix, a.node, pol.graph.n, pol.time_scale
        merged = now + URGENT_ALONE * (pre[size][n] - pre[size][s]) * scale
        alone = now + (pre[len(a.reqs)][n] - pre[len(a.reqs)][s]) * scale
        return merged > a.dmin >= alone

    def admitted_to_decode(self, room: int) -> list[Request]:
        """Seq2seq graphs: the queued requests (at most ``room``) that outrank the running sub-batch's loosest class;
        they join the running decode at the next step where the admission rule would hold them."""
        pol = self.policy
        outranked = max(class_key(r) for r in pol.stack[-1].reqs)
        return [r for r in pol.infq if class_key(r) < outranked and not r.cancelled][:max(room, 0)]
