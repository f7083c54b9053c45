"""The served sweep of one model: build its repository under every policy, start one tritonserver, calibrate the
batch-1 service time, then open-loop load at each fraction of it, the policies taking turns slice by slice; each
cell's counts checked against Triton's and the backend's statistics."""

from __future__ import annotations

import json
import math
import time
import urllib.request
from typing import Any

from benchmarks.harness import runtime_stats, served, settled_stats, triton_stats
from benchmarks.harness.stats import violation
from benchmarks.harness.measure import sampled_service_time
from benchmarks.regimes.perf import perf_binary, perf_cell
from benchmarks.regimes.policies import (ALL_POLICIES, DESCRIPTION, LAZYBATCH_SCHEDULED, SEQ2SEQ_KINDS, parameters_for,
                                        Settings, SLA_AWARE)
from benchmarks.regimes.replay import lazy_table_path, scaling_curve, simulated
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.client.api import Client
from lazybatch.client.load import LoadResult, run_load, summarize

from lazybatch.shipped import SEQ2SEQ_BASELINES, build_default_repository


def stats_delta(before: dict, after: dict) -> dict[str, float]:
    """Stage runs, samples run (sum over stage runs of the sub-batch size), preemptions and merges between two
    snapshots of the backend's statistics."""
    def bsum(d: dict) -> int:
        return sum(int(b) * n for b, n in d.get("batch_hist", {}).items())
    dec_b, dec_a = before.get("decisions", {}), after.get("decisions", {})
    return {"stage_runs": after.get("stage_runs", 0) - before.get("stage_runs", 0),
            "samples_run": bsum(after) - bsum(before),
            "requests": after.get("requests", 0) - before.get("requests", 0),
            "preempt": dec_a.get("preempt", 0) - dec_b.get("preempt", 0),
            "merge": dec_a.get("merge", 0) - dec_b.get("merge", 0),
            "ort_s": after.get("ort_s", 0.0) - before.get("ort_s", 0.0),
            "overhead_s": (after.get("io_s", 0.0) + after.get("sched_s", 0.0))
            - (before.get("io_s", 0.0) + before.get("sched_s", 0.0))}


# ---------------------------------------------------------------------------------------------- measurements
def pool(parts: list[LoadResult], sla_ms: float | None) -> LoadResult:
    """One cell from its slices: latencies pooled; throughput = answers / total time under load."""
    first = parts[0]
    res = LoadResult(first.model, first.offered_rate, 0.0, sla_ms, first.batch)
    res.sent = sum(p.sent for p in parts)
    lat = [v / 1e3 for p in parts for v in p.latencies_ms]
    errors = [k for p in parts for k, n in p.error_kinds.items() for _ in range(n)]
    span = sum(max(p.ok / p.throughput, p.duration_s) if p.throughput > 0 else p.duration_s for p in parts)
    res = summarize(res, lat, [True] * len(lat), errors, 0.0, span)
    res.duration_s = sum(p.duration_s for p in parts)
    res.send_rate = res.sent / res.duration_s if res.duration_s else 0.0
    return res


