"""Admission of decoder requests on the latency table's batch curves (the default policy's rule for seq2seq and
decoder-only graphs; the paper's Eq. 2 stays in ``lazy``).

Why. Eq. 2 prices a batch as the sum of its members' single runs. A decoder step at batch 16 costs far less than
16 steps at batch 1 (the LM on this project's CPU: 1.9 ms a token at batch 16 against 5.0 ms at batch 1), so Eq. 2
reads a deadline as lost where the batched decode keeps it and, once it stops counting lost deadlines, admits
everyone; past capacity that makes every request late (simulated GNMT at 300% load: 1.9 s average, admit-all
3.0 s, the exact-curve Oracle 1.5 s). This predictor answers the Oracle's question (does every deadline that can
still be met hold if the first k queued requests join now?) at a cost a serving loop can pay at every boundary:

- **The BatchTable run forward on the table** (``dense[stage][batch]``: the measured curves, which the backend
  recalibrates online per stage and batch size): sub-batches run top first, merge when they reach the same stage,
  decoder rows leave at their predicted length. No further arrivals.
- **A loop is crossed in one step** where nothing can merge into it: a sub-batch at the start of a loop body runs
  ``min(remaining iterations) - 1`` whole iterations at the body's batched time in one addition, so a decision
  costs O(exits x stages), not O(tokens x stages).
- **Predicted lengths conditioned on progress**: a row that has decoded d tokens is expected to run to the
  shortest length that covers ``coverage`` of the length histogram's mass beyond d (not the unconditioned 90%
  length: a row already past it is in the long tail and will run much longer).
- **Deadlines that are lost anyway**: a request in flight that misses its deadline with no newcomer, or a newcomer
  that misses it even alone, cannot be saved by refusing admission. Whether it may still be delayed depends on the
  length distribution, as FCFS against processor sharing in an M/G/1 queue: where the decode lengths vary little
  (squared coefficient of variation <= 1, the WMT-like histogram: 0.39) finishing the work in flight first gives
  the lower mean, so a lost deadline blocks admission (it may not be delayed, as in the paper's Oracle); where
  they are heavy-tailed (the chat-like LM histogram: 1.19) sharing the steps gives the lower mean and keeps the
  time to first token short, so lost deadlines are not counted. Simulated at 200% and 300% load on the served
  tables, each choice was the better one on its own models (docs/results/decoder.md).
"""

from __future__ import annotations

import math
from itertools import islice
from typing import Sequence

from .graph import ModelGraph, StageType
from .latency_table import LatencyTable
from .lengths import LengthHistogram
from .request import Request

# [deadline, enc_steps, loop_iter, dec_target, index]
_DEADLINE, _ENC, _ITER, _TARGET, _INDEX = range(5)


# Squared coefficient of variation of the decode lengths above which lost deadlines stop blocking admission.
HEAVY_TAIL_CV2 = 1.0


class DecodeLengths:
    """Expected total decoder steps of a row, given the steps it has already decoded; and whether the lengths are
    heavy-tailed enough that a deadline already lost should not hold newcomers back (``lost_block``)."""

    __slots__ = ("_targets", "_fixed", "cv2", "lost_block")

    def __init__(self, histogram: LengthHistogram | None, coverage: float, fixed: int) -> None:
        self._fixed = fixed
        self._targets: list[int] = []
        # no histogram: nothing is known of the spread, and a row that outruns its fixed prediction would hold
        # every newcomer until it ends if its lost deadline blocked; so it does not
        self.cv2 = math.inf
        if histogram is not None:
            self._targets = [histogram.conditional_length(d, coverage) for d in range(max(histogram.lengths))]
            mean = histogram.mean()
            second = sum(ln * ln * c for ln, c in zip(histogram.lengths, histogram.counts)) / sum(histogram.counts)
            self.cv2 = second / (mean * mean) - 1.0
        self.lost_block = self.cv2 <= HEAVY_TAIL_CV2

    def target(self, done: int) -> int:
        """Total steps a row that has decoded ``done`` steps is expected to reach (always more than ``done``)."""
        if self._targets:
            return self._targets[done] if done < len(self._targets) else done + 1
        return max(self._fixed, done + 1)


