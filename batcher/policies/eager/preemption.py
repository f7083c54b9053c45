"""Eager's preemption rule (rules 2-4 of batcher/policies/eager/policy.py): queued requests preempt the running
sub-batch at a stage boundary only where the latency table predicts a lower mean latency over everyone concerned,
counting the requests expected to arrive meanwhile (``gain``), never at the price of a deadline the running
sub-batch would meet (SLA guard) or of a tail longer than Triton's (tail guard); and a job runs through every
boundary at which no preemption could pay more than the boundary costs (``stop_benefit``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .policy import EagerBatching

# No preemption may make a request of the running sub-batch take longer than this many whole passes at the
# merged batch size in all (its wait included).
TAIL_PASSES = 2.0
# A preemption must predict at least this much lower mean latency (relative): a margin over the table's own error.
DEFAULT_MIN_GAIN = 0.02


class PreemptionRule:
    """Where preempting pays, on static graphs (the table's prefix sums, ``policy.prefix``/``policy.whole``)."""

    def __init__(self, policy: EagerBatching) -> None:
        self.policy = policy
        self._rate = policy.rates.rate
        self._busy_rate = policy.rates.busy_rate

    def gain(self, s: int, m: int, k: int, p: int, lam: float) -> tuple[float, float, float]:
        """Predicted (mean latency without the preemption, with it, per-request saving x requests) when ``k``
        newcomers preempt the top sub-batch of ``m`` at stage ``s``, ``p`` requests wait below, and requests keep
        arriving at ``lam`` per second. Times are from now, in table seconds.

        Without (Triton's order): the top finishes (C); the newcomers and what arrived meanwhile (lam*C) run the
        whole graph as one batch (D). With: the newcomers run stages 0..s-1 (A), merge and run s..n-1 with the top
        (B); what arrives meanwhile (lam*(A+B)) waits for that and then runs the whole graph (E). The sub-batches
        below wait for both either way, counted by how long the device is busy before they can go on."""
        pol = self.policy
        pre = pol.prefix
        whole = pol.whole
        cap = pol.max_batch_size
        scale = pol.time_scale
        n = pol.graph.n
        c = (pre[m][n] - pre[m][s]) * scale
        a_n = lam * c
        d = whole[min(cap, max(1, round(k + a_n)))] * scale
        no = m * c + (k + p) * (c + d) + a_n * (c / 2 + d)
        a = pre[k][s] * scale
        mk = min(cap, m + k)
        b = (pre[mk][n] - pre[mk][s]) * scale
        ab = a + b
        a_p = lam * ab
        e = whole[min(cap, max(1, round(a_p)))] * scale if a_p > 0 else 0.0
        yes = (m + k + p) * ab + a_p * (ab / 2 + e)
        no_mean = no / (m + k + p + a_n)
        yes_mean = yes / (m + k + p + a_p)
        return no_mean, yes_mean, (no_mean - yes_mean) * (m + k + p)

    def best(self, now: float) -> tuple[int, float]:
        """How many queued requests preempt now (0: none), and the predicted saving in seconds of summed latency."""
        pol = self.policy
        stack = pol.stack
        top = stack[-1]
        m = len(top.reqs)
        room = pol.cap - m  # what can still merge with the preempted sub-batch
        k = min(len(pol.infq), room)
        if k <= 0:
            return 0, 0.0
        s = top.node
        n = pol.graph.n
        p = sum(len(e.reqs) for e in stack[:-1])
        lam = self._rate(now)
        no, yes, saving = self.gain(s, m, k, p, lam)
        if yes >= no * (1.0 - pol.min_gain):
            return 0, saving
        # SLA guard: a deadline of the running sub-batch that holds without the preemption must hold with it
        pre = pol.prefix
        scale = pol.time_scale
        mk = min(pol.max_batch_size, m + k)
        finish = now + (pre[k][s] + pre[mk][n] - pre[mk][s]) * scale
        if now + (pre[m][n] - pre[m][s]) * scale <= top.dmin < finish:
            return 0, saving
        # tail guard: a request set aside again and again would wait longer than under Triton's batcher, where
        # the worst is about the batch ahead of it and its own (two passes); the mean gain must not cost the p99
        # the sub-batches below wait for it too, and so do the queued requests (the newcomers finish with it)
        oldest = min(min(r.arrival for e in stack for r in e.reqs), pol.infq[0].arrival)
        if finish - oldest > TAIL_PASSES * pol.whole[1] * scale:
            return 0, saving
        return k, saving

    def stop_benefit(self, now: float, s: int, m: int, queued: int | None = None, *,
                     lam: float | None = None) -> int:
        """The first boundary after stage ``s`` at which a preemption could pay more than the boundary costs, or
        the end of the graph: the job runs up to it with no decision point between. ``queued``: the queue length
        to assume (an inline pass: nothing queued beside it) instead of the policy's own; ``lam``: the busy rate,
        where the caller has just read it."""
        pol = self.policy
        n = pol.graph.n
        if s + 1 >= n:
            return n
        pre = pol.prefix
        q = min(len(pol.infq) if queued is None else queued, pol.max_batch_size - m)
        if lam is None:
            lam = self._busy_rate(now)  # arrivals a boundary inside this job could serve
        if q <= 0 and lam <= 0.0:
            return n  # nothing queued and nothing arriving mid-pass: no boundary can be of use
        p = sum(len(e.reqs) for e in pol.stack[:-1])
        scale = pol.time_scale
        cost = pol.boundary_cost
        if s == 0 and pol.fused_ratio < 1.0:  # this job could run as one whole-graph call
            cost += (1.0 - pol.fused_ratio) * pre[m][n] * scale
        # the tail guard of best(), so that no boundary is kept for a preemption it would refuse (past capacity the
        # oldest request has waited long, and every boundary would only cost)
        oldest = min((r.arrival for e in pol.stack for r in e.reqs), default=now)
        if q > 0 and pol.infq:
            oldest = min(oldest, pol.infq[0].arrival)
        tail = TAIL_PASSES * pol.whole[1] * scale
        max_batch_size, min_gain, gain = pol.max_batch_size, pol.min_gain, self.gain
        for b in range(s + 1, n):
            expected = q + lam * (pre[m][b] - pre[m][s]) * scale  # newcomers queued by the time the pass is at b
            if expected <= 0.0:
                continue
            k = min(max_batch_size - m, max(1, round(expected)))
            if k <= 0:
                return n
            mk = min(max_batch_size, m + k)
            if now + (pre[m][b] - pre[m][s] + pre[k][b] + pre[mk][n] - pre[mk][b]) * scale - oldest > tail:
                continue
            no, yes, saving = gain(b, m, k, p, lam)
            if yes >= no * (1.0 - min_gain):
                continue
            worth = saving * min(1.0, expected)  # fewer than one expected newcomer: the chance one is there
            if worth > cost * (m + p + expected):
                return b
        return n
