"""Eager's work-conserving base (rule 1 of batcher/policies/eager/policy.py): when the device frees (the BatchTable
is empty) every queued request starts at once, up to ``max_batch_size``: Triton's ``max_queue_delay_microseconds:
0``. No batch cap from a profile. The one exception is ``batch_size``'s: smaller batches one after the other, where
the table says they give a lower mean latency and the arrival rate leaves room for them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .policy import EagerBatching

# Serving the queue in smaller batches than all of it must leave the device at most this busy at the arrival rate
# (queues grow fast as utilisation nears 1). No exception for a model whose table shows no batching gain: served,
# such a table was off by more than the gain it denied (MobileNet: 965 batches of one at 120% load, 0.8x Triton's
# throughput), and a batcher that may not lose to Triton's must not give up its throughput on a table's word.
MAX_UTILISATION = 0.85


class WorkConserving:
    """How many queued requests start on an idle device (static graphs: seq2seq ones keep the paper's BatchTable)."""

    def __init__(self, policy: EagerBatching) -> None:
        self.policy = policy
        self._busy_fraction = policy.rates.busy_fraction
        self._rate = policy.rates.rate

    def batch_size(self, now: float, backlog: int | None = None) -> int:
        """How many queued requests start when the device frees: all of them (Triton's choice), unless the table
        says that serving the queue in smaller batches one after the other gives a lower mean latency (a model
        whose batches cost about a run per sample: a batch only makes each member wait for all the others) and
        that smaller batch still keeps up with the arrival rate (else the queue would grow without bound)."""
        p = self.policy
        backlog = len(p.infq) if backlog is None else backlog
        q = min(backlog, p.max_batch_size)
        if q <= 1:
            return q
        if self._busy_fraction(now) > MAX_UTILISATION:
            # the device is (nearly) always busy: smaller batches would give up throughput the load needs. The rate
            # test below cannot see that where requests queue before the policy sees them (Triton holds them while
            # an inline pass runs in execute: the rate observed is then the rate served): split groups cost
            # MobileNet 10% of its throughput at 200% load (1.4 passes a group)
            return q
        whole = p.whole
        lam = self._rate(now) * p.time_scale
        behind = backlog - q  # queued beyond one full batch: they wait for however these q are served
        all_at_once = whole[q]
        best, best_cost = q, (q + behind) * all_at_once + lam * all_at_once * all_at_once / 2
        for k in range(q - 1, 0, -1):
            t = whole[k]
            f, r = divmod(q, k)
            busy = f * t + whole[r]  # the q served in batches of k (whole[0] is 0)
            if lam * busy > MAX_UTILISATION * q:
                continue  # would lose throughput that the arrival rate may need
            # completion times of the q, the wait of those behind and of what arrives meanwhile
            cost = k * t * f * (f + 1) / 2 + (r * busy if r else 0.0) + behind * busy + lam * busy * busy / 2
            if cost < best_cost * (1.0 - p.min_gain):
                best, best_cost = k, cost
        return best