class CurveAdmission:
    """The shadow BatchTable that answers ``admissible(now, stack, queue)``; rebuilt when the table changes."""


    def __init__(self, table: LatencyTable, lengths: DecodeLengths) -> None:
        self.graph: ModelGraph = table.graph
        self.dense = table.dense
        self.lengths = lengths
        g = self.graph
        # body[s][b]: one iteration of the loop body that starts at stage s, at batch b (0 where s starts none)
        self.body: list[list[float]] = []
        for s in range(g.n):
            if g.loop_type[s] is not None and g.block_start[s] == s:
                stages = range(s, g.block_end[s] + 1)
                self.body.append([sum(self.dense[i][b] for i in stages) for b in range(len(self.dense[0]))])
            else:
                self.body.append([])

    def _target(self, node: int, r: Request) -> int:
        """Predicted decoder steps of ``r`` sitting before stage ``node`` (its progress counts inside the decoder)."""
        done = r.loop_iter if self.graph.loop_type[node] is StageType.DECODER else 0
        return self.lengths.target(done)

    def slacks(self, now: float, stack: Sequence, queued: Sequence[Request], cap: int, scale: float) -> list[float]:
        """Deadline - predicted finish of every request in flight (stack order, bottom first, then each entry's
        order) followed by the ``queued`` requests admitted now, each pushed as one new sub-batch at stage 0."""
        g = self.graph
        n, dense, body = g.n, self.dense, self.body
        groups: list[list] = []
        idx = 0
        for e in stack:
            members = []
            for r in e.reqs:
                members.append([r.deadline, r.enc_steps, r.loop_iter, self._target(e.node, r), idx])
                idx += 1
            groups.append([e.node, members])
        if queued:
            first = self.lengths.target(0)
            groups.append([0, [[r.deadline, r.enc_steps, 0, first, idx + i] for i, r in enumerate(queued)]])
        out = [math.inf] * (idx + len(queued))
        t = now
        while groups:
            while len(groups) >= 2 and groups[-1][0] == groups[-2][0] and \
                    len(groups[-1][1]) + len(groups[-2][1]) <= cap:
                top = groups.pop()
                groups[-1][1] = groups[-1][1] + top[1]
            node, members = groups[-1]
            b = len(members)
            loop = g.loop_type[node]
            if loop is not None and g.block_start[node] == node and not (
                    len(groups) >= 2 and g.loop_type[groups[-2][0]] is not None
                    and g.block_start[groups[-2][0]] == node):
                # a whole loop body ahead and nothing below to merge with inside it: skip to the last iteration
                # before the first row leaves
                enc = loop is StageType.ENCODER
                skip = min((m[_ENC] if enc else m[_TARGET]) - m[_ITER] for m in members) - 1
                if skip > 0:
                    t += skip * body[node][b] * scale
                    for m in members:
                        m[_ITER] += skip
            groups.pop()
            t += dense[node][b] * scale
            if not g.is_loop_end[node]:
                if node + 1 >= n:
                    for m in members:
                        out[m[_INDEX]] = m[_DEADLINE] - t
                else:
                    groups.append([node + 1, members])
                continue
            enc = loop is StageType.ENCODER
            cont, done = [], []
            for m in members:
                m[_ITER] += 1
                if m[_ITER] >= (m[_ENC] if enc else m[_TARGET]):
                    m[_ITER] = 0
                    done.append(m)
                else:
                    cont.append(m)
            going = [g.block_start[node], cont] if cont else None
            leaving = None
            if done:
                if node + 1 >= n:
                    for m in done:
                        out[m[_INDEX]] = m[_DEADLINE] - t
                else:
                    leaving = [node + 1, done]
            # as LazyBatching.job_done: encoders on top (they catch up with the leavers), finished decodes on top
            for x in ((leaving, going) if enc else (going, leaving)):
                if x is not None:
                    groups.append(x)
        return out

    def admissible(self, now: float, stack: Sequence, queue: Sequence[Request], room: int, cap: int,
                   scale: float) -> tuple[int, float]:
        """The largest k <= ``room`` such that admitting the first k queued requests now keeps every deadline that
        can still be met, and the smallest slack left over those deadlines (inf when none). Deadlines that are lost
        anyway block admission only where ``lost_block`` (see the module docstring)."""
        base = self.slacks(now, stack, (), cap, scale)
        hi = min(room, len(queue))
        best = min((v for v in base if v >= 0.0), default=math.inf)
        if hi <= 0:
            return 0, best
        block = self.lengths.lost_block
        # floors[i]: the least slack request i may be left with; a lost deadline is no floor (-inf), or, where lost
        # deadlines block, its slack with no newcomer (it may not be delayed at all)
        floors = [0.0 if v >= 0.0 else (v if block else -math.inf) for v in base]
        head = list(islice(queue, hi))  # not the whole queue: past capacity it is long, and this runs per decision
        for r in head:  # a newcomer: the same rule on its slack running alone from now
            alone = self.slacks(now, (), (r,), cap, scale)[0]
            floors.append(0.0 if alone >= 0.0 else (alone if block else -math.inf))
        lo = 0
        while lo < hi:  # the largest k that keeps every floor (slack falls as k grows)
            mid = (lo + hi + 1) // 2
            sl = self.slacks(now, stack, head[:mid], cap, scale)
            if all(v >= f for v, f in zip(sl, floors)):
                lo, best = mid, min((v for v, f in zip(sl, floors) if f == 0.0), default=math.inf)
            else:
                hi = mid - 1
        return lo, best
