"""Every policy a user can name, in one table: how its string parses, what it builds, how results label it, and
whether its decisions read deadlines. Parsing (``spec.parse_policy``), building (``PolicySpec.build``), labels,
the config help (backend/parameters.py), the CLI's help (lazybatch/commands/) and ``repo add``'s ``triton:<us>``
(lazybatch/repo.py) all read it, so adding a policy is one ``PolicyEntry`` here and one class.

Keys follow Triton's config names (max_batch_size, max_queue_delay_microseconds, preferred_batch_size).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..errors import ConfigError
from ..lengths import LengthHistogram
from .base import Policy
from .cellular import CellularBatching
from .eager import EagerBatching
from .graph_batching import GraphBatching, Serial
from .lazy import LazyBatching, OracleLazyBatching
from .monitor import BatchMonitor, MaxBatchUnderDeadline

# How a parameter's value is read (``parse_value``).
WORD = "word"  # lower-cased, checked by the policy (batcher/policies/lazy.py PREEMPT_RULES)
FLAG = "flag"  # true/false
INT = "int"
FLOAT = "float"
SIZES = "sizes"  # 4/8 or "4 8": a tuple of ints

# The default policy: what `lazybatch repo add --policy` writes and what a config.pbtxt without a policy parameter gets.
DEFAULT_POLICY = "eager"


@dataclass(frozen=True)
class BuildArgs:
    """What ``PolicySpec.build`` hands an entry's factory besides the spec's own parameters: ``batch`` holds
    max_batch_size where one is given (the spec's wins over the caller's)."""

    batch: dict[str, Any]
    length_histogram: LengthHistogram | None
    dec_timesteps_coverage: float


@dataclass(frozen=True)
class PolicyEntry:
    """One row of the registry. ``make`` builds a fresh policy from the parsed parameters; ``label`` names a run in
    results (tests and committed benchmark JSON compare these strings)."""

    name: str
    summary: str  # one line for help texts
    params: Mapping[str, str]  # key -> WORD | FLAG | INT | FLOAT | SIZES
    make: Callable[[dict[str, Any], BuildArgs], Policy]
    label: Callable[[Mapping[str, Any]], str]
    sla_aware: bool = False  # its decisions depend on request deadlines (so one run per SLA target is needed)
    aliases: tuple[str, ...] = ()
    bare_value: str | None = None  # the key a bare value sets (graph:5 -> max_queue_delay_ms=5)
    # Traits the backend and `repo add` read instead of a policy's name or class:
    batches: bool = True  # False: one request at a time (serial): the backend caps its sub-batches at 1
    whole_graph_spans: bool = False  # asks for spans of stages (StageJob.stop): a span of every stage may run as
    #   one whole-graph pass (backend/fusion.py); the policy's own ``spans`` attribute may turn it off
    whole_when_unbatched: bool = False  # where its batch cap comes out at 1 no stage boundary is ever used, so
    #   fuse_stages: auto runs whole passes (the slack predictor's min_batch_gain decides the cap)
    inline_passes: bool = False  # answers the inline route's questions (backend/inline.py): `repo add` puts Triton's
    #   dynamic batcher at 0 ms in front, so that execute may run whole passes on what it queued
    takes_length_histogram: bool = False  # seq2seq: reads the output-length histogram itself (backend/seq2seq.py),
    #   and a decoupled model's admission rule where the policy names none

    def takes(self, key: str) -> bool:
        """Whether the policy accepts parameter ``key`` (dec_timesteps, admission, ...)."""
        return key in self.params


# ------------------------------------------------------------------ labels
_Extras = tuple[tuple[str, Callable[[Any], str]], ...]
_BATCH: _Extras = (("max_batch_size", lambda v: f"b{v}"),)
_WINDOW: _Extras = (("window_ms", lambda v: f"{v:g}ms"), ("rate_sigma", lambda v: f"sigma{v:g}"))
_DEC: _Extras = (("dec_timesteps", lambda v: f"dec{v}"),)


def _label(base: str, extras: _Extras = _BATCH) -> Callable[[Mapping[str, Any]], str]:
    """``Base(b8,...)``: the parameters in ``extras`` that the spec sets, in that order; ``Base`` without any."""
    def label(p: Mapping[str, Any]) -> str:
        extra = [fmt(p[k]) for k, fmt in extras if k in p]
        return base + (f"({','.join(extra)})" if extra else "")
    return label


def _graph_label(p: Mapping[str, Any]) -> str:
    ms = p.get("max_queue_delay_microseconds", 0) / 1000
    extra = f",b{p['max_batch_size']}" if "max_batch_size" in p else ""
    return f"GraphB({ms:g}{extra})"


# ------------------------------------------------------------------ factories
def _adhoc(p: dict[str, Any], a: BuildArgs) -> Policy:
    return GraphBatching(max_queue_delay=0.0, name="adhoc", **a.batch)


def _stack(cls: type[LazyBatching], keys: tuple[str, ...]) -> Callable[[dict[str, Any], BuildArgs], Policy]:
    """LazyBatching and its kin: the slack predictor's arguments, then the entry's own keys where given."""
    def make(p: dict[str, Any], a: BuildArgs) -> Policy:
        return cls(dec_timesteps=p.get("dec_timesteps"),
                   dec_timesteps_coverage=p.get("dec_timesteps_coverage", a.dec_timesteps_coverage),
                   length_histogram=a.length_histogram, **{k: p[k] for k in keys if k in p}, **a.batch)
    return make


_MBS = {"max_batch_size": INT}
_STACK = {"max_batch_size": INT, "dec_timesteps": INT, "dec_timesteps_coverage": FLOAT}
_LAZY = {**_STACK, "min_batch_gain": FLOAT, "preempt": WORD}

# The order is POLICY_NAMES' (error messages list it).
ENTRIES: tuple[PolicyEntry, ...] = (
    PolicyEntry("eager", "work-conserving like Triton's batcher, preempting at stage boundaries where the latency "
                "table predicts it pays (the default of `repo add`): eager:max_batch_size=32,min_gain=0.02,"
                "boundary_cost_us=80",
                {**_STACK, "min_gain": FLOAT, "boundary_cost_us": FLOAT, "spans": FLAG, "urgency": FLAG,
                 "admission": WORD, "join": WORD},
                _stack(EagerBatching, ("min_gain", "boundary_cost_us", "spans", "urgency", "admission", "join")),
                _label("Eager", _BATCH + _DEC), sla_aware=True, whole_graph_spans=True, inline_passes=True,
                takes_length_histogram=True),
    PolicyEntry("serial", "one request at a time, whole graph", {}, lambda p, a: Serial(), lambda p: "Serial",
                batches=False),
    PolicyEntry("graph", "GraphB(N): graph:5 is a max_queue_delay of 5 ms (the paper's batching time-window); "
                "graph:max_queue_delay_microseconds=5000,max_batch_size=64,preferred_batch_size=4/8",
                {"max_batch_size": INT, "max_queue_delay_microseconds": INT, "max_queue_delay_ms": FLOAT,
                 "preferred_batch_size": SIZES},
                lambda p, a: GraphBatching(max_queue_delay=p.get("max_queue_delay_microseconds", 0) / 1e6,
                                           preferred_batch_sizes=p.get("preferred_batch_size", ()), **a.batch),
                _graph_label, aliases=("graphb", "dynamic"), bare_value="max_queue_delay_ms"),
    PolicyEntry("adhoc", "serve what has arrived when the device frees (GraphBatching, no window)", _MBS, _adhoc,
                _label("AdHoc"), aliases=("ad-hoc",)),
    PolicyEntry("monitor", "BatchMonitor/BatchDispatcher: monitor:window_ms=1000,max_batch_size=32,rate_sigma=1",
                {"max_batch_size": INT, "window_ms": FLOAT, "rate_sigma": FLOAT},
                lambda p, a: BatchMonitor(window=p.get("window_ms", 1000.0) / 1e3, rate_sigma=p.get("rate_sigma", 1.0),
                                          **a.batch),
                _label("BatchMonitor", _BATCH + _WINDOW), aliases=("batchmonitor",)),
    PolicyEntry("deadline", "the largest batch that still meets the oldest request's deadline", _MBS,
                lambda p, a: MaxBatchUnderDeadline(**a.batch), _label("MaxBatchDeadline"),
                aliases=("maxbatch",)),
    PolicyEntry("cellular", "cell-level batching (BatchMaker): cellular:max_batch_size=32", _MBS,
                lambda p, a: CellularBatching(**a.batch), _label("Cellular"), aliases=("cell", "batchmaker")),
    PolicyEntry("lazy", "the paper's LazyBatching: lazy:max_batch_size=32,dec_timesteps=10,min_batch_gain=0.2; "
                "lazy:preempt=benefit preempts only where it also lowers the summed latency (not the paper's rule)",
                _LAZY, _stack(LazyBatching, ("min_batch_gain", "preempt")), _label("LazyB", _BATCH + _DEC), sla_aware=True,
                aliases=("lazyb", "lazybatching"), whole_when_unbatched=True),
    PolicyEntry("oracle", "LazyBatching whose slack test knows the batched latencies: oracle:dec_timesteps_coverage=0.8",
                _LAZY, _stack(OracleLazyBatching, ("min_batch_gain", "preempt")), _label("Oracle", _BATCH + _DEC),
                sla_aware=True, whole_when_unbatched=True),
)
BY_NAME: dict[str, PolicyEntry] = {e.name: e for e in ENTRIES}
ALIASES: dict[str, str] = {a: e.name for e in ENTRIES for a in e.aliases}


# ------------------------------------------------------------------ Triton's own batcher
@dataclass
class TritonPolicy:
    """``triton:<us>`` -> whole graph under Triton's dynamic batcher with that max_queue_delay (None: no batcher)."""

    delay_us: int | None

    @property
    def label(self) -> str:
        return "Triton" if self.delay_us is None else f"Triton({self.delay_us}us)"

    sla_aware = False