def measure_model(kind: str, st: Settings, bar: Any) -> dict:
    """Everything for one model: build, profile, serve, calibrate, load cells, perf_analyzer cells."""
    out = st.out
    repo = out / "repos" / kind
    pols = [SEQ2SEQ_BASELINES[p][0] if kind in SEQ2SEQ_KINDS and p in SEQ2SEQ_BASELINES else p
            for p in st.policies if not (kind in SEQ2SEQ_KINDS and p == "lazy_fused")]
    if kind in SEQ2SEQ_KINDS and "lazy_fused" in st.policies:  # the decoder loop needs its steps: never fused
        bar.write(f"[{kind}] lazy_fused left out: a seq2seq model runs its encoder and decoder steps, never fused")
        bar.total -= len(st.loads) * st.slices + len(st.perf_loads)
        bar.refresh()
    policies = {k: ALL_POLICIES[k] for k in pols}
    build_default_repository(repo, kind=kind, work=out / "build" / kind, policies=policies,
                             parameters=parameters_for(pols),
                             reprofile=st.reprofile, log=lambda m: bar.write(f"[{kind}] {m}"))
    table = LatencyTable.load(lazy_table_path(repo, kind))
    scaling = scaling_curve(table, table.max_batch_size)
    loads = list(st.loads)
    if scaling["regime"] == "batching pays":
        extra = [f for f in st.overload_loads if f > max(loads)]
        if extra:
            bar.write(f"[{kind}] batching pays ({scaling['gain']:.1f}x): adding loads "
                      + ", ".join(f"{f:.0%}" for f in extra))
            loads += extra
            bar.total += len(extra) * st.slices * len(pols)
            bar.refresh()
    stats_dir = (out / "stats" / kind).resolve()
    stats_dir.mkdir(parents=True, exist_ok=True)
    for f in stats_dir.glob("*.json"):
        f.unlink()
    names = {p: f"{kind}_{p}" for p in pols}
    bar.write(f"[{kind}] starting tritonserver on {repo}")
    cells: list[dict] = []
    perf_cells: list[dict] = []
    # seven model directories of a large model load slowly on a busy machine
    with served(repo, out / f"tritonserver_{kind}.log", stats_dir=stats_dir, timeout=600) as server:
        url, http = server.endpoints.grpc, server.endpoints.http
        version = server_version(http)
        with Client(url) as c:
            if kind in SEQ2SEQ_KINDS:
                # requests differ in length: t1 is the mean of the same seeded requests one at a time (serial, the
                # batch-1 service the loads are fractions of), not a median of a few; lazy measured on the same ones
                n_cal = st.seq2seq_calibration
                whole = names.get("serial") or names[pols[0]]
                t1 = sampled_service_time(c, http, whole, 0, n=n_cal, mean=True)[0]
                t1_lazy = sampled_service_time(c, http, names["lazy"], 0, n=n_cal, mean=True)[0] if "lazy" in names \
                    else math.nan
                t1_serial = t1
            else:
                whole = names.get("triton_0us") or names.get("graph_0ms") or names[pols[0]]
                t1, n_cal = sampled_service_time(c, http, whole, 3.0)
                t1_lazy = sampled_service_time(c, http, names["lazy"], 1.5)[0] if "lazy" in names else math.nan
                t1_serial = sampled_service_time(c, http, names["serial"], 1.5)[0] if "serial" in names else math.nan
        mu = 1.0 / t1
        duration = st.seq2seq_duration if kind in SEQ2SEQ_KINDS else st.duration
        slas = [m * t1 * 1e3 for m in st.sla_multiples]
        sched_sla = st.sched_sla_multiple * t1 * 1e3
        bar.write(f"[{kind}] t1 {t1 * 1e3:.2f} ms ({whole}, {n_cal} sequential requests), mu {mu:.2f}/s; "
                  f"SLAs {', '.join(f'{s:.1f}' for s in slas)} ms; lazy t1 {t1_lazy * 1e3:.2f} ms")
        for f in loads:
            rate = f * mu
            # light loads of slow models: stretch the cell (up to 2x) so that it holds about min_requests
            cell_s = min(max(duration, st.min_requests / rate), 2 * duration)
            parts: dict[str, list[LoadResult]] = {p: [] for p in pols}
            counts: dict[str, dict[str, float]] = {p: {} for p in pols}
            for k in range(st.slices):
                # odd slices take turns in reverse order: no policy always runs first (right after a load change)
                # or last, so an effect of the position in the rotation falls on all of them alike
                for p in (pols if k % 2 == 0 else pols[::-1]):
                    m = names[p]
                    bar.set_postfix_str(f"{kind} {f:.0%} {p} ({k + 1}/{st.slices})")
                    tb = triton_stats(http, m)
                    rb = runtime_stats(stats_dir, m) if p in LAZYBATCH_SCHEDULED else {}
                    r = run_load(url, m, rate, cell_s / st.slices, sla_ms=sched_sla,
                                 seed=st.seed + 1000 * k + int(f * 100), timeout_s=60.0,
                                 send_sla=p in SLA_AWARE)
                    ta = settled_stats(http, m, tb, r.sent + 1)  # + its warm-up request
                    acc = counts[p]
                    acc["server_success"] = acc.get("server_success", 0) + ta["success"] - tb["success"] - 1
                    acc["server_fail"] = acc.get("server_fail", 0) + ta["fail"] - tb["fail"]
                    acc["inferences"] = acc.get("inferences", 0) + ta["inference_count"] - tb["inference_count"]
                    acc["executions"] = acc.get("executions", 0) + ta["execution_count"] - tb["execution_count"]
                    if p in LAZYBATCH_SCHEDULED:
                        ra = runtime_stats(stats_dir, m, rb.get("requests", 0) + r.sent + 1)
                        for key, v in stats_delta(rb, ra).items():
                            acc[key] = acc.get(key, 0) + v
                    parts[p].append(r)
                    bar.update(1)
                    time.sleep(0.3)
            for p in pols:
                r = pool(parts[p], sched_sla)
                acc = counts[p]
                if p in LAZYBATCH_SCHEDULED:
                    mean_batch = acc["samples_run"] / acc["stage_runs"] if acc.get("stage_runs") else math.nan
                else:
                    mean_batch = acc["inferences"] / acc["executions"] if acc.get("executions") else math.nan
                cells.append({
                    "model": kind, "policy": p, "load": f, "rate": rate, "duration_s": r.duration_s,
                    "sent": r.sent, "ok": r.ok, "errors": r.errors, "send_rate": r.send_rate,
                    "server_requests": acc["server_success"] + acc["server_fail"],
                    "server_rate": (acc["server_success"] + acc["server_fail"]) / r.duration_s,
                    "throughput": r.throughput, "avg_ms": r.avg_ms, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms,
                    "violation": {f"{m:g}x": violation(r.latencies_ms, r.errors, r.sent, s)
                                  for m, s in zip(st.sla_multiples, slas)},
                    "mean_batch": mean_batch,
                    "preemptions": acc.get("preempt") if p in LAZYBATCH_SCHEDULED else None,
                    "merges": acc.get("merge") if p in LAZYBATCH_SCHEDULED else None,
                    "overhead_per_stage_ms": (acc["overhead_s"] / acc["stage_runs"] * 1e3
                                              if acc.get("stage_runs") else None),
                    "error_kinds": r.error_kinds,
                    # the slices are the cell's repetitions (the same seeded arrivals for every policy in a slice)
                    "slice_avg_ms": [q.avg_ms for q in parts[p]], "slice_p99_ms": [q.p99_ms for q in parts[p]],
                })
        perf = perf_binary() if st.perf_loads else None
        for f in st.perf_loads:
            rate = f * mu
            for p in pols:
                m = names[p]
                bar.set_postfix_str(f"{kind} perf_analyzer {f:.0%} {p}")
                perf_cells.append(perf_cell(perf, kind, p, m, f, rate, url, http, stats_dir, st, sched_sla, slas))
                bar.update(1)
    final = runtime_stats(stats_dir, names["lazy"], timeout=1.0) if "lazy" in names else {}
    extra = {"time_scale": final["time_scale"]} if "time_scale" in final else {}
    bar.set_postfix_str(f"{kind} simulated on its latency table")
    extra["latency_table"] = table.to_dict()
    extra["simulated"] = simulated(table, loads, st)
    if final.get("fused"):  # lazy ran whole passes (backend/fusion.py)
        extra["lazy_fused"] = final["fused"]
    return extra | {"model": kind, "description": DESCRIPTION.get(kind, kind), "t1_ms": t1 * 1e3, "mu": mu,
            "t1_lazy_ms": t1_lazy * 1e3, "t1_serial_ms": t1_serial * 1e3, "calibration_requests": n_cal,
            "sla_ms": slas, "sched_sla_ms": sched_sla, "scaling": scaling, "max_batch_size": table.max_batch_size,
            "stages": table.graph.n, "tritonserver": version, "cells": cells, "perf": perf_cells}


def server_version(http: str) -> str:
    try:
        with urllib.request.urlopen(f"http://{http}/v2", timeout=10) as f:
            return json.loads(f.read()).get("version", "?")
    except (OSError, ValueError):
        return "?"


def run(st: Settings, meta: dict) -> list[dict]:
    """Every model of the run, one after another (one tritonserver each); results.json rewritten after each model,
    so a long run keeps what it measured."""
    from tqdm import tqdm

    total = len(st.models) * (len(st.loads) * st.slices + len(st.perf_loads)) * len(st.policies)
    results: list[dict] = []
    with tqdm(total=total, desc="regimes", unit="run") as bar:
        for m in st.models:
            results.append(measure_model(m, st, bar))
            (st.out / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    return results
