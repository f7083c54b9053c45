"""Eager LazyBatching: Triton's work-conserving batcher as the base, LazyBatching's preemption and merging only
where the latency table predicts they pay. The default policy of `lazybatch repo add` (the paper's rule stays
available, unchanged, as ``lazy``).

Why a second rule. Against Triton's dynamic batcher with no queue delay, which runs whatever queued while the
previous batch ran, the paper's slack rule loses on static graphs even with no serving cost (docs/results/regimes.md,
"Simulated"): it preempts whenever every deadline still holds, also late in a pass where finishing the running
sub-batch first would leave everyone sooner, and its batch cap (from a profile) can stop it batching where Triton
still gains. A user switches only to a batcher that is never worse than the stock one, so this policy is built from
the stock one outward:

1. **Work-conserving base.** When the device frees (the BatchTable is empty) every queued request starts at once,
   up to ``max_batch_size``: Triton's ``max_queue_delay_microseconds: 0``. No batch cap from a profile.
2. **Preempt only where it pays.** At a stage boundary, queued requests preempt the running sub-batch (and merge
   with it when they reach its stage) only where the table predicts a lower mean latency over everyone concerned:
   the running sub-batch, the newcomers, the sub-batches below, and the requests expected to arrive meanwhile (at
   the rate observed). Preempting delays what arrives during the catch-up; not preempting makes the newcomers wait
   for the rest of the pass, and lets the arrivals of that time join their batch. See
   ``PreemptionRule.gain`` (preemption.py).
3. **SLA guard.** A preemption that would make the running sub-batch miss a deadline it would otherwise meet is
   refused (the slack predictor's question, answered on the table's batched times).
4. **Decision points only where they pay.** A boundary costs serving time (a return to the scheduler, tensors
   split and joined, a session call: ``boundary_cost``, measured by the backend; 0 in the simulator). A job runs
   through every boundary at which the expected gain of a preemption (given the queue and the arrival rate) is
   below that cost (``StageJob.stop``): at low load a request runs the whole graph in one call, at higher load the
   early boundaries, where preemption pays most, come back.

5. **Urgency preempts.** Requests of one model may belong to several classes (``Request.priority``, then the SLA:
   ``class_key``). A queued request whose class outranks members of the running sub-batch, and which would miss its
   deadline waiting for the running sub-batch but meets it by going now, preempts at the next boundary whatever
   the mean-latency rule says, where no request of the running sub-batch then misses a deadline it would have met
   (a preemption spends slack only); it merges with the sub-batch it set aside only where the merged batch still meets
   its deadline (else it runs ahead alone, and the bulk resumes where it stopped), and a queue that starts on an
   idle device lets such requests run ahead of the rest. Within one class nothing changes: Triton's order. While
   outranking traffic arrives, no job runs longer than its tightest SLA leaves room for (``UrgencyRule.cut``), so that
   a boundary is there when it is needed. Triton's batcher can only order its queue by priority: a request that
   arrives while a batch runs waits for the whole graph. While outranking traffic arrives, sub-batches also stay
   small enough that every stage fits that room (``UrgencyRule.batch``). Off by default (``eager:urgency=true`` turns
   it on): on a virtual clock it cuts interactive misses 3.9-8.5x against Triton's batcher, but served on this
   2-core CPU at most 1.75x (ResNet-50 on merged segments, ``fuse_segments: 4``), and it loses on the MLP and in
   bulk throughput past capacity (docs/results/mixed.md); a default must never be worse than Triton's batcher.


Seq2seq graphs (loops) keep the paper's BatchTable and admit newcomers to the running decode by the decoder
admission (decoder.py, whose docstring says how and why); spans, inline passes and rules 1-4 are for static graphs.

The parts, each an object this policy holds (composition; each reads the policy's state through its ``policy``):

    rates.py            ArrivalRates: arrivals, busy time, the rates the rules read
    work_conserving.py  WorkConserving: rule 1, how many queued requests start on an idle device
    preemption.py       PreemptionRule: rules 2-4, the gain of a preemption, its guards, where a job stops
    urgency.py          UrgencyRule: rule 5, the classes seen lately and what they preempt, cut and keep apart
    decoder.py          DecoderAdmission: graphs with loops only, chosen once when the graph is known
    policy.py           EagerBatching: the BatchTable (LazyBatching's) and the decision that asks the parts, and the
                        backend's inline hooks (backend_hooks.InlineHooks)
"""

