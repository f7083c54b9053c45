"""Eager's decoder admission: how many queued requests join the running decode of a seq2seq or decoder-only graph.
The policy chooses it once, when it first sees a graph with loops (``EagerBatching.table_changed``); static graphs
have none.

Seq2seq graphs (loops) keep the paper's BatchTable (the work-conserving base, no batch cap), and admit newcomers
to the running decode on the table's batch curves (``admission="curves"``, batcher/decode_admission.py): the
BatchTable run forward on the measured batched times, decoder lengths predicted from the length histogram given
each row's progress, and every deadline that can still be met must hold. The paper's Eq. 2 prices a batch as the
sum of single runs; ``admission="eq2"`` keeps it, with one change: a deadline in flight that is already lost no
longer blocks admission. Under the paper's rule one long sequence past its SLA keeps every newcomer queued until it
ends: on a decoder LM with a long tail of outputs (384 tokens under load outlive a 5 s SLA) the time to first token
at 90% load then had a p99 of seconds against a median of tens of ms (benchmarks/bench_streaming.py, a run before
this rule). The curves keep that change where the decode lengths are heavy-tailed and block on lost deadlines
where they vary little (the module docstring of decode_admission says why). A queued request that outranks the
running sub-batch's loosest class is admitted where the rule would hold it: it joins the running decode at the
next step. Spans are for static graphs.

Decoupled (streaming) models default to ``admission="first_token"``: every queued request joins the running decode
at the next boundary, up to the batch cap, as vLLM's scheduler takes waiting prefills first. A streaming user
weighs the time to the first token; the rows already streaming pay for a newcomer in time per output token, which
the batch cap bounds. The curves guard end-to-end deadlines instead, and on the chat-like LM's long tail that holds
newcomers behind long sequences: replayed on the served LM's table (3 seeds x 400 requests, SLA 5 s), the time to
first token at 150% load is 11.4 ms under first_token against 38.2 ms under the curves (7.2 ms unloaded), at 300%
49 ms against 3.2 s, at the price of 148 ms against 78 ms per output token at 300% (docs/results/decoder.md;
the replay script is in git history).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from ...decode_admission import CurveAdmission, DecodeLengths
from ...graph import StageType
from ...lengths import LengthHistogram
from ...request import Request
from ..lazy import LazyBatching

if TYPE_CHECKING:
    from .policy import EagerBatching

# Admission of decoder requests (seq2seq graphs): "curves" predicts on the table's batched times
# (batcher/decode_admission.py), "eq2" is the paper's sum of single runs over the deadlines still attainable,
# "first_token" admits up to the batch cap (the default of decoupled models: the module docstring says why).
ADMISSION_RULES = ("curves", "eq2", "first_token")
# Whether admitted decoder newcomers join the running decode at once ("always", the paper's and this policy's
# default) or only where that lowers the predicted summed completion time of them and of the rows in flight, against
# waiting for those rows to end ("benefit": a newcomer's encoder steps stall every row decoding; on GNMT's table,
# simulated, 1.55-1.66x Triton's best average past 100% load against eager's 1.45-1.49x, level at 70%,
# docs/results/decoder.md). Not served yet, so not the default; admission=first_token (streaming) skips it, as its
# point is the newcomer's first token.
JOIN_RULES = ("always", "benefit")


class DecoderAdmission:
    """The admission rule (``policy.admission``) and join rule (``policy.join``) on a graph with loops."""

    def __init__(self, policy: EagerBatching, histogram: LengthHistogram | None) -> None:
        self.policy = policy
        self.histogram = histogram
        self.curves: CurveAdmission | None = None
        self._left: dict[int, int] = {}  # steps_left's answers by steps done (the histogram does not change)
        self.dec_step: list[float] = []  # [batch]: a decoder step's table time (join="benefit")
        self._enc_step = self._once = 0.0
        self._curve_answer: tuple[tuple, tuple[int, float]] | None = None  # (state key, answer): admissible_curves

    def table_changed(self) -> None:
        """Recompute what is derived from the table (after online recalibration changed it)."""
        pol = self.policy
        lengths = DecodeLengths(self.histogram, pol.dec_timesteps_coverage, pol.dec_timesteps)
        self.curves = CurveAdmission(pol.table, lengths)
        self._curve_answer = None
        # join="benefit" reads these at every decision: a decoder step at each batch size, a newcomer's encoder
        # step and its stages outside loops, at batch 1
        g, dense, lat1 = pol.graph, pol.table.dense, pol.table.single
        dec = [s for s in range(g.n) if g.loop_type[s] is StageType.DECODER]
        self.dec_step = [sum(dense[s][b] for s in dec) for b in range(len(dense[0]))]
        self._enc_step = sum(lat1[s] for s in range(g.n) if g.loop_type[s] is StageType.ENCODER)
        self._once = sum(lat1[s] for s in range(g.n) if g.loop_type[s] is None)

    def describe(self) -> str:
        pol = self.policy
        return (f", dec_timesteps={pol.dec_timesteps}, admission={pol.admission}"
                + (f", join={pol.join}" if pol.join != "always" else ""))

    def admissible(self, now: float) -> tuple[int, float]:
        """Eq. 2 over the deadlines that can still be met (``admissible_eq2``); where it admits nothing, the queued
        requests that outrank everything in flight are admitted anyway (moved to the head of InfQ): they join the
        running decode at the next step instead of waiting for the longest sequence in flight to end. (Outranking
        the running sub-batch's loosest class is enough, as for static graphs.)"""
        pol = self.policy
        if pol.admission == "first_token":  # everyone the cap leaves room for: nothing to outrank
            return max(0, min(pol.batch_cap - len(pol.stack[-1].reqs), len(pol.infq))), math.inf
        k, slack = self.admissible_curves(now) if pol.admission == "curves" else self.admissible_eq2(now)
        if k and pol.join == "benefit" and pol.stack:
            k = self.join_pays(k)
        if k or not pol.urgency or not pol.stack:
            return k, slack
        urgent = pol.urgent.admitted_to_decode(pol.batch_cap - len(pol.stack[-1].reqs))
        if not urgent:
            return k, slack
        pol.queue_first(urgent)
        return len(urgent), slack

    def steps_left(self, r: Request, done: int) -> int:
        """Decoder steps ``r`` is expected to run after ``done``: the histogram's mean beyond ``done`` (or the
        predicted ``dec_timesteps`` without one)."""
        if self.histogram is None:
            return max(1, self.policy.dec_timesteps - done)
        left = self._left.get(done)
        if left is None:
            left = self._left[done] = max(1, round(self.histogram.conditional_mean(done) - done))
        return left

    def decode_together(self, rows: Sequence[int]) -> tuple[float, float]:
        """Summed completion times and span (table seconds) of ``rows`` (steps left each) decoding as one batch."""
        step = self.dec_step
        max_batch_size = self.policy.max_batch_size
        t = total = 0.0
        done = 0
        ordered = sorted(rows)
        for i, steps in enumerate(ordered):
            t += (steps - done) * step[min(len(ordered) - i, max_batch_size)]
            done = steps
            total += t
        return total, t

    def join_pays(self, k: int) -> int:
        """The largest k' <= k for which the first k' queued requests joining now (their encoder steps first, every
        row in flight stalled meanwhile, then one decode) is predicted to lower the summed completion time of them
        and of the rows in flight, against waiting until those rows end (join="benefit"). Rows still encoding count
        with their whole expected decode and no encoder work left: an estimate, like the lengths."""
        pol = self.policy
        loop = pol.graph.loop_type
        rows = [self.steps_left(r, r.loop_iter if loop[e.node] is StageType.DECODER else 0)
                for e in pol.stack for r in e.reqs]
        flight, span = self.decode_together(rows)
        queued = list(pol.infq)
        while k:
            new = [self.steps_left(r, 0) for r in queued[:k]]
            enc = sum(max(r.enc_steps, 1) * self._enc_step + self._once for r in queued[:k])
            join = self.decode_together(rows + new)[0] + (len(rows) + k) * enc
            wait = flight + self.decode_together(new)[0] + k * (span + enc)
            if join <= wait:
                return k
            k -= 1
        return 0

    def admissible_curves(self, now: float) -> tuple[int, float]:
        """How many queued requests may join the running decode now, predicted on the table's batch curves
        (batcher/decode_admission.py): every deadline that can still be met must hold."""
        assert self.curves is not None
        pol = self.policy
        # A decision costs a shadow run of the BatchTable (about 0.5 ms at 300% load in the simulator) and is asked
        # at every stage boundary. Within one loop iteration nothing it reads changes unless requests arrive, leave
        # or merge, or the table or its scale changes, so the last answer stands until then.
        key = (len(pol.infq), id(pol.infq[0]), sum(len(e.reqs) for e in pol.stack), len(pol.stack),
               pol.time_scale, pol.loop_ends)
        if self._curve_answer is not None and self._curve_answer[0] == key:
            return self._curve_answer[1]
        room = pol.batch_cap - len(pol.stack[-1].reqs)  # what can still merge with the preempted sub-batch
        answer = self.curves.admissible(now, pol.stack, pol.infq, room, pol.batch_cap, pol.time_scale)
        self._curve_answer = (key, answer)
        return answer

    def admissible_eq2(self, now: float) -> tuple[int, float]:
        """The paper's Eq. 2 (LazyBatching.admissible) over the deadlines in flight that can still be met: where
        the work in flight misses its earliest deadline with no newcomer, the newcomers are held only to their own
        deadlines (see the module docstring)."""
        pol = self.policy
        work = sum(e.rem for e in pol.stack)
        dmin = min((e.dmin for e in pol.stack), default=math.inf)
        if now + pol.time_scale * work <= dmin:
            return LazyBatching.admissible(pol, now)
        scale = pol.time_scale
        k = 0
        cap = pol.batch_cap - len(pol.stack[-1].reqs)  # what can still merge with the preempted sub-batch
        dnew = math.inf
        for r in pol.infq:
            if k >= cap:
                break
            w2 = work + r.est
            d = min(dnew, r.deadline)
            if now + scale * w2 > d:
                break
            work, dnew = w2, d
            k += 1
        return k, (dnew if k else dmin) - (now + scale * work)
