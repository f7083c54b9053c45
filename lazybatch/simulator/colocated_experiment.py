"""The LazyBatching paper's co-location experiment, simulated: several models on one device, lazybatch's default on
the shared device against each model batching on its own.

The paper (seed 001, section on co-located inference): "whenever a new request is received, our scheduler examines
whether lazily batching this request will violate the SLA of the currently on-going requests of co-located ML
models"; four co-located models, 2.4x lower latency and 1.8x higher throughput than graph batching.

Configurations (``CONFIGS``: name -> (each model's policy, how the device is shared, colocated.py)):

- ``colocated``: eager, lazybatch's default, every model on one ``SharedDevice`` (batcher/device.py);
- ``eager_ps``: the same eager per model, nothing across models: processor sharing (lazybatch without the device);
- ``graph_<N>ms_ps``: Triton's dynamic batcher (graph:N) per model, processor sharing;
- ``graph_<N>ms_token``: the same behind Triton's rate limiter with one device token (whole executions).

Load: a fraction of the device's batch-1 capacity, ``sum_m rate_m x t1_m`` (t1_m: model m's mean latency alone at
batch 1, loads_on_table.single_request_ms); ``shares`` split the requests between models (equal, or one model
70%). Each model's SLA is ``sla_multiple x t1_m``. Each model's p99 is also normalised to its p99 alone: the same
arrivals of that model alone on the device under the same policy.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Sequence

from lazybatch.batcher.decisions import DecisionLog
from lazybatch.batcher.device import DEFAULT_LAG_S, SharedDevice
from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.lengths import LengthHistogram
from lazybatch.batcher.policies.spec import parse_policy
from lazybatch.batcher.request import Request

from . import workload
from .colocated import ColocatedSimulation, Tenant
from .loads_on_table import single_request_ms
from .mixed import class_results
from .sweep import load_histogram, load_table

PAPER_FOUR = ("resnet50", "bert_base", "gnmt", "transformer")
OURS = "colocated"
CONFIGS: dict[str, tuple[str, str]] = {
    OURS: ("eager", "device"),
    "eager_ps": ("eager", "ps"),
    "graph_0ms_ps": ("graph:0", "ps"),
    "graph_5ms_ps": ("graph:5", "ps"),
    "graph_0ms_token": ("graph:0", "token"),
    "graph_5ms_token": ("graph:5", "token"),
}
GRAPH_BASELINES = tuple(c for c in CONFIGS if c.startswith("graph_"))
METRICS = ("avg_ms", "p99_ms", "violations", "throughput")
SKEW = 0.7  # the skewed mix: the first model's share of the requests


def mixes(n_models: int) -> dict[str, list[float]]:
    """Equal shares, and the first model 70% of the requests (the rest equal)."""
    if n_models == 1:
        return {"equal": [1.0]}
    rest = (1.0 - SKEW) / (n_models - 1)
    return {"equal": [1.0 / n_models] * n_models, "skewed": [SKEW] + [rest] * (n_models - 1)}


class Experiment:
    """Models, their tables and t1, and the runs of one co-location sweep (alone runs cached)."""

    def __init__(self, models: Sequence[str] = PAPER_FOUR, *, requests: int = 2000, sla_multiple: float = 10.0,
                 max_batch_size: int | None = None, lag: float = DEFAULT_LAG_S,
                 histogram: LengthHistogram | None = None) -> None:
        if len(models) < 1:
            raise ConfigError("at least one model is needed", field="model")
        if requests < len(models):
            raise ConfigError(f"--requests must be at least the number of models ({len(models)})", field="requests")
        if not sla_multiple > 0:
            raise ConfigError(f"the SLA multiple must be positive, got {sla_multiple!r}", field="sla_multiple")
        self.models = list(models)
        self.tables = [load_table(m) for m in self.models]
        self.names = [t.name for t in self.tables]
        if len(set(self.names)) != len(self.names):
            raise ConfigError(f"co-located models must differ, got {', '.join(self.names)}", field="model")
        self.hist = histogram if histogram is not None else load_histogram(None)
        self.hists = [self.hist if t.graph.is_seq2seq else None for t in self.tables]
        self.t1 = [single_request_ms(t, h) / 1e3 for t, h in zip(self.tables, self.hists)]
        self.requests = requests
        self.sla_multiple = sla_multiple
        self.max_batch_size = max_batch_size
        self.lag = lag
        self._alone: dict[tuple, float] = {}

    def rates(self, load: float, shares: Sequence[float]) -> list[float]:
        """Requests/s per model: ``shares`` of a total whose batch-1 device time is ``load`` of every second."""
        total = load / sum(s * t for s, t in zip(shares, self.t1))
        return [s * total for s in shares]

    def arrivals(self, i: int, rate: float, n: int, seed: int) -> list[Request]:
        arr = workload.poisson(rate, n, seed * 1009 + i, graph=self.tables[i].graph, lengths=self.hists[i])
        return workload.requests(arr, self.sla_multiple * self.t1[i])

    def _tenant(self, i: int, policy: str, reqs: list[Request]) -> Tenant:
        pol = parse_policy(policy).build(max_batch_size=self.max_batch_size, length_histogram=self.hists[i])
        return Tenant(self.names[i], self.tables[i], pol, reqs, log=DecisionLog(capacity=1, enabled=False))

    def counts(self, shares: Sequence[float]) -> list[int]:
        return [max(1, round(self.requests * s)) for s in shares]

    def run(self, config: str, load: float, shares: Sequence[float], seed: int) -> dict[str, Any]:
        """One co-located run: per model and over all requests, avg/p99 (ms), violations of each request's own SLA,
        throughput (OK answers/s over the run), p99 alone and p99 normalised to it; device shares where shared."""
        policy, sharing = CONFIGS[config]
        rates = self.rates(load, shares)
        counts = self.counts(shares)
        reqs = [self.arrivals(i, rates[i], counts[i], seed) for i in range(len(self.models))]
        device = SharedDevice(lag=self.lag) if sharing == "device" else None
        sim = ColocatedSimulation([self._tenant(i, policy, r) for i, r in enumerate(reqs)], sharing=sharing,
                                  device=device)
        sim.run()
        flat = [r for rs in reqs for r in rs]
        span = max(r.finish for r in flat) - min(r.arrival for r in flat)
        names = [self.names[i] for i, rs in enumerate(reqs) for _ in rs]
        per = class_results(flat, names, span)
        out: dict[str, Any] = {"all": class_results(flat, ["all"] * len(flat), span)["all"]}
        for i, name in enumerate(self.names):
            m = per[name]
            m["rate"] = rates[i]
            m["p99_alone_ms"] = self.p99_alone(policy, i, rates[i], counts[i], seed)
            m["p99_norm"] = m["p99_ms"] / m["p99_alone_ms"] if m["p99_alone_ms"] > 0 else math.nan
            out[name] = m
        if device is not None:
            out["device"] = {s["model"]: {"share": s["share"], "wait_avg_ms": s["wait_avg_s"] * 1e3,
                                          "wait_max_ms": s["wait_max_s"] * 1e3} for s in device.stats()}
        return out

    def p99_alone(self, policy: str, i: int, rate: float, n: int, seed: int) -> float:
        """Model i's p99 (ms) with the same arrivals alone on the device under ``policy`` (cached: alone, the
        sharing does not matter, and a one-model SharedDevice schedules as no device)."""
        key = (policy, i, round(rate, 9), n, seed)
        if key not in self._alone:
            reqs = self.arrivals(i, rate, n, seed)
            ColocatedSimulation([self._tenant(i, policy, reqs)], sharing="ps").run()
            span = max(r.finish for r in reqs) - reqs[0].arrival
            self._alone[key] = class_results(reqs, ["x"] * len(reqs), span)["x"]["p99_ms"]
        return self._alone[key]

    def sweep(self, loads: Sequence[float], mix_names: Sequence[str], seeds: int,
              configs: Sequence[str] = tuple(CONFIGS)) -> dict[str, Any]:
        """Every configuration at every load, mix and seed; the cells keep each seed's run."""
        all_mixes = mixes(len(self.models))
        for m in mix_names:
            if m not in all_mixes:
                raise ConfigError(f"unknown mix {m!r}; choose from {', '.join(all_mixes)}", field="mix")
        for c in configs:
            if c not in CONFIGS:
                raise ConfigError(f"unknown configuration {c!r}; choose from {', '.join(CONFIGS)}", field="config")
        cells = []
        for mix in mix_names:
            for load in loads:
                for config in configs:
                    runs = [self.run(config, load, all_mixes[mix], seed) for seed in range(seeds)]
                    cells.append({"mix": mix, "load": float(load), "config": config, "runs": runs})
        return {"models": self.names, "t1_ms": [t * 1e3 for t in self.t1], "sla_multiple": self.sla_multiple,
                "requests": self.requests, "seeds": seeds, "lag_ms": self.lag * 1e3,
                "shares": {m: all_mixes[m] for m in mix_names}, "cells": cells}


