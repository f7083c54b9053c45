"""Sweeps of simulated runs over models, policies, arrival rates, SLA targets and seeds.

Each run is independent, so runs go to a process pool. Policies whose decisions ignore deadlines (serial, graph)
run once per (model, rate, seed) and are scored against every SLA target afterwards; SLA-aware policies (lazy,
oracle) run once per SLA target because the target steers their slack predictor.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Sequence

from tqdm import tqdm

from lazybatch.batcher.admission import QueuePolicy
from lazybatch.batcher.decisions import DecisionLog
from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.lengths import LengthHistogram
from lazybatch.batcher.policies.spec import PolicySpec, parse_policy
from lazybatch.formats.histograms import shipped_histogram

from . import paper_tables, workload
from .engine import Simulation
from .metrics import RunMetrics, measure

PAPER_POLICIES = ("serial", "graph:5", "graph:25", "graph:50", "graph:75", "graph:95", "lazy", "oracle")
PAPER_RATES = (16, 64, 128, 250, 500, 1000, 1500, 2000)


@dataclass(frozen=True)
class RunSpec:
    model: str  # a shipped model name or a latency-table path
    policy: str  # policy spec text, see batcher.policies.spec
    rate: float  # requests/s (ignored with a trace)
    seed: int
    sla_targets: tuple[float, ...]  # seconds; an SLA-aware run has exactly one
    requests: int = 1000
    max_batch_size: int | None = None
    dec_timesteps_coverage: float = 0.9
    length_histogram: str | None = None  # path; None = the shipped WMT-like histogram
    trace: str | None = None
    keep_latencies: bool = False
    max_queue_size: int = 0  # admission control (batcher/admission.py); rejected requests count as violations
    timeout_action: str = "DELAY"


@lru_cache(maxsize=32)
def load_table(model: str) -> LatencyTable:
    key = paper_tables.ALIASES.get(model.lower(), model.lower())
    if key in paper_tables.MODELS:
        return paper_tables.shipped_table(key)
    p = Path(model)
    if not p.exists() and key.startswith("npu_"):  # the NPU-modelled tables shipped with lazybatch.npu_model
        from lazybatch.npu_model.paper import DATA as NPU_DATA

        if (NPU_DATA / f"{key}.json").exists():
            p = NPU_DATA / f"{key}.json"
    if not p.exists():
        raise ConfigError(f"unknown model {model!r}: give one of {', '.join(paper_tables.MODELS)} (or npu_resnet50, "
                          "npu_gnmt, npu_transformer) or the path of "
                          "a latency table (.json/.csv) written by 'lazybatch profile' or 'lazybatch npu latency'",
                          field="model")
    return LatencyTable.load(p)


@lru_cache(maxsize=8)
def load_histogram(path: str | None) -> LengthHistogram:
    return LengthHistogram.load(shipped_histogram() if path is None else path)


@lru_cache(maxsize=8)
def _trace(path: str) -> tuple[workload.Arrival, ...]:
    return tuple(workload.load_trace(path))


def model_label(model: str) -> str:
    return load_table(model).name


def simulate_once(spec: RunSpec) -> tuple[RunMetrics, float]:
    """Run one simulation; returns its metrics and the wall time it took."""
    table = load_table(spec.model)
    hist = load_histogram(spec.length_histogram)
    policy = parse_policy(spec.policy).build(max_batch_size=spec.max_batch_size, length_histogram=hist,
                                              dec_timesteps_coverage=spec.dec_timesteps_coverage)
    if spec.trace:
        arrivals = list(_trace(spec.trace))
    else:
        arrivals = workload.poisson(spec.rate, spec.requests, spec.seed, graph=table.graph, lengths=hist)
    reqs = workload.requests(arrivals, spec.sla_targets[0])
    log = DecisionLog(capacity=1, enabled=False)
    sim = Simulation(table, policy, log=log, queue_policy=QueuePolicy(spec.max_queue_size, spec.timeout_action))
    t0 = time.perf_counter()
    sim.run(reqs)
    wall = time.perf_counter() - t0
    m = measure(reqs, sla_targets=spec.sla_targets, batch_hist=sim.batch_hist, stage_execs=sim.stage_execs,
                decisions=log.counts, keep_latencies=spec.keep_latencies, energy_j=sim.energy_j)
    return m, wall


def run_one(spec: RunSpec) -> list[dict]:
    m, wall = simulate_once(spec)
    label = parse_policy(spec.policy).label
    base = {
        "model": model_label(spec.model), "policy": label, "policy_spec": spec.policy, "rate": spec.rate,
        "seed": spec.seed, "requests": m.requests, "completed": m.completed, "throughput": m.throughput,
        "avg_ms": m.avg_latency * 1e3, "p50_ms": m.p50_latency * 1e3, "p90_ms": m.p90_latency * 1e3,
        "p99_ms": m.p99_latency * 1e3, "max_ms": m.max_latency * 1e3, "queue_p50_ms": m.queue_p50 * 1e3,
        "queue_p90_ms": m.queue_p90 * 1e3, "queue_p99_ms": m.queue_p99 * 1e3, "mean_batch": m.mean_batch,
        "stage_execs": m.stage_execs, "preempt": m.decisions.get("preempt", 0),
        "merge": m.decisions.get("merge", 0), "energy_mj_per_req": m.energy_mj_per_req,
        "req_per_joule": m.req_per_joule, "wall_s": wall, "batch_hist": m.batch_hist,
    }
    rows = []
    for sla, v in m.violations.items():
        row = dict(base, sla_ms=round(sla * 1e3, 6), sla_violation=v)
        if m.latencies is not None:
            row["latencies_ms"] = [x * 1e3 for x in m.latencies]
        rows.append(row)
    return rows


def plan(models: Sequence[str], policies: Sequence[str], rates: Sequence[float], sla_targets: Sequence[float],
         seeds: int, *, requests: int = 1000, max_batch_size: int | None = None, dec_timesteps_coverage: float = 0.9,
         length_histogram: str | None = None, trace: str | None = None,
         keep_latencies_at: float | None = None, max_queue_size: int = 0,
         timeout_action: str = "DELAY") -> list[RunSpec]:
    """Every run a sweep needs (validated up front, so a typo fails before any work starts)."""
    queue = QueuePolicy(max_queue_size, timeout_action)
    if not sla_targets:
        raise ConfigError("at least one SLA target is needed", field="sla_ms")
    for s in sla_targets:
        if not s > 0:
            raise ConfigError(f"SLA targets must be positive, got {s * 1e3:g} ms", field="sla_ms")
    if seeds < 1:
        raise ConfigError(f"seeds must be at least 1, got {seeds}", field="seeds")
    specs: list[PolicySpec] = [parse_policy(p) for p in policies]
    for m in models:
        table = load_table(m)
        if max_batch_size is not None:
            table.check_covers(max_batch_size)
        if table.graph.is_seq2seq:
            load_histogram(length_histogram)
    if trace:
        _trace(trace)
        rates = [0.0]
    out = []
    for m in models:
        for ps in specs:
            # deadline rejection makes every policy's run depend on the SLA
            sla_aware = ps.sla_aware or queue.timeout_action == "REJECT"
            groups = [(s,) for s in sla_targets] if sla_aware else [tuple(sla_targets)]
            for r in rates:
                for slas in groups:
                    for seed in range(seeds):
                        out.append(RunSpec(m, ps.text, float(r), seed, slas, requests, max_batch_size,
                                           dec_timesteps_coverage, length_histogram, trace,
                                           keep_latencies_at is not None and seed == 0
                                           and float(r) == float(keep_latencies_at),
                                           queue.max_queue_size, queue.timeout_action))
    return out


def run(specs: Sequence[RunSpec], *, jobs: int = 1, progress: bool = True) -> list[dict]:
    # Big runs first, so that the pool's last workers do not wait on one straggler.
    order = sorted(specs, key=lambda s: (-s.rate, "oracle" not in s.policy))
    rows: list[dict] = []
    bar = tqdm(total=len(order), desc="simulating", unit="run", disable=not progress, leave=False)
    try:
        if jobs > 1 and len(order) > 1:
            ctx = mp.get_context("fork")
            with ctx.Pool(jobs) as pool:
                for r in pool.imap_unordered(run_one, order, chunksize=max(1, len(order) // (jobs * 16))):
                    rows.extend(r)
                    bar.update()
        else:
            for s in order:
                rows.extend(run_one(s))
                bar.update()
    finally:
        bar.close()
    rows.sort(key=lambda r: (r["model"], r["policy"], r["rate"], r["sla_ms"], r["seed"]))
    return rows


_METRICS = ("throughput", "avg_ms", "p50_ms", "p90_ms", "p99_ms", "sla_violation", "mean_batch", "queue_p50_ms",
            "queue_p99_ms", "preempt", "merge", "completed", "requests", "energy_mj_per_req", "req_per_joule")


def _q(xs: list[float], q: float) -> float:
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=4, method="inclusive")[0 if q == 25 else 2]


def summarize(rows: Iterable[dict]) -> list[dict]:
    """Mean over seeds of every metric, with the 25th/75th percentiles of latency, throughput and violations."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["policy"], r["rate"], r["sla_ms"]), []).append(r)
    out = []
    for (model, policy, rate, sla), rs in groups.items():
        s = {"model": model, "policy": policy, "policy_spec": rs[0]["policy_spec"], "rate": rate, "sla_ms": sla,
             "seeds": len(rs)}
        for k in _METRICS:
            s[k] = statistics.fmean(r[k] for r in rs)
        for k in ("avg_ms", "throughput", "sla_violation", "p99_ms"):
            xs = [r[k] for r in rs]
            s[f"{k}_p25"], s[f"{k}_p75"] = _q(xs, 25), _q(xs, 75)
        out.append(s)
    out.sort(key=lambda r: (r["model"], r["rate"], r["sla_ms"], r["policy"]))
    return out


