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

Keys follow Triton's config names (max_batch_size, max_queue_delay_microseconds, preferred_batch_size).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..lengths import LengthHistogram
from .base import Policy
from .cellular import CellularBatching
from .eager import EagerBatching
from .graph_batching import GraphBatching, Serial
from .lazy import LazyBatching, OracleLazyBatching
from .monitor import BatchMonitor, MaxBatchUnderDeadline

POLICY_NAMES = ("eager", "serial", "graph", "adhoc", "monitor", "deadline", "cellular", "lazy", "oracle")
_KEYS = {
    "serial": set(),
    "adhoc": {"max_batch_size"},
    "monitor": {"max_batch_size", "window_ms", "rate_sigma"},
    "deadline": {"max_batch_size"},
    "cellular": {"max_batch_size"},
    "graph": {"max_batch_size", "max_queue_delay_microseconds", "max_queue_delay_ms", "preferred_batch_size"},
    "lazy": {"max_batch_size", "dec_timesteps", "dec_timesteps_coverage", "min_batch_gain", "preempt"},
    "oracle": {"max_batch_size", "dec_timesteps", "dec_timesteps_coverage", "min_batch_gain", "preempt"},
    "eager": {"max_batch_size", "dec_timesteps", "dec_timesteps_coverage", "min_gain", "boundary_cost_us", "spans",
              "urgency", "admission", "join"},
}


@dataclass(frozen=True)
class PolicySpec:
    """A parsed policy spec; ``build()`` makes a fresh policy (policies hold per-run state)."""

    kind: str
    params: dict[str, Any] = field(default_factory=dict)
    text: str = ""

    @property
    def label(self) -> str:
        p = self.params
        if self.kind == "serial":
            return "Serial"
        if self.kind in ("adhoc", "monitor", "deadline", "cellular"):
            base = {"adhoc": "AdHoc", "monitor": "BatchMonitor", "deadline": "MaxBatchDeadline",
                    "cellular": "Cellular"}[self.kind]
            extra = [f"b{p['max_batch_size']}"] if "max_batch_size" in p else []
            if "window_ms" in p:
                extra.append(f"{p['window_ms']:g}ms")
            if "rate_sigma" in p:
                extra.append(f"sigma{p['rate_sigma']:g}")
            return base + (f"({','.join(extra)})" if extra else "")
        if self.kind == "graph":
            ms = p.get("max_queue_delay_microseconds", 0) / 1000
            extra = f",b{p['max_batch_size']}" if "max_batch_size" in p else ""
            return f"GraphB({ms:g}{extra})"
        base = {"lazy": "LazyB", "oracle": "Oracle", "eager": "Eager"}[self.kind]
        extra = []
        if "max_batch_size" in p:
            extra.append(f"b{p['max_batch_size']}")
        if "dec_timesteps" in p:
            extra.append(f"dec{p['dec_timesteps']}")
        return base + (f"({','.join(extra)})" if extra else "")

    @property
    def sla_aware(self) -> bool:
        """Whether the policy's decisions depend on request deadlines (so one run per SLA target is needed)."""
        return self.kind in ("lazy", "oracle", "eager")

    def build(self, *, max_batch_size: int | None = None, length_histogram: LengthHistogram | None = None,
              dec_timesteps_coverage: float = 0.9) -> Policy:
        """A fresh policy; the spec's own parameters win over the keyword defaults given here."""
        p = dict(self.params)
        if self.kind == "serial":
            return Serial()
        mbs = p.pop("max_batch_size", max_batch_size)
        kw: dict[str, Any] = {} if mbs is None else {"max_batch_size": mbs}
        if self.kind == "adhoc":
            policy = GraphBatching(max_queue_delay=0.0, **kw)
            policy.name = "adhoc"
            return policy
        if self.kind == "monitor":
            return BatchMonitor(window=p.get("window_ms", 1000.0) / 1e3, rate_sigma=p.get("rate_sigma", 1.0), **kw)
        if self.kind == "deadline":
            return MaxBatchUnderDeadline(**kw)
        if self.kind == "cellular":
            return CellularBatching(**kw)
        if self.kind == "graph":
            return GraphBatching(max_queue_delay=p.get("max_queue_delay_microseconds", 0) / 1e6,
                                 preferred_batch_sizes=p.get("preferred_batch_size", ()), **kw)
        if self.kind == "eager":
            return EagerBatching(dec_timesteps=p.get("dec_timesteps"),
                                 dec_timesteps_coverage=p.get("dec_timesteps_coverage", dec_timesteps_coverage),
                                 length_histogram=length_histogram,
                                 **{k: p[k] for k in ("min_gain", "boundary_cost_us", "spans", "urgency", "admission",
                                                   "join")
                                    if k in p}, **kw)
        cls = LazyBatching if self.kind == "lazy" else OracleLazyBatching
        return cls(dec_timesteps=p.get("dec_timesteps"),
                   dec_timesteps_coverage=p.get("dec_timesteps_coverage", dec_timesteps_coverage),
                   length_histogram=length_histogram,
                   **({"min_batch_gain": p["min_batch_gain"]} if "min_batch_gain" in p else {}),
                   **({"preempt": p["preempt"]} if "preempt" in p else {}), **kw)


def _num(kind: str, key: str, value: str) -> Any:
    if key in ("preempt", "admission", "join"):  # a word, checked by the policy (batcher/policies/lazy.py PREEMPT_RULES)
        return value.lower()
    if key in ("spans", "urgency"):
        if value.lower() in ("true", "1", "yes", "on"):
            return True
        if value.lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"policy {kind!r}: {key}={value!r} must be true or false", field=key)
    try:
        if key == "preferred_batch_size":
            return tuple(int(v) for v in value.replace("/", " ").split())
        if key in ("dec_timesteps_coverage", "max_queue_delay_ms", "window_ms", "rate_sigma", "min_batch_gain",
                   "min_gain", "boundary_cost_us"):
            return float(value)
        return int(value)
    except ValueError:
        raise ConfigError(f"policy {kind!r}: {key}={value!r} is not a valid number", field=key) from None


def parse_policy(text: str) -> PolicySpec:
    spec = text.strip()
    kind, _, rest = spec.partition(":")
    kind = kind.strip().lower()
    aliases = {"graphb": "graph", "dynamic": "graph", "lazyb": "lazy", "lazybatching": "lazy",
               "batchmonitor": "monitor", "cell": "cellular", "batchmaker": "cellular", "ad-hoc": "adhoc", "maxbatch": "deadline"}
    kind = aliases.get(kind, kind)
    if kind not in _KEYS:
        raise ConfigError(f"unknown policy {text!r}; choose one of {', '.join(POLICY_NAMES)}", field="policy")
    params: dict[str, Any] = {}
    rest = rest.strip()
    if rest:
        if kind == "graph" and "=" not in rest:
            rest = f"max_queue_delay_ms={rest}"
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq:
                raise ConfigError(f"policy {text!r}: expected key=value, got {item!r}", field="policy")
            if key not in _KEYS[kind]:
                allowed = ", ".join(sorted(_KEYS[kind])) or "none"
                raise ConfigError(f"policy {kind!r} has no parameter {key!r} (allowed: {allowed})", field=key)
            params[key] = _num(kind, key, value.strip())
    if "max_queue_delay_ms" in params:
        params["max_queue_delay_microseconds"] = int(round(params.pop("max_queue_delay_ms") * 1000))
    return PolicySpec(kind, params, spec)
