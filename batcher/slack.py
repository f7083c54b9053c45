"""The SLA-aware slack predictor of LazyBatching (paper section IV-C).

Eq. 1/2:   Slack = SLA_target - (T_wait + sum_i SingleInputExecTime_i)
Alg. 1:    SingleInputExecTime = sum over stages of NodeLatency(n), ENCODER stages x enc_timesteps,
           DECODER stages x dec_timesteps

Batched execution is over-estimated as the sum of single-input times, so the predicted slack is conservative.
For requests already running, the predictor uses the single-input time of what is *left* of their program (the
same closed form, from their current stage and loop iteration), which is never more optimistic than Eq. 2.
"""

from __future__ import annotations

from typing import Iterable

from .errors import ConfigError
from .graph import StageType
from .latency_table import LatencyTable
from .lengths import LengthHistogram

DEFAULT_COVERAGE = 0.9


def slack(sla_target: float, t_wait: float, exec_times: Iterable[float]) -> float:
    """Eq. 2 (Eq. 1 when ``exec_times`` holds one value)."""
    return sla_target - (t_wait + sum(exec_times))


def resolve_dec_timesteps(dec_timesteps: int | None, histogram: LengthHistogram | None,
                          coverage: float = DEFAULT_COVERAGE) -> int:
    """dec_timesteps given outright, else the length that covers ``coverage`` of the histogram, else 1."""
    if dec_timesteps is not None:
        if not isinstance(dec_timesteps, int) or dec_timesteps < 1:
            raise ConfigError(f"dec_timesteps must be a positive integer, got {dec_timesteps!r}",
                              field="dec_timesteps")
        return dec_timesteps
    if histogram is not None:
        return histogram.coverage_length(coverage)
    return 1


class SlackPredictor:
    """Algorithm 1 over a latency table, in closed form so that each query is O(1)."""

    __slots__ = ("table", "dec_timesteps", "_within", "_body", "_after_static", "_after_enc", "_after_dec",
                 "_reps_kind")

    def __init__(self, table: LatencyTable, dec_timesteps: int = 1) -> None:
        g = table.graph
        self.table = table
        self.dec_timesteps = dec_timesteps
        lat = table.single
        n = g.n
        # _within[s]: single-input cost from stage s to the end of its loop body (inclusive)
        self._within = [0.0] * n
        for s in range(n - 1, -1, -1):
            self._within[s] = lat[s] + (self._within[s + 1] if s + 1 < n and g.block_end[s + 1] == g.block_end[s]
                                        and g.block_start[s + 1] == g.block_start[s] else 0.0)
        self._body = [self._within[g.block_start[s]] for s in range(n)]
        # cost of everything after the body holding s, split by how it scales: static, per enc step, per dec step
        self._after_static = [0.0] * n
        self._after_enc = [0.0] * n
        self._after_dec = [0.0] * n
        st = en = de = 0.0
        s = n - 1
        while s >= 0:
            start = g.block_start[s]
            for k in range(start, s + 1):
                self._after_static[k], self._after_enc[k], self._after_dec[k] = st, en, de
            body = self._within[start]
            t = g.loop_type[s]
            if t is None:
                st += body
            elif t is StageType.ENCODER:
                en += body
            else:
                de += body
            s = start - 1
        self._reps_kind = g.loop_type

    def single_input_exec_time(self, enc_steps: int = 1) -> float:
        """Algorithm 1 for a request with ``enc_steps`` encoder steps and the configured dec_timesteps."""
        return self.remaining(0, 0, enc_steps)

    def remaining(self, stage: int, loop_iter: int, enc_steps: int) -> float:
        """Single-input time still to run for a request about to run ``stage`` in loop iteration ``loop_iter``."""
        kind = self._reps_kind[stage]
        if kind is None:
            more = 0
        else:
            reps = enc_steps if kind is StageType.ENCODER else self.dec_timesteps
            more = reps - loop_iter - 1
            if more < 0:
                more = 0
        return (self._within[stage] + more * self._body[stage] + self._after_static[stage]
                + self._after_enc[stage] * enc_steps + self._after_dec[stage] * self.dec_timesteps)
