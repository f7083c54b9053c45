"""LazyBatching (paper section IV): a BatchTable stack of sub-batches, preemption at stage boundaries, merging of
sub-batches that reach the same stage, governed by the SLA-aware slack predictor; and its Oracle.

The BatchTable is a stack; its top entry is the active sub-batch. At every stage boundary:

1. the two topmost entries merge while their next stage ids are equal (and the result fits max_batch_size);
2. if InfQ holds requests and the slack predictor says that admitting them now misses no deadline, the active
   entry is preempted (it keeps its next stage id) and a new entry for the admitted requests is pushed at stage 0;
3. the top entry runs its next stage.

When the stack is empty there is nothing to preempt: the queued requests (up to the batch cap) start at once.

Batch cap: sub-batches never grow past the largest batch size at which one more sample still costs clearly less
than running it alone (``useful_batch_size``, from the latency table; ``min_batch_gain``, default 20%). Where
batching buys nothing (a compute-bound model on a CPU: one more sample costs about a batch-1 run), the cap is 1:
a batch would only make every member wait for all of them, and preempting would only reorder work last-in
first-out, so LazyBatching then runs requests one at a time in arrival order, like serial. New requests preempt
only as many as can later merge with the sub-batch they preempt (the merged batch must fit the cap).

Admission (Eq. 2, applied to everything in flight): every request running or admitted must still meet its deadline
if the device executed all of their remaining programs one request at a time:

    now + sum_{q in flight or admitted} remaining_single_time(q) <= min_{q in flight or admitted} deadline(q)

Since batched execution never takes longer than the sum of single-input executions, this is the paper's
conservative slack test; it also keeps, after every admission, the invariant that the predicted finish of all
work in flight meets every deadline in flight. Requests are admitted in arrival order, greedily.

``preempt="benefit"`` (not the paper's; default ``"slack"``): a preemption must also lower the summed latency of the
requests it reorders, predicted from the latency table's batched times with no further arrivals. The slack test
only asks whether deadlines still hold, so on a model whose batches cost nearly as much per sample as single runs
(BERT on a CPU), or late in a running sub-batch, it preempts where finishing the running sub-batch first and
starting the newcomers after it would leave everyone sooner. Simulated on this project's CPU tables of the MLP and
BERT at 40-90% load, it took lazy from 0.78-0.98x to 1.00-1.11x the average latency of Triton's work-conserving
batcher (docs/results/regimes.md, "Simulated" tables). Seq2seq graphs (loops) keep the slack test alone.

Seq2seq: when a sub-batch reaches the end of a loop body, requests whose loop ends leave it. Leaving an ENCODER
loop, the leavers are pushed below the ones that go on encoding (the encoders catch up and merge at the decoder);
leaving a DECODER loop, the leavers go on top, so a finished sequence is answered without waiting for longer ones.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Sequence

from ..decisions import DISPATCH, MERGE, PREEMPT, SPLIT
from ..graph import StageType
from ..errors import ConfigError
from ..interfaces import StageJob, StageResult
from ..latency_table import LatencyTable
from ..lengths import LengthHistogram
from ..request import Request, Status
from ..slack import DEFAULT_COVERAGE, SlackPredictor, resolve_dec_timesteps
from .base import DEFAULT_MAX_BATCH_SIZE, Policy, enqueue_by_priority


class Entry:
    """One BatchTable entry: a sub-batch and the stage it runs next."""

    __slots__ = ("node", "reqs", "rem", "dmin", "urgent")

    def __init__(self, node: int, reqs: list[Request], rem: float, dmin: float) -> None:
        self.node = node
        self.reqs = reqs
        self.rem = rem  # sum of the requests' remaining single-input times (slack predictor)
        self.dmin = dmin  # earliest deadline in the entry
        self.urgent = False  # set aside others for its deadline (eager's urgency rule): merges only where it keeps it

    def __repr__(self) -> str:
        return f"Entry(node={self.node}, ids={[r.id for r in self.reqs]})"


PREEMPT_RULES = ("slack", "benefit")

# One more sample must cost less than 80% of a batch-1 run. Tables profiled on a shared machine are noisy: the
# marginal cost of a ResNet-50 sample on this CPU measured 0.81-0.96 of a batch-1 run across profiles (no real gain),
# so a 10% threshold let noise open batches of 4 that then cut throughput; 20% keeps a margin over that noise.
DEFAULT_MIN_BATCH_GAIN = 0.2


def useful_batch_size(table: LatencyTable, max_batch_size: int, min_gain: float = DEFAULT_MIN_BATCH_GAIN) -> int:
    """The largest batch size worth forming: walking up the measured sizes, a size is worth it when each sample it
    adds over the largest size accepted so far costs less than ``(1 - min_gain)`` of a batch-1 run of the whole
    program (the marginal cost between measured sizes).

    Why not stop at the first size that fails: a profile is a few timed runs, and on a busy machine one of them can
    stall. For a model whose stages take microseconds (batching nearly free) one slow run at batch 2 looked like
    "batch 2 costs two runs" and capped the model at 1, for good. Measuring each later size against the last one
    accepted skips such an isolated spike, and still stops where the cost really turns linear (a knee, or a
    compute-bound model whose every size costs about a run per sample)."""
    t1 = sum(table.single)
    if t1 <= 0.0 or min_gain <= 0.0:
        return max_batch_size
    whole = [sum(row[b] for row in table.dense) for b in range(len(table.dense[0]))]
    cap = 1
    for b in table.batch_sizes[1:]:
        if b > max_batch_size:
            break
        if (whole[b] - whole[cap]) / (b - cap) < (1.0 - min_gain) * t1:
            cap = b
    return cap


def prefix_sums(table: LatencyTable) -> list[list[float]]:
    """[batch][stage]: the table's time of stages 0..stage-1 at that batch size (the benefit rules' O(1) sums)."""
    dense = table.dense
    out = []
    for b in range(len(dense[0])):
        acc = [0.0]
        for row in dense:
            acc.append(acc[-1] + row[b])
        out.append(acc)
    return out


class LazyBatching(Policy):
    name = "lazy"

    def __init__(self, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE, *, dec_timesteps: int | None = None,
                 dec_timesteps_coverage: float = DEFAULT_COVERAGE,
                 length_histogram: LengthHistogram | None = None,
                 min_batch_gain: float = DEFAULT_MIN_BATCH_GAIN, preempt: str = "slack") -> None:
        super().__init__(max_batch_size)
        if not 0.0 <= min_batch_gain < 1.0:
            raise ConfigError(f"min_batch_gain must be in [0, 1), got {min_batch_gain!r}", field="min_batch_gain")
        if preempt not in PREEMPT_RULES:
            raise ConfigError(f"preempt must be one of {', '.join(PREEMPT_RULES)}, got {preempt!r}", field="preempt")
        self.min_batch_gain = min_batch_gain
        self.preempt = preempt
        self.prefix: list[list[float]] = []  # [batch][stage]: the table's time of stages 0..stage-1 (benefit rule)
        self.batch_cap = max_batch_size
        # How much longer stages take on the device now than the latency table says. An executor that measures
        # its stages (the Triton backend) keeps it current: a table profiled on a quiet machine underestimates a
        # loaded one, and an underestimating slack predictor admits work that then misses its deadline. The
        # simulator runs exactly the table: 1.0.
        self.time_scale = 1.0
        self.dec_timesteps = resolve_dec_timesteps(dec_timesteps, length_histogram, dec_timesteps_coverage)
        self.dec_timesteps_coverage = dec_timesteps_coverage
        self.infq: deque[Request] = deque()
        self.stack: list[Entry] = []
        self.predictor: SlackPredictor

    def attach(self, scheduler) -> None:  # type: ignore[override]
        super().attach(scheduler)
        self.table_changed()

    def table_changed(self) -> None:
        """Recompute what is derived from the table: at attach, and after online recalibration rewrote it
        (batcher/calibration.py). Requests already queued keep the estimate they were given on arrival."""
        self.predictor = SlackPredictor(self.table, self.dec_timesteps)
        self._lat1 = self.table.single
        self.batch_cap = useful_batch_size(self.table, self.max_batch_size, self.min_batch_gain)
        if self.preempt == "benefit" and not self.graph.is_seq2seq:
            self.prefix = prefix_sums(self.table)

    def describe(self) -> str:
        dec = f", dec_timesteps={self.dec_timesteps}" if self.graph.is_seq2seq else ""
        cap = f", batch_cap={self.batch_cap}" if self.batch_cap < self.max_batch_size else ""
        rule = f", preempt={self.preempt}" if self.preempt != "slack" else ""
        return f"{self.name}(max_batch_size={self.max_batch_size}{cap}{dec}{rule})"

    # ------------------------------------------------------------------ policy interface
    def enqueue(self, request: Request, now: float) -> None:
        request.est = self.predictor.single_input_exec_time(request.enc_steps)
        enqueue_by_priority(self.infq, request)  # InfQ is admitted in order: more urgent levels first

    def next_job(self, now: float) -> StageJob | float | None:
        stack = self.stack
        if self.infq:
            if not stack:
                e = self.take(now, self.batch_cap)
                if e is not None:
                    stack.append(e)
                    self.log.add(now, DISPATCH, 0, len(e.reqs), "device idle: queued requests start")
            else:
                k, predicted_slack = self.admissible(now)
                if k and self.prefix:
                    k = self._worth_preempting(k)
                if k:
                    self.preempt_for(now, k, "slack predictor allows lazy batching", predicted_slack)
        if not stack:
            return None
        top = stack[-1]
        return StageJob(top.node, top.reqs, len(top.reqs), top)

    def job_done(self, job: StageJob, result: StageResult | None, now: float) -> None:
        stack = self.stack
        e: Entry = job.token
        if not stack or stack[-1] is not e:
            raise RuntimeError("LazyBatching: a completed job is not the active BatchTable entry")
        stack.pop()
        s = job.stage
        g = self.graph
        n = g.n
        node, cont, exit_node, exited = self.advance(job, result, now)
        if not g.is_loop_end[s]:
            if not cont:
                pass
            elif node >= n:
                for r in cont:
                    self._finish(r, Status.OK, None)
            else:
                if len(cont) == len(job.requests):
                    rem = e.rem - len(cont) * self._lat1[s]
                    e.rem = rem if rem > 0.0 else 0.0
                else:
                    e.rem = self._remaining(node, cont)
                    e.dmin = min(r.deadline for r in cont)
                e.node, e.reqs = node, cont
                stack.append(e)
        else:
            going = exiting = None
            if cont:
                going = Entry(node, cont, self._remaining(node, cont), min(r.deadline for r in cont))
            if exited:
                if exit_node >= n:
                    for r in exited:
                        self._finish(r, Status.OK, None)
                else:
                    exiting = Entry(exit_node, exited, self._remaining(exit_node, exited),
                                     min(r.deadline for r in exited))
            if going is not None and exiting is not None:
                self.log.add(now, SPLIT, s, len(job.requests), f"{len(exited)} of {len(job.requests)} left the "
                             f"{g.loop_type[s].value.lower()} loop")
            if g.loop_type[s] is StageType.ENCODER:
                order = (exiting, going)  # encoders on top: they catch up with the leavers at the next stage
            else:
                order = (going, exiting)  # finished sequences on top: answered without waiting for longer ones
            for x in order:
                if x is not None:
                    stack.append(x)
        self.merge_top(now)

    def held(self) -> list[Request]:
        return list(self.infq) + [r for e in self.stack for r in e.reqs]

    def least_slack(self, now: float) -> float:
        """``Policy.least_slack`` from the BatchTable: per sub-batch its earliest deadline less its requests' mean
        remaining single-input time (the sum ``rem`` it keeps), and the queue's head (the most urgent level, the
        oldest: the earliest deadline where a model has one SLA) less its whole estimate. O(sub-batches)."""
        scale = self.time_scale
        least = math.inf
        for e in self.stack:
            n = len(e.reqs)
            if n:
                s = e.dmin - scale * e.rem / n
                if s < least:
                    least = s
        if self.infq:
            r = self.infq[0]
            s = r.deadline - scale * r.est
            if s < least:
                least = s
        return least - now

    def clear(self) -> None:
        self.infq.clear()
        self.stack.clear()

    # ------------------------------------------------------------------ the BatchTable's moves (eager's parts use them too)
    def _remaining(self, node: int, reqs: Sequence[Request]) -> float:
        rem = self.predictor.remaining
        return sum(rem(node, r.loop_iter, r.enc_steps) for r in reqs)

    def take(self, now: float, k: int) -> Entry | None:
        """A new entry at stage 0 for up to ``k`` queued requests, in queue order (cancelled ones are answered)."""
        q = self.infq
        reqs: list[Request] = []
        rem = 0.0
        dmin = math.inf
        while q and len(reqs) < k:
            r = q.popleft()
            if r.cancelled:
                self._finish(r, Status.CANCELLED, "request was cancelled while queued")
                continue
            r.start = now
            reqs.append(r)
            rem += r.est
            if r.deadline < dmin:
                dmin = r.deadline
        return Entry(0, reqs, rem, dmin) if reqs else None

    def preempt_for(self, now: float, k: int, why: str, value: float) -> None:
        """Set the active sub-batch aside at its boundary for the first ``k`` queued requests (pushed at stage 0),
        and merge the top two where they already meet."""
        top = self.stack[-1]
        e = self.take(now, k)
        if e is None:  # every one of them was cancelled while queued
            return
        self.log.add(now, PREEMPT, top.node, len(top.reqs), why, value)
        self.stack.append(e)
        self.log.add(now, DISPATCH, 0, len(e.reqs), "lazily batched", value)
        self.merge_top(now)

    def run_ahead(self, now: float, reqs: list[Request], why: str) -> None:
        """Set the active sub-batch aside at its boundary for these queued requests, chosen out of queue order (an
        urgency rule's choice): taken out of InfQ, pushed at stage 0 as one urgent entry, merged where they meet."""
        taken = set(map(id, reqs))
        self.infq = deque(r for r in self.infq if id(r) not in taken)
        for r in reqs:
            r.start = now
        e = Entry(0, reqs, sum(r.est for r in reqs), min(r.deadline for r in reqs))
        e.urgent = True
        top = self.stack[-1]
        self.log.add(now, PREEMPT, top.node, len(top.reqs), why)
        self.stack.append(e)
        self.log.add(now, DISPATCH, 0, len(reqs), "urgent")
        self.merge_top(now)

    def queue_first(self, reqs: Sequence[Request]) -> None:
        """These queued requests go to the head of InfQ in this order (an urgency rule's choice: they join the
        running decode at its next step); the others keep theirs."""
        taken = set(map(id, reqs))
        self.infq = deque([*reqs, *(r for r in self.infq if id(r) not in taken)])

    def admissible(self, now: float) -> tuple[int, float]:
        """How many queued requests (in arrival order) may join now, and the slack that leaves."""
        work = 0.0
        dmin = math.inf
        for e in self.stack:
            work += e.rem
            if e.dmin < dmin:
                dmin = e.dmin
        scale = self.time_scale
        k = 0
        cap = self.batch_cap - len(self.stack[-1].reqs)  # what can still merge with the preempted sub-batch
        for r in self.infq:
            if k >= cap:
                break
            w2 = work + r.est
            d = r.deadline if r.deadline < dmin else dmin
            if now + scale * w2 > d:
                break
            work = w2
            dmin = d
            k += 1
        return k, dmin - (now + scale * work)

    def _worth_preempting(self, k: int) -> int:
        """The largest k' <= k for which admitting the first k' queued requests now lowers the summed latency of
        everything on the stack and the newcomers (preempt="benefit").

        Preempting: the k' newcomers run stages 0..s-1 (A), then merge with the top sub-batch of m for stages s..n-1
        (B); the p requests below wait for both. Not preempting: the top finishes (C), then the newcomers run the
        whole graph (D). Sum of completion times from now: (m + k' + p)(A + B) against m C + (k' + p)(C + D)."""
        pre = self.prefix
        top = self.stack[-1]
        s, m, n = top.node, len(top.reqs), self.graph.n
        p = sum(len(e.reqs) for e in self.stack[:-1])
        c = pre[m][n] - pre[m][s]
        while k:
            a, b, d = pre[k][s], pre[m + k][n] - pre[m + k][s], pre[k][n]
            if (m + k + p) * (a + b) < m * c + (k + p) * (c + d):
                return k
            k -= 1
        return 0

    def merge_top(self, now: float) -> None:
        """Merge the two topmost entries while they have reached the same stage and fit the batch cap."""
        stack = self.stack
        while len(stack) >= 2 and stack[-1].node == stack[-2].node:
            a = stack[-1]
            b = stack[-2]
            size = len(a.reqs) + len(b.reqs)
            if size > self.batch_cap:
                return
            stack.pop()
            b.reqs = b.reqs + a.reqs
            b.rem += a.rem
            if a.dmin < b.dmin:
                b.dmin = a.dmin
            self.log.add(now, MERGE, b.node, size, "two topmost sub-batches reached the same stage")


class OracleLazyBatching(LazyBatching):
    """LazyBatching whose slack test knows the exact batched latency of every stage at every batch size.

    Admission runs the BatchTable forward on the latency table (no further arrivals; decoder lengths still
    predicted as dec_timesteps) and admits the largest prefix of InfQ for which every request in flight or admitted
    finishes by its deadline. Costlier per decision than the conservative test; it exists as the upper bound the
    paper compares against.
    """

    name = "oracle"

    def admissible(self, now: float) -> tuple[int, float]:
        q = self.infq
        hi = min(len(q), self.batch_cap - (len(self.stack[-1].reqs) if self.stack else 0))
        base = self._worst_slack(now, 0)
        if base < 0 or hi == 0:
            return 0, base
        lo, best = 0, base
        while lo < hi:  # largest k with slack >= 0; slack falls as k grows
            mid = (lo + hi + 1) // 2
            sl = self._worst_slack(now, mid)
            if sl >= 0:
                lo, best = mid, sl
            else:
                hi = mid - 1
        return lo, best

    def _worst_slack(self, now: float, k: int) -> float:
        """Smallest deadline - predicted finish over everything in flight plus the first k queued requests."""
        g = self.graph
        n = g.n
        dense = self.table.dense
        dec = self.dec_timesteps
        cap = self.batch_cap
        scale = self.time_scale
        # shadow BatchTable: [node, [[deadline, enc_steps, loop_iter], ...]]
        groups = [[e.node, [[r.deadline, r.enc_steps, r.loop_iter] for r in e.reqs]] for e in self.stack]
        if k:
            new = []
            for i, r in enumerate(self.infq):
                if i >= k:
                    break
                new.append([r.deadline, r.enc_steps, 0])
            groups.append([0, new])
        t = now
        worst = math.inf
        while groups:
            while len(groups) >= 2 and groups[-1][0] == groups[-2][0] and \
                    len(groups[-1][1]) + len(groups[-2][1]) <= cap:
                top = groups.pop()
                groups[-1][1] = groups[-1][1] + top[1]
            node, members = groups.pop()
            t += dense[node][len(members)] * scale
            if not g.is_loop_end[node]:
                if node + 1 >= n:
                    for m in members:
                        if m[0] - t < worst:
                            worst = m[0] - t
                else:
                    groups.append([node + 1, members])
                continue
            enc_loop = g.loop_type[node] is StageType.ENCODER
            cont, out = [], []
            for m in members:
                m[2] += 1
                if m[2] >= (m[1] if enc_loop else dec):
                    m[2] = 0
                    out.append(m)
                else:
                    cont.append(m)
            going = [g.block_start[node], cont] if cont else None
            exiting = None
            if out:
                if node + 1 >= n:
                    for m in out:
                        if m[0] - t < worst:
                            worst = m[0] - t
                else:
                    exiting = [node + 1, out]
            for x in ((exiting, going) if enc_loop else (going, exiting)):
                if x is not None:
                    groups.append(x)
        return worst