from __future__ import annotations

import math
from typing import Sequence

from ...decisions import DISPATCH, MERGE
from ...errors import ConfigError
from ...interfaces import StageJob
from ...lengths import LengthHistogram
from ...request import Request
from ...slack import DEFAULT_COVERAGE
from ..base import DEFAULT_MAX_BATCH_SIZE
from ..lazy import LazyBatching, prefix_sums
from .decoder import ADMISSION_RULES, JOIN_RULES, DecoderAdmission
from .preemption import DEFAULT_MIN_GAIN, PreemptionRule
from .rates import ArrivalRates
from .urgency import UrgencyRule, class_key
from .work_conserving import WorkConserving

# inline_batch keeps its answers per group size and busy rate, the rate in steps of 5% (an estimate over the last
# RATE_WINDOW_PASSES passes moves by more between two of them): a served call then skips the scan of every boundary
INLINE_RATE_LOG_STEP = math.log(1.05)
INLINE_ANSWERS_KEPT = 512
# ... and the answer for a group size stands for this share of the rate's window (RATE_WINDOW_PASSES passes: an
# answer stands for 8 of them), at least INLINE_RECHECK_S: a few passes do not move a rate read over dozens, and
# reading it (the window trimmed, the bucket, the key) cost 9 us of a served execute on a 0.7 ms model, beside
# Triton's batcher's 25 us around onnxruntime's run (ad hoc, tiny at 90% load; in-process it reads 1-2 us). Kept
# for the last size only, the answer was read again at nearly every pass there: groups vary in size under load.
INLINE_RECHECK_WINDOW = 1 / 8
INLINE_RECHECK_S = 0.002