TRITON = "triton"
TRITON_SUMMARY = ("the whole graph under Triton's own dynamic_batching with that max_queue_delay_microseconds "
                  "(`repo add` only)")


def parse_triton(text: str) -> TritonPolicy | None:
    """``triton``, ``triton:<us>``, ``triton:none|off``; None where ``text`` names another policy."""
    t = text.strip().lower()
    if not (t == TRITON or t.startswith(TRITON + ":")):
        return None
    _, _, rest = t.partition(":")
    rest = rest.strip()
    if rest in ("", "none", "off"):
        return TritonPolicy(None if rest in ("none", "off") else 0)
    try:
        us = int(rest)
    except ValueError:
        raise ConfigError(f"triton:<max_queue_delay_microseconds> expects an integer, got {rest!r}",
                          field="--policy") from None
    if us < 0:
        raise ConfigError("max_queue_delay_microseconds must be >= 0", field="--policy")
    return TritonPolicy(us)


# ------------------------------------------------------------------ parameters and help
def parse_value(policy: str, key: str, kind: str, value: str) -> Any:
    """One ``key=value`` of ``policy`` read as ``kind``."""
    if kind == WORD:
        return value.lower()
    if kind == FLAG:
        if value.lower() in ("true", "1", "yes", "on"):
            return True
        if value.lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"policy {policy!r}: {key}={value!r} must be true or false", field=key)
    try:
        if kind == SIZES:
            return tuple(int(v) for v in value.replace("/", " ").split())
        if kind == FLOAT:
            return float(value)
        return int(value)
    except ValueError:
        raise ConfigError(f"policy {policy!r}: {key}={value!r} is not a valid number", field=key) from None


def sla_aware(text: str) -> bool:
    """Whether the policy a user wrote (``triton:<us>`` included) decides on request deadlines: one run per SLA
    target is then needed, and its requests must carry their SLA."""
    triton = parse_triton(text)
    if triton is not None:
        return triton.sla_aware
    from .spec import parse_policy
    return parse_policy(text).sla_aware


def policy_choices(*, triton: bool = False) -> str:
    """The policy names for a help text, ``a | b | ...`` (``triton:<us>`` last where ``repo add`` takes it)."""
    names = [e.name + (":<ms>" if e.bare_value else "") for e in ENTRIES]
    return " | ".join(names + ([f"{TRITON}:<us>"] if triton else []))


def policy_help(*, triton: bool = False) -> str:
    """One line per policy: its name and summary (``lazybatch repo add --help``, docs)."""
    lines = [f"{e.name}: {e.summary}" for e in ENTRIES]
    if triton:
        lines.append(f"{TRITON}:<us>: {TRITON_SUMMARY}")
    return "; ".join(lines)
