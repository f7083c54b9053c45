"""One measured cell of the co-location benchmark: several models driven at once at their own Poisson rates, under
`lazybatch load --together` (client/together.py, in process) or one perf_analyzer per model (`lazybatch perf
--together`, lazybatch/perf.py), summarised per model and over all of them in one shape, so the page reads both.

Every figure a page shows comes from a cell's summary (``summarise``): avg, p50, p99 (ms, answered requests),
throughput (answered requests/s), SLA violations ((late + failed) / sent, each request against its own model's SLA)
and SLO attainment at several tightnesses (the share of sent requests answered within m x the model's t1 alone)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from benchmarks.harness.stats import percentile

TIGHTNESS = (2.0, 5.0, 10.0, 20.0)  # SLO multiples of each model's t1 the attainment is computed at


def summarise(latencies_ms: Sequence[float], sent: int, sla_ms: Sequence[float] | float,
              t1_ms: Sequence[float] | float, throughput: float, rate: float) -> dict:
    """A cell's figures for one model (scalars) or for several pooled (one SLA and t1 per request)."""
    lat = np.asarray([v for v in latencies_ms if math.isfinite(v)], dtype=float)
    n = lat.size
    sla = np.broadcast_to(np.asarray(sla_ms, dtype=float), lat.shape) if n else np.zeros(0)
    t1 = np.broadcast_to(np.asarray(t1_ms, dtype=float), lat.shape) if n else np.zeros(0)
    failed = max(0, sent - n)
    out = {"rate": rate, "sent": int(sent), "ok": int(n), "failed": int(failed), "throughput": float(throughput),
           "avg_ms": float(lat.mean()) if n else math.nan,
           "p50_ms": percentile(lat, 50),
           "p99_ms": percentile(lat, 99),
           "violations": float(((lat > sla).sum() + failed) / sent) if sent else math.nan,
           "attain": {f"{m:g}": float((lat <= m * t1).sum() / sent) if sent else math.nan for m in TIGHTNESS}}
    return out


def pooled(per_model: Mapping[str, dict], raw: Mapping[str, Sequence[float]], slas: Mapping[str, float],
           t1s: Mapping[str, float]) -> dict:
    """The aggregate over the models of one cell: every answered request of every model, each against its own
    model's SLA and t1; throughput and offered rate summed."""
    lat = [v for k in per_model for v in raw[k]]
    sla = [slas[k] for k in per_model for _ in raw[k]]
    t1 = [t1s[k] for k in per_model for _ in raw[k]]
    return summarise(lat, sum(m["sent"] for m in per_model.values()), sla, t1,
                     sum(m["throughput"] for m in per_model.values()), sum(m["rate"] for m in per_model.values()))


def load_cell(url: str, names: Mapping[str, str], rates: Mapping[str, float], duration: float, seed: int,
              slas: Mapping[str, float], t1s: Mapping[str, float]) -> dict:
    """``names`` (kind -> served model) driven together by `lazybatch load --together`'s engine, each at its rate
    in ``rates`` (kind -> requests/s), its own seed (``model_seed(seed, index)``, the kinds' order) and SLA."""
    from lazybatch.client.together import run_together

    total = sum(rates.values())
    shares = {names[k]: r / total for k, r in rates.items()}
    rows = run_together(url, shares, total, duration, sla_ms={names[k]: slas[k] for k in rates}, seed=seed,
                        timeout_s=120.0)
    by = {r.model: r for r in rows}
    per = {k: summarise(by[names[k]].latencies_ms, by[names[k]].sent, slas[k], t1s[k], by[names[k]].throughput,
                        rates[k]) for k in rates}
    for k in rates:
        per[k]["lost"], per[k]["duplicated"] = by[names[k]].lost, by[names[k]].duplicated
    return {"models": per, "all": pooled(per, {k: by[names[k]].latencies_ms for k in rates}, slas, t1s)}


def alone_cell(url: str, kind: str, name: str, rate: float, index: int, duration: float, seed: int, sla: float,
               t1: float) -> dict:
    """One model by itself with the arrivals it gets beside the others (the same ``model_seed(seed, index)``)."""
    from lazybatch.client.load import run_load
    from lazybatch.client.together import model_seed

    r = run_load(url, name, rate, duration, sla_ms=sla, seed=model_seed(seed, index), timeout_s=120.0)
    per = {kind: summarise(r.latencies_ms, r.sent, sla, t1, r.throughput, rate)}
    return {"models": per, "all": per[kind]}


def perf_cell(url: str, names: Mapping[str, str], rates: Mapping[str, float], duration: float, seed: int,
              slas: Mapping[str, float], t1s: Mapping[str, float], out: Path) -> dict:
    """The same cell under NVIDIA perf_analyzer, one process per model started at once (`lazybatch perf
    --together`): Poisson arrivals drawn with ``seed`` (--request-intervals), three windows that make up the
    duration (each long enough for 10 expected arrivals of the slowest stream; perf_analyzer's stability check out
    of reach: the repetitions are the benchmark's). Per-request latencies come from each process's export."""
    from lazybatch import perf as pa
    from lazybatch.client.api import Client
    from lazybatch.client.seq2seq import info_from_parameters, perf_input_data

    total = sum(rates.values())
    shares = {names[k]: r / total for k, r in rates.items()}
    if out.exists():  # perf_analyzer refuses an export file that exists (an earlier run's cell)
        shutil.rmtree(out)
    out.mkdir(parents=True)
    own = {}
    with Client(url) as c:
        for k in rates:
            info = info_from_parameters(c.model_parameters(names[k]))
            data = "zero"  # valid for every static model here (BERT's token ids must be in its vocabulary)
            if info is not None:
                path = out / f"input_{names[k]}.json"
                path.write_text(json.dumps(perf_input_data(info, seed=seed)))
                data = str(path)
            own[names[k]] = {"sla_ms": slas[k], "input_data": data}
    window = max(1000, int(duration * 1000 / 3), int(10_000 / min(rates.values())))
    rows, _ = pa.run_together(pa.find_perf_analyzer() or pa.install(), shares, url, [total], out,
                              poisson_seed=seed, measurement_ms=window, max_trials=3, stability_percentage=10000.0,
                              per_model=own)
    by = {r.model: r for r in rows}
    per = {k: summarise(by[names[k]].latencies_ms, by[names[k]].requests, slas[k], t1s[k],
                        by[names[k]].throughput, rates[k]) for k in rates}
    return {"models": per, "all": pooled(per, {k: by[names[k]].latencies_ms for k in rates}, slas, t1s),
            "window_ms": window}