class EagerBatching(LazyBatching):
    """Work-conserving batching with layer-boundary preemption where the latency table predicts it pays."""

    name = "eager"
    # the decoder admission made for a graph with loops (a subclass may give its own: a clairvoyant length model)
    decoder_admission: type[DecoderAdmission] = DecoderAdmission

    def __init__(self, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE, *, dec_timesteps: int | None = None,
                 dec_timesteps_coverage: float = DEFAULT_COVERAGE, length_histogram: LengthHistogram | None = None,
                 min_gain: float = DEFAULT_MIN_GAIN, boundary_cost_us: float = 0.0, spans: bool = True,
                 urgency: bool = False, admission: str = "curves", join: str = "always") -> None:
        super().__init__(max_batch_size, dec_timesteps=dec_timesteps, dec_timesteps_coverage=dec_timesteps_coverage,
                         length_histogram=length_histogram, min_batch_gain=0.0)
        if not 0.0 <= min_gain < 1.0:
            raise ConfigError(f"min_gain must be in [0, 1), got {min_gain!r}", field="min_gain")
        if not boundary_cost_us >= 0.0:
            raise ConfigError(f"boundary_cost_us must be >= 0, got {boundary_cost_us!r}", field="boundary_cost_us")
        if admission not in ADMISSION_RULES:
            raise ConfigError(f"admission must be one of {', '.join(ADMISSION_RULES)}, got {admission!r}",
                              field="admission")
        if join not in JOIN_RULES:
            raise ConfigError(f"join must be one of {', '.join(JOIN_RULES)}, got {join!r}", field="join")
        self.admission = admission
        self.join = join
        self.length_histogram = length_histogram
        self.loop_ends = 0  # loop iterations completed (the decoder admission's cache key)
        self.min_gain = min_gain
        # seconds one stage boundary costs the device (serving cost; the backend keeps it measured)
        self.boundary_cost = boundary_cost_us * 1e-6
        self.spans = spans
        self.urgency = urgency
        # a whole-graph pass / the table's stage times summed, at the same batch size (the backend measures it:
        # one onnxruntime call with cross-layer fusions, against a call per stage). Cutting a job that could run
        # as the whole graph loses (1 - fused_ratio) of its pass on top of the boundary's own cost. 1 in the
        # simulator, which has no whole graph.
        self.fused_ratio = 1.0
        self.whole: list[float] = []  # [batch]: the whole graph's table time
        self.longest: list[float] = []  # [batch]: the longest stage's table time
        self.cap = max_batch_size  # the sub-batch cap of this decision (``UrgencyRule.batch`` while urgency applies)
        # inline_batch's answers: with nothing held or queued, where a whole pass of n would stop depends only on n,
        # the rate of arrivals mid-pass (in INLINE_RATE_LOG_STEP buckets) and the table, scale and boundary cost
        self.inline_answers: dict[tuple, int] = {}
        # per group size n: until when (time) the answer kept for n stands, and that answer (INLINE_RECHECK_WINDOW)
        self._inline_until = [-math.inf] * (max_batch_size + 1)
        self._inline_kept = [0] * (max_batch_size + 1)
        # the parts; the decision binds the methods it calls at every boundary once, here
        self.rates = ArrivalRates()
        self.idle = WorkConserving(self)
        self.preemption = PreemptionRule(self)
        self.urgent = UrgencyRule(self)
        self.decoder: DecoderAdmission | None = None  # graphs with loops only (table_changed chooses it)
        self._arrived = self.rates.arrived
        self._stop_benefit = self.preemption.stop_benefit
        self._best_preemption = self.preemption.best

    @property
    def needs_classes(self) -> bool:
        return self.urgency

    def table_changed(self) -> None:
        """Recompute what is derived from the table (after online recalibration changed it)."""
        super().table_changed()
        if self.graph.is_seq2seq:  # the one place the graph's shape is asked: it chooses the decoder admission
            if self.decoder is None:
                self.decoder = self.decoder_admission(self, self.length_histogram)
            self.decoder.table_changed()
            return
        dense = self.table.dense
        self.prefix = prefix_sums(self.table)
        self.whole = [p[-1] for p in self.prefix]
        self.longest = [max(row[b] for row in dense) for b in range(len(dense[0]))]  # [batch]: the longest stage
        self.rates.table_changed(self.whole[1])
        self.inline_answers = {}
        self._forget_inline()

    def measured_costs(self, *, boundary_s: float | None = None, fused_ratio: float | None = None) -> None:
        """The backend's measurements (``ServingCosts``, batcher/policies/backend_hooks.py): the boundary cost
        follows them unless the model's config fixed it (the backend then does not call); the inline answers,
        keyed by both, are asked again."""
        if boundary_s is not None:
            self.boundary_cost = boundary_s
        if fused_ratio is not None:
            self.fused_ratio = fused_ratio
        self._forget_inline()

    def _forget_inline(self) -> None:
        """The kept inline answers are asked again (the table, the boundary cost or the fused ratio changed)."""
        until = self._inline_until
        for n in range(len(until)):
            until[n] = -math.inf

    def describe(self) -> str:
        dec = self.decoder.describe() if self.decoder is not None else ""
        cost = f", boundary_cost={self.boundary_cost * 1e6:.0f}us" if self.boundary_cost else ""
        urgency = ", urgency=true" if self.urgency else ""
        return f"{self.name}(max_batch_size={self.max_batch_size}{dec}{cost}{urgency})"

    # ------------------------------------------------------------------ the arrival-rate estimate
    def rate(self, now: float) -> float:
        """Arrivals per second (samples) over the recent window (``ArrivalRates.rate``)."""
        return self.rates.rate(now)

    def busy_rate(self, now: float) -> float:
        """Arrivals per second of busy time (``ArrivalRates.busy_rate``)."""
        return self.rates.busy_rate(now)

    def busy_fraction(self, now: float) -> float:
        """The share of the recent window the device was busy (``ArrivalRates.busy_fraction``)."""
        return self.rates.busy_fraction(now)

    # ------------------------------------------------------------------ policy interface
    def enqueue(self, request: Request, now: float) -> None:
        super().enqueue(request, now)
        if self.urgency:
            self.urgent.observe(now, class_key(request))
        self._arrived(now, bool(self.stack))

    def job_done(self, job: StageJob, result, now: float) -> None:  # type: ignore[override]
        self.rates.job_ran(now, now - job.started)
        if self.graph.is_loop_end[job.stage]:
            self.loop_ends += 1
        super().job_done(job, result, now)

    def admissible(self, now: float) -> tuple[int, float]:
        """Graphs with loops (LazyBatching.next_job asks it there only): the decoder admission's answer."""
        return self.decoder.admissible(now)  # type: ignore[union-attr]

    def next_job(self, now: float) -> StageJob | float | None:
        if self.decoder is not None:
            return super().next_job(now)  # the paper's slack rule, uncapped, with the decoder admission
        stack = self.stack
        self.cap = self.urgent.batch(now) if self.urgency else self.max_batch_size
        if self.infq:
            if not stack:
                k = min(self.idle.batch_size(now), self.cap)
                e = self.take(now, k)
                if e is not None:
                    stack.append(e)
                    self.log.add(now, DISPATCH, 0, len(e.reqs), "device idle: every queued request starts"
                                 if not self.infq else "device idle: the batch size of least mean latency starts")
                    ahead = self.urgent.split(now) if self.urgency else None
                    if ahead is not None:
                        stack.append(ahead)
            elif not (self.urgency and self.urgent.preemption(now)):
                k, gain = self._best_preemption(now)
                if k:
                    self.preempt_for(now, k, "the table predicts a lower mean latency if the queue goes first", gain)
        if not stack:
            return None
        top = stack[-1]
        stop = self.stop(now, top.node, len(top.reqs)) if self.spans else top.node + 1
        return StageJob(top.node, top.reqs, len(top.reqs), top, stop)

    def stop(self, now: float, s: int, m: int, queued: int | None = None) -> int:
        """Where a job of ``m`` from stage ``s`` ends: the first boundary that may pay (``PreemptionRule.
        stop_benefit``), or sooner where outranking traffic needs boundaries (``UrgencyRule.cut``)."""
        stop = self._stop_benefit(now, s, m, queued)
        return min(stop, self.urgent.cut(now, s, m)) if self.urgency else stop

    def merge_top(self, now: float) -> None:
        """LazyBatching's merge, except that an urgent sub-batch does not merge where the merged batch would miss a
        deadline of its own that running ahead alone keeps (static graphs; a decoder step batch merges always: its
        sub-batches are never urgent, and its cap is the batch cap)."""
        stack = self.stack
        while len(stack) >= 2 and stack[-1].node == stack[-2].node:
            a, b = stack[-1], stack[-2]
            size = len(a.reqs) + len(b.reqs)
            if size > self.batch_cap or size > self.cap:
                return
            if a.urgent and self.prefix and self.urgent.keeps_apart(now, a, size):
                return
            stack.pop()
            b.reqs = b.reqs + a.reqs
            b.rem += a.rem
            b.dmin = min(a.dmin, b.dmin)
            b.urgent = b.urgent or a.urgent
            self.log.add(now, MERGE, b.node, size, "two topmost sub-batches reached the same stage")

    # ------------------------------------------------------------------ the backend's inline route (InlineHooks)
    def inline_batch(self, now: float, n: int, classes: Sequence[tuple[float, int]] | None = None) -> int:
        """The whole group as one pass (Triton's choice), where ``stop`` would run it through every boundary: the
        pass is then the one this policy would run, minus the scheduler's serving cost. Never in smaller passes:
        a group handed to execute is all that queued while the last pass ran, and whether the device keeps up
        cannot be seen from here (Triton holds the queue meanwhile, and the gaps between execute calls read as
        idle time): split groups cost MobileNet a fifth of its throughput at 200% load (174 groups in 203
        passes, docs/data/probe_routes_mobilenet.txt). The device-idle rule of the scheduler
        (``WorkConserving.batch_size``) still serves its own queue in smaller batches where that pays and the load
        allows."""
        if classes and self.urgency:
            for sla, level in classes:
                self.urgent.observe(now, (level, round(sla, 4)))
        elif not self.urgency and n < len(self._inline_until):
            if now < self._inline_until[n] and not (self.stack or self.infq):  # the common case: as just answered
                return self._inline_kept[n]
        if self.decoder is not None or not self.spans or self.stack or self.infq or not 1 <= n <= self.max_batch_size:
            return 0
        if classes and self.urgency and len(set(classes)) > 1:
            # a group of several classes: where the whole group's pass would cost an outranking member the deadline
            # that a pass of its own keeps, the scheduler serves it first (UrgencyRule.split)
            loosest = max((level, round(sla, 4)) for sla, level in classes)
            tight = [sla for sla, level in classes if (level, round(sla, 4)) < loosest]
            scale = self.time_scale
            if tight and self.whole[n] * scale > min(tight) >= self.whole[len(tight)] * scale:
                return 0
        lam = self.rates.busy_rate(now)
        key = (n, math.floor(math.log(lam) / INLINE_RATE_LOG_STEP) if lam > 0.0 else None, self.time_scale,
               self.boundary_cost, self.fused_ratio)
        stop = self.inline_answers.get(key)
        if stop is None:  # the benefit rule's scan of every boundary (15-20 us a call in a served stub, ad hoc)
            if len(self.inline_answers) >= INLINE_ANSWERS_KEPT:
                self.inline_answers.clear()
            stop = self.inline_answers[key] = self._stop_benefit(now, 0, n, lam=lam)
        if self.urgency:
            return n if min(stop, self.urgent.cut(now, 0, n)) >= self.graph.n else 0
        answer = n if stop >= self.graph.n else 0
        self._inline_until[n] = now + max(INLINE_RECHECK_S, INLINE_RECHECK_WINDOW * self.rates.window)
        self._inline_kept[n] = answer
        return answer

    def inline_done(self, start: float, end: float, n: int) -> None:
        self.rates.inline_ran(start, end, n)

    def inline_wait(self, now: float, running: StageJob | None, pending: int) -> float | None:
        """Where the work held runs as whole passes (one sub-batch at most, whose job runs to the end; what is
        queued starts when it ends), the newcomers could only start after it: under the scheduler they would cost
        its hand-offs and a response round trip each, and past capacity that route, once taken, was taken for
        good (every group found the previous one still held: 211 of 492 jobs at 120% load on MobileNet,
        docs/results/default.md). Waiting in ``execute`` lets Triton queue what arrives meanwhile, as its own
        batcher does, and the next group runs inline."""
        if self.decoder is not None or not self.spans:
            return None
        if self.urgency and self.urgent.budget() is not None:
            # classes that outrank others arrive: this group may hold one, which must reach the scheduler (its
            # queue is ordered by class and it may preempt); waiting here would put it behind everything queued
            return None
        try:
            stack = list(self.stack)
            if len(stack) > 1:
                return None
            pre = self.prefix
            scale = self.time_scale
            n = self.graph.n
            cap = self.max_batch_size
            left = 0.0
            if stack:
                top = stack[0]
                if running is None or running.stop < n or running.token is not top:
                    return None  # between jobs, or a job with a boundary the newcomers might use
                m = min(len(top.reqs), cap)
                left = max(0.0, (pre[m][n] - pre[m][running.stage]) * scale - (now - running.started))
            elif running is not None:
                return None
            q = len(self.infq) + pending  # they start as one batch (or the policy's smaller ones) once it ends
            while q > 0:
                k = min(q, cap)
                left += self.whole[k] * scale
                q -= k
            return left
        except (IndexError, RuntimeError):  # the scheduler thread changed the state under us: let it decide
            return None