def mean_of(runs: Sequence[dict[str, Any]], who: str, metric: str) -> float:
    vals = [r[who][metric] for r in runs if not math.isnan(r[who][metric])]
    return statistics.fmean(vals) if vals else math.nan


def ratios(result: dict[str, Any], mix: str, load: float, metric: str, *,
           baselines: Sequence[str] = GRAPH_BASELINES) -> list[float]:
    """Seed by seed: the best baseline's aggregate ``metric`` over ours (throughput: ours over the best), so > 1
    favours the co-located default. The best is taken on each seed (no baseline is our own policy). Violation
    rates are floored at one request of the run, so that none against none reads 1x, not 0/0."""
    cells = {c["config"]: c["runs"] for c in result["cells"] if c["mix"] == mix and abs(c["load"] - load) < 1e-9}
    if OURS not in cells:
        return []
    out = []
    for k, ours in enumerate(cells[OURS]):
        theirs = [cells[b][k]["all"][metric] for b in baselines if b in cells]
        if not theirs:
            continue
        o = ours["all"][metric]
        if metric == "violations":
            floor = 1.0 / result["requests"]
            o, theirs = max(o, floor), [max(t, floor) for t in theirs]
        if metric == "throughput":
            best = max(theirs)
            out.append(o / best if best > 0 else math.nan)
        else:
            best = min(theirs)
            out.append(best / o if o > 0 else math.nan)
    return out