@dataclass
class Comparison:
    model: str
    rate: float
    sla_ms: float
    lazy: dict
    best_latency: dict  # the GraphB row with the lowest average latency
    best_throughput: dict
    best_violation: dict
    extra: dict = field(default_factory=dict)

    @property
    def latency_ratio(self) -> float:  # > 1: LazyB is that many times lower
        return self.best_latency["avg_ms"] / self.lazy["avg_ms"]

    @property
    def throughput_ratio(self) -> float:  # > 1: LazyB is that many times higher
        return self.lazy["throughput"] / self.best_throughput["throughput"]

    def as_row(self) -> dict:
        return {"model": self.model, "rate": self.rate, "sla_ms": self.sla_ms,
                "lazy_avg_ms": self.lazy["avg_ms"], "best_graph_latency": self.best_latency["policy"],
                "best_graph_avg_ms": self.best_latency["avg_ms"], "latency_ratio": self.latency_ratio,
                "lazy_throughput": self.lazy["throughput"], "best_graph_throughput_policy":
                    self.best_throughput["policy"], "best_graph_throughput": self.best_throughput["throughput"],
                "throughput_ratio": self.throughput_ratio, "lazy_violation": self.lazy["sla_violation"],
                "best_graph_violation_policy": self.best_violation["policy"],
                "best_graph_violation": self.best_violation["sla_violation"]}


def compare(summary: Sequence[dict], lazy_label: str = "LazyB") -> list[Comparison]:
    """LazyB against the best GraphB(N) at every (model, rate, SLA target), per metric."""
    out = []
    keys = sorted({(r["model"], r["rate"], r["sla_ms"]) for r in summary})
    for key in keys:
        rows = [r for r in summary if (r["model"], r["rate"], r["sla_ms"]) == key]
        lazy = [r for r in rows if r["policy"] == lazy_label]
        graph = [r for r in rows if r["policy"].startswith("GraphB")]
        if not lazy or not graph:
            continue
        out.append(Comparison(key[0], key[1], key[2], lazy[0],
                              min(graph, key=lambda r: r["avg_ms"]),
                              max(graph, key=lambda r: r["throughput"]),
                              min(graph, key=lambda r: (r["sla_violation"], r["avg_ms"]))))
    return out


def to_jsonable(rows: Iterable[dict]) -> list[dict]:
    return [{k: (v if not isinstance(v, dict) else {str(a): b for a, b in v.items()}) for k, v in r.items()}
            for r in rows]


__all__ = ["RunSpec", "plan", "run", "summarize", "compare", "Comparison", "PAPER_POLICIES", "PAPER_RATES",
           "asdict"]
