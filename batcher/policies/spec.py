"""Policy specs as users write them on the command line and in config.pbtxt parameters.

    serial
    adhoc                     serve what has arrived when the device frees (GraphBatching, no window)
    monitor                   BatchMonitor/BatchDispatcher: monitor:window_ms=1000,max_batch_size=32,rate_sigma=1
    deadline                  the largest batch that still meets the oldest request's deadline
    cellular                  cell-level batching (BatchMaker): cellular:max_batch_size=32
    lazy                      lazy:max_batch_size=32,dec_timesteps=10,min_batch_gain=0.2
    lazy:preempt=benefit      preempt only where it also lowers the summed latency (not the paper's rule)
    eager                     work-conserving like Triton's batcher, preempting where the table predicts it pays
                              (the default of `repo add`): eager:max_batch_size=32,min_gain=0.02,boundary_cost_us=80
    oracle                    oracle:dec_timesteps_coverage=0.8
    graph:5                   GraphB(5): max_queue_delay of 5 ms (the paper's batching time-window)
    graph:max_queue_delay_microseconds=5000,max_batch_size=64,preferred_batch_size=4/8

Keys follow Triton's config names (max_batch_size, max_queue_delay_microseconds, preferred_batch_size). What each
name accepts, builds and is labelled lives in one table, ``registry.ENTRIES``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..lengths import LengthHistogram
from .base import Policy
from .registry import ALIASES, BY_NAME, ENTRIES, BuildArgs, PolicyEntry, parse_value

POLICY_NAMES = tuple(e.name for e in ENTRIES)


@dataclass(frozen=True)
class PolicySpec:
    """A parsed policy spec; ``build()`` makes a fresh policy (policies hold per-run state)."""

    kind: str
    params: dict[str, Any] = field(default_factory=dict)
    text: str = ""

    @property
    def entry(self) -> PolicyEntry:
        return BY_NAME[self.kind]

    @property
    def label(self) -> str:
        return self.entry.label(self.params)

    @property
    def sla_aware(self) -> bool:
        """Whether the policy's decisions depend on request deadlines (so one run per SLA target is needed)."""
        return self.entry.sla_aware

    def build(self, *, max_batch_size: int | None = None, length_histogram: LengthHistogram | None = None,
              dec_timesteps_coverage: float = 0.9) -> Policy:
        """A fresh policy; the spec's own parameters win over the keyword defaults given here."""
        p = dict(self.params)
        mbs = p.pop("max_batch_size", max_batch_size)
        return self.entry.make(p, BuildArgs({} if mbs is None else {"max_batch_size": mbs}, length_histogram,
                                            dec_timesteps_coverage))


def parse_policy(text: str) -> PolicySpec:
    spec = text.strip()
    kind, _, rest = spec.partition(":")
    kind = kind.strip().lower()
    kind = ALIASES.get(kind, kind)
    entry = BY_NAME.get(kind)
    if entry is None:
        raise ConfigError(f"unknown policy {text!r}; choose one of {', '.join(POLICY_NAMES)}", field="policy")
    params: dict[str, Any] = {}
    rest = rest.strip()
    if rest:
        if entry.bare_value is not None and "=" not in rest:
            rest = f"{entry.bare_value}={rest}"
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq:
                raise ConfigError(f"policy {text!r}: expected key=value, got {item!r}", field="policy")
            if key not in entry.params:
                allowed = ", ".join(sorted(entry.params)) or "none"
                raise ConfigError(f"policy {kind!r} has no parameter {key!r} (allowed: {allowed})", field=key)
            params[key] = parse_value(kind, key, entry.params[key], value.strip())
    if "max_queue_delay_ms" in params:
        params["max_queue_delay_microseconds"] = int(round(params.pop("max_queue_delay_ms") * 1000))
    return PolicySpec(kind, params, spec)