def headline(result: dict[str, Any], loads: Sequence[float] | None = None, *,
             baselines: Sequence[str] = GRAPH_BASELINES) -> dict[str, dict[str, Any]]:
    """Per mix and metric: the seed-by-seed ratios best of ``baselines`` / co-located (``ratios``) at ``loads``
    (default every load swept), pooled: mean, min, max and count."""
    out: dict[str, dict[str, Any]] = {}
    swept = sorted({c["load"] for c in result["cells"]})
    use = [x for x in swept if loads is None or any(abs(x - l) < 1e-9 for l in loads)]
    for mix in result["shares"]:
        out[mix] = {}
        for metric in METRICS:
            vals = [v for load in use for v in ratios(result, mix, load, metric, baselines=baselines)
                    if math.isfinite(v)]
            if vals:
                out[mix][metric] = {"mean": statistics.fmean(vals), "min": min(vals), "max": max(vals),
                                    "n": len(vals)}
    return out


def format_tables(result: dict[str, Any]) -> str:
    """Markdown tables: per mix and load, every configuration's aggregate and per-model figures (means over
    seeds), then the headline ratios."""
    names = result["models"]
    lines = [f"models: {', '.join(f'{n} (t1 {t:.3g} ms)' for n, t in zip(names, result['t1_ms']))}; SLA "
             f"{result['sla_multiple']:g} x t1 each; {result['requests']} requests/run, {result['seeds']} seed(s); "
             f"fairness lag {result['lag_ms']:g} ms"]
    for cell_mix in result["shares"]:
        shares = ", ".join(f"{n} {s:.0%}" for n, s in zip(names, result["shares"][cell_mix]))
        for load in sorted({c["load"] for c in result["cells"] if c["mix"] == cell_mix}):
            cells = [c for c in result["cells"] if c["mix"] == cell_mix and abs(c["load"] - load) < 1e-9]
            lines += ["", f"### {cell_mix} mix ({shares}), load {load:.0%} of batch-1 capacity", "",
                      "| config | avg ms | p99 ms | SLA viol | req/s | " +
                      " | ".join(f"{n} avg / p99 ms (p99 / alone)" for n in names) + " |",
                      "|---" * (5 + len(names)) + "|"]
            for c in cells:
                runs = c["runs"]
                per = " | ".join(f"{mean_of(runs, n, 'avg_ms'):.2f} / {mean_of(runs, n, 'p99_ms'):.2f} "
                                 f"({mean_of(runs, n, 'p99_norm'):.2f}x)" for n in names)
                lines.append(f"| {c['config']} | {mean_of(runs, 'all', 'avg_ms'):.2f} | "
                             f"{mean_of(runs, 'all', 'p99_ms'):.2f} | {mean_of(runs, 'all', 'violations'):.2%} | "
                             f"{mean_of(runs, 'all', 'throughput'):.0f} | {per} |")
    for title, base in (("the best graph baseline (Triton's batcher, PS or token)", GRAPH_BASELINES),
                        ("eager per model without the shared device (PS)", ("eager_ps",))):
        lines += ["", f"{title} / co-located, seed by seed over every load (throughput: co-located / it), "
                      "mean [min-max]:"]
        for mix, metrics in headline(result, baselines=base).items():
            lines.append(f"  {mix}: " + ", ".join(f"{m} {s['mean']:.2f}x [{s['min']:.2f}-{s['max']:.2f}]"
                                                  for m, s in metrics.items()))
    return "\n".join(lines)
