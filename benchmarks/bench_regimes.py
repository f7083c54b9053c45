"""Where batching pays: every policy on a real tritonserver, per model, from light load to overload.

    python -m benchmarks.bench_regimes                       # MLP, BERT-base seq 32, ResNet-50, GNMT (~70 min)
    python -m benchmarks.bench_regimes --quick               # tiny MLP, two loads, ~2 min: a smoke test
    python -m benchmarks.bench_regimes --models mlp --loads 0.4,0.9 --duration 6

Per model, in one run: build its model directories under every policy (lazy, oracle, serial, Triton's dynamic
batcher at max_queue_delay 0/5/20 ms, BatchMonitor), profile its stages (the latency table the policies read) and
plot its batch-scaling curve next to ResNet-50's; start one tritonserver on that model's repository; measure the
batch-1 service time (median of sequential whole-graph requests; for seq2seq models, whose requests differ in
length, the mean of a fixed set of sequential requests served one at a time; service rate mu = 1/t1); then open-loop Poisson
load at each fraction of mu under every policy, driven by ``lazybatch load`` (client/load.py), and by
perf_analyzer (Poisson, --async) at the ``--perf-loads`` fractions. Each cell's request count is checked against
the server's own (Triton's /v2/models/<m>/stats); the backend's statistics (LAZYBATCH_STATS_DIR) give the mean
executed (sub-)batch, preemptions and merges. Output: ``--out`` (results.json, per-run logs) and the results page
``--page`` with its plots in ``--img-dir``; the page is written by this script alone (no hand edits).

SLA targets are multiples (``--sla-multiples``, default 2,5,10) of the model's single-request latency t1; the
SLA-aware policies (eager, lazy, oracle) receive the ``--sched-sla-multiple`` target (default 5x) with every
request, and every policy's violation rate is computed at each target from the same latencies. The default policy
(eager) is also judged against the best baseline with the spread over the slices, a cell's repetitions.

The machine's cores are shared with other jobs, so its load drifts: each load's time is cut into ``--slices`` and
the policies take turns slice by slice, so that the drift spreads over all of them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

from benchmarks.harness import geomean, held_out_ratios, machine_meta, seq2seq_requests, served, spread
from benchmarks.harness import verdict as goal_verdict

from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.policies.lazy import DEFAULT_MIN_BATCH_GAIN, useful_batch_size
from lazybatch.client.api import Client
from lazybatch.client.load import LoadResult, run_load, summarize
from lazybatch.repo import ALL_POLICIES, POLICY_PARAMETERS, SEQ2SEQ_BASELINES, build_default_repository
from lazybatch.simulator.loads_on_table import BASELINES as SIM_BASELINES
from lazybatch.simulator.loads_on_table import VARIANTS as SIM_VARIANTS
from lazybatch.simulator.loads_on_table import simulate_loads

# eager: the default of `repo add` and the quickstart (batcher/policies/eager.py); lazy: the paper's algorithm
POLICY_ORDER = ["eager", "lazy", "oracle", "serial", "triton_0us", "triton_5000us", "triton_20000us", "monitor"]
# Asked for by name only (--policies): a variant of a policy with one backend knob set (lazybatch/repo.py
# POLICY_PARAMETERS). A variant is not one of "all policies" in the goals: lazy is not judged against itself.
VARIANT_NOTES = {"lazy_fused": "whole-graph passes whatever the batch cap",
                 "lazy_inline": "responses sent by the scheduler thread",
                 "lazy_benefit": "preempts only where that also lowers the summed latency"}
VARIANTS = {v: ", ".join([ALL_POLICIES[v], *(f"{k}: {x}" for k, x in POLICY_PARAMETERS[v].items())])
            + f" ({note})" for v, note in VARIANT_NOTES.items()}  # the parameters as repo.py writes them
# per variant: what it measures, the unit of its backend-cost figure, how to read the ratios
VARIANT_WHY = {
    "lazy_fused": ("Stage boundaries, measured", "whole-graph pass",
                   "Above 1, the boundaries pay for themselves: a newcomer starts at the next boundary instead of "
                   "after the running pass, and sub-batches merge there; below 1, they cost more than they buy "
                   "(`fuse_stages: auto` fuses only where lazy's batch cap is 1)."),
    "lazy_inline": ("The response thread, measured", "stage",
                    "pb_utils' send waits for the Triton process to take each response (a round trip); above 1, "
                    "sending from a thread of its own (the default) saved the scheduler thread that wait."),
    "lazy_benefit": ("The preemption rule, measured", "stage",
                     "Below 1, refusing the preemptions that the latency table predicts to raise the summed latency "
                     "(late in a running sub-batch, or where a batch costs nearly its members' single runs) lowered "
                     "lazy's average; the simulated table below shows the same rule without serving cost."),
}
KNOWN_POLICIES = ["eager", "lazy", *VARIANTS, *POLICY_ORDER[2:]]
GRAPH = ["graph_0ms", "graph_5ms", "graph_20ms"]  # seq2seq: graph batching in the backend instead of Triton's
ROW_ORDER = KNOWN_POLICIES + GRAPH
LAZYBATCH_SCHEDULED = {"eager", "lazy", *VARIANTS, "oracle", "serial", "monitor", *GRAPH}  # our scheduler (stats)
SLA_AWARE = {"eager", "lazy", *VARIANTS, "oracle"}
TRITON = ["triton_0us", "triton_5000us", "triton_20000us"]
SEQ2SEQ_KINDS = {"gnmt"}
DESCRIPTION = {
    "mlp": "8-layer MLP, width 2048 (matrix-vector bound at batch 1)",
    "bert": "BERT-base encoder (12 layers, hidden 768), sequence length 32",
    "resnet50": "ResNet-50 (the onnx package's light_resnet50 made batchable)",
    "tiny": "4-layer MLP, width 64 (tests only)",
    "gnmt": "GNMT-like LSTM encoder-decoder (4+4 layers, hidden 1024, vocabulary 32000; encoder and decoder steps "
            "looped per request), source and output lengths drawn from the shipped WMT-like length histogram",
}
NOT_SERVED = {
    "gnmt": "GNMT-like LSTM encoder-decoder: not in this run (`--models mlp,bert,resnet50,gnmt` adds it, about 25 "
            "more minutes; Triton's dynamic batcher cannot loop a decoder, so graph:0/5/20 in the backend stand in "
            "for it).",
}


# ---------------------------------------------------------------------------------------------- server counters
def triton_stats(http: str, model: str) -> dict[str, int]:
    """Triton's own counters for a model: successful requests, inferences (samples) and executions (batches)."""
    with urllib.request.urlopen(f"http://{http}/v2/models/{model}/stats", timeout=10) as f:
        data = json.loads(f.read())
    s = data["model_stats"][0]
    inf = s.get("inference_stats", {})
    return {"success": int(inf.get("success", {}).get("count", 0)), "fail": int(inf.get("fail", {}).get("count", 0)),
            "inference_count": int(s.get("inference_count", 0)), "execution_count": int(s.get("execution_count", 0))}


def settled_stats(http: str, model: str, before: dict[str, int], expect: int, timeout: float = 3.0) -> dict:
    """Triton's counters once they cover ``expect`` more requests than ``before``: it counts a request after its
    response has left, so a read right after the client's last answer can miss the newest ones."""
    end = time.monotonic() + timeout
    while True:
        now = triton_stats(http, model)
        if now["success"] + now["fail"] - before["success"] - before["fail"] >= expect or time.monotonic() > end:
            return now
        time.sleep(0.05)


def runtime_stats(stats_dir: Path, model: str, at_least: int = 0, timeout: float = 20.0) -> dict:
    """The backend's statistics file, written whenever its scheduler holds nothing; waits until it covers
    ``at_least`` requests (the backend answers before it writes)."""
    p = stats_dir / f"{model}.json"
    end = time.monotonic() + timeout
    data: dict = {}
    while True:
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            data = {}
        if data.get("requests", 0) >= at_least or time.monotonic() > end:
            return data
        time.sleep(0.05)


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
def request_feeds(client: Client, http: str, model: str, n: int, seed: int = 0) -> list[dict]:
    """``n`` batch-1 requests: random inputs, or for a seq2seq model source and output lengths drawn from the shipped
    length histogram as `lazybatch load` draws them (client/seq2seq.py)."""
    return seq2seq_requests(http, model, n, seed) or [client.random_inputs(model, 1, seed=seed)] * n


def service_time(client: Client, http: str, model: str, seconds: float, *, n: int | None = None,
                 mean: bool = False) -> tuple[float, int]:
    """Latency of sequential batch-1 requests: the median of about ``seconds`` of them (at least 10, at most 300),
    or with ``n`` exactly the first ``n`` requests of the seeded draw. ``mean``: their mean, the service time whose
    inverse is the service rate when requests differ in length (seq2seq: lengths from the histogram)."""
    feeds = request_feeds(client, http, model, max(300, n or 0))
    warm = []
    for x in feeds[:3]:
        t0 = time.perf_counter()
        client.infer(model, x)
        warm.append(time.perf_counter() - t0)
    if n is None:
        n = int(max(10, min(300, seconds / max(statistics.median(warm), 1e-4))))
    times = client.latencies(model, feeds, n, warmup=0)
    return (statistics.fmean(times) if mean else statistics.median(times)), n


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


def violation(lat_ms: list[float], errors: int, sent: int, sla_ms: float) -> float:
    if not sent:
        return math.nan
    return (sum(1 for v in lat_ms if v > sla_ms) + errors) / sent


@dataclass
class Settings:
    models: list[str]
    loads: list[float]
    perf_loads: list[float]
    duration: float
    min_requests: int
    slices: int
    perf_measurement_ms: int
    sla_multiples: list[float]
    sched_sla_multiple: float
    policies: list[str]
    out: Path
    seed: int
    reprofile: bool
    seq2seq_duration: float = 30.0  # seconds per cell for seq2seq models (a request takes about 0.3 s)
    seq2seq_calibration: int = 20  # requests whose mean service time defines a seq2seq model's t1
    # further loads, only for models whose profile shows batching pays: where batching is what keeps a server up,
    # peak throughput needs loads beyond what serial can serve (the paper's loads are several times mu)
    overload_loads: tuple[float, ...] = ()


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
                t1 = service_time(c, http, whole, 0, n=n_cal, mean=True)[0]
                t1_lazy = service_time(c, http, names["lazy"], 0, n=n_cal, mean=True)[0] if "lazy" in names \
                    else math.nan
                t1_serial = t1
            else:
                whole = names.get("triton_0us") or names.get("graph_0ms") or names[pols[0]]
                t1, n_cal = service_time(c, http, whole, 3.0)
                t1_lazy = service_time(c, http, names["lazy"], 1.5)[0] if "lazy" in names else math.nan
                t1_serial = service_time(c, http, names["serial"], 1.5)[0] if "serial" in names else math.nan
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


def perf_binary() -> Path:
    from lazybatch import perf as pa

    return pa.find_perf_analyzer() or pa.install()


def perf_cell(perf: Path | None, kind: str, p: str, m: str, f: float, rate: float, url: str, http: str,
              stats_dir: Path, st: Settings, sched_sla: float, slas: list[float]) -> dict:
    """perf_analyzer at one rate: exactly three measurement windows (stability check off), Poisson, --async."""
    from lazybatch import perf as pa
    from lazybatch.batcher.errors import ConfigError

    input_data = "zero"
    if kind in SEQ2SEQ_KINDS:  # valid token ids and drawn lengths (random data would be outside the vocabulary)
        from lazybatch.client.seq2seq import http_parameters, info_from_parameters, perf_input_data

        with urllib.request.urlopen(f"http://{http}/v2/models/{m}/config", timeout=10) as resp:
            info = info_from_parameters(http_parameters(json.loads(resp.read())))
        path = (st.out / "perf" / kind / f"input_{m}.json").resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(perf_input_data(info, seed=st.seed)))
        input_data = str(path)
    tb = triton_stats(http, m)
    t0 = time.monotonic()
    row, err = None, None
    try:
        rows, _ = pa.run(perf, m, url, [rate], st.out / "perf" / kind / f"{int(round(f * 100))}",
                         measurement_ms=st.perf_measurement_ms, max_trials=3, stability_percentage=10000,
                         sla_ms=sched_sla if p in SLA_AWARE else None,
                         input_data=input_data)
        row = rows[0] if rows else None
    except ConfigError as e:
        err = str(e).splitlines()[-1][:200]
    wall = time.monotonic() - t0
    time.sleep(0.2)  # let Triton count the last answers (see settled_stats)
    ta = triton_stats(http, m)
    served = ta["success"] + ta["fail"] - tb["success"] - tb["fail"]
    out: dict[str, Any] = {"model": kind, "policy": p, "load": f, "rate": rate, "wall_s": wall,
                           "server_requests": served, "error": err}
    if row is not None:
        out.update({"throughput": row.throughput, "avg_ms": row.avg_ms, "p50_ms": row.p50_ms,
                    "p99_ms": row.p99_ms, "server_queue_ms": row.server_queue_ms,
                    "server_compute_ms": row.server_compute_ms})
    return out


def server_version(http: str) -> str:
    try:
        with urllib.request.urlopen(f"http://{http}/v2", timeout=10) as f:
            return json.loads(f.read()).get("version", "?")
    except (OSError, ValueError):
        return "?"


def scaling_curve(table: LatencyTable, max_batch: int) -> dict:
    """Whole-program latency (sum of the stages) per measured batch size, per-sample latency, gain, regime."""
    sizes = list(table.batch_sizes)
    whole = [sum(row[b] for row in table.dense) * 1e3 for b in sizes]
    per_sample = [w / b for w, b in zip(whole, sizes)]
    gain = per_sample[0] / min(per_sample)
    sc = {"batch_sizes": sizes, "whole_ms": whole, "per_sample_ms": per_sample, "t1_ms": whole[0], "gain": gain}
    return sc | {"regime": regime_of(sc, max_batch)}


def regime_of(sc: dict, max_batch: int) -> str:
    """The regime of a scaling curve by the current rule (results files keep the one of the day they were written)."""
    return regime(sc["gain"], batch_cap(sc, max_batch))


def regime(gain: float, cap: int) -> str:
    """"No batching gain" is where lazy's own rule (useful_batch_size) caps batches at 1, so that the page and
    the scheduler agree on it: a model lazy does batch (BERT here, 1.2-1.3x) is judged by the batching goals,
    however small its gain. A fixed gain threshold put BERT on either side between two profiles of it."""
    if cap == 1:
        return "no batching gain"
    return "batching pays" if gain >= 2.0 else "batching pays a little"


# ---------------------------------------------------------------------------------------------- report
def fmt(v: Any, spec: str = ".1f") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(v, spec)


def keeps_up(cell: dict) -> bool:
    """The policy served what the client sent in this cell (below 95% it was past its capacity)."""
    return cell["throughput"] >= 0.95 * cell["send_rate"]


def best_of(by: dict, policies: list[str], load: float) -> str:
    """The policy with the lowest average latency at this load."""
    return min(policies, key=lambda p: by[(p, load)]["avg_ms"])


# Seeds x requests per simulated cell: the figures of a 1000-request run move by about a percent between seeds.
SIM_SEEDS, SIM_REQUESTS = 3, 1000


def lazy_table_path(repo: Path, kind: str) -> Path:
    """The latency table the run's scheduled policies read (one table, shared by all of them): lazy's model
    directory's, or, where --policies left lazy out, the first other model directory that has one (Triton's
    configurations have none)."""
    lazy = repo / f"{kind}_lazy" / "1" / "latency.json"
    if lazy.exists():
        return lazy
    return next(iter(sorted(repo.glob(f"{kind}_*/1/latency.json"))), lazy)


def sim_best(by: dict, f: float) -> str:
    """The simulated graph batcher with the lowest average latency at load ``f``."""
    return min(SIM_BASELINES, key=lambda p: by[(p, f)]["avg_ms"])


def simulated(table: LatencyTable, loads: list[float], st: Settings) -> dict:
    """The same loads on a virtual clock with the table the policies read (lazybatch/simulator/loads_on_table.py):
    what the algorithm gives with no serving cost, to tell a goal the algorithm misses from one serving loses."""
    return simulate_loads(table, loads, max_batch_size=table.max_batch_size, sla_multiples=st.sla_multiples,
                          sched_multiple=st.sched_sla_multiple, seeds=SIM_SEEDS, requests=SIM_REQUESTS).as_dict()


def add_simulated(res: dict, st: Settings, results_dir: Path | None) -> None:
    """Fill in the simulated figures of a result that predates them, from the latency table its run kept."""
    if "simulated" in res:
        return
    if "latency_table" not in res and results_dir is not None:
        path = lazy_table_path(results_dir / "repos" / res["model"], res["model"])
        if not path.exists():
            return
        res["latency_table"] = json.loads(path.read_text())
    if "latency_table" in res:
        table = LatencyTable.from_dict(res["latency_table"])
        res["simulated"] = simulated(table, sorted({c["load"] for c in res["cells"]}), st)


def simulated_goals(res: dict) -> list[str]:
    """The issue's goals judged on the simulated run: where it misses one too, the algorithm misses it here."""
    sim = res.get("simulated")
    if not sim or res["scaling"]["regime"] == "no batching gain":
        return []
    key = f"{res['sched_multiple']:g}x"
    by = {(c["policy"], c["load"]): c for c in sim["cells"]}
    loads = sorted({c["load"] for c in sim["cells"]})
    mid = [f for f in loads if 0.4 <= f <= 0.9 + 1e-9]
    parts, miss = [], []
    for f in mid:
        best = sim_best(by, f)
        ratio = by[(best, f)]["avg_ms"] / by[("lazy", f)]["avg_ms"]
        parts.append(f"{f:.0%}: {ratio:.2f}x vs {best}")
        if ratio < 2.0:
            miss.append(f"{f:.0%}")
    over = [f for f in loads if f > 1.0 + 1e-9]
    beyond = ", ".join(f"{f:.0%}: {by[(sim_best(by, f), f)]['avg_ms'] / by[('lazy', f)]['avg_ms']:.2f}x" for f in over)
    lowest = sum(1 for f in loads
                 if by[("lazy", f)]["violations"][key] <= min(c["violations"][key] for c in sim["cells"]
                                                              if c["load"] == f and c["policy"] not in SIM_VARIANTS)
                 + 1e-12)
    if all(("lazy_benefit", f) in by for f in mid):
        parts.append("with preempt=benefit (`lazy_benefit`) " + ", ".join(
            f"{f:.0%}: {by[(sim_best(by, f), f)]['avg_ms'] / by[('lazy_benefit', f)]['avg_ms']:.2f}x"
            for f in mid))
    peak = max(by[("lazy", f)]["throughput"] for f in loads) / max(by[("serial", f)]["throughput"] for f in loads)
    head = (f"The same loads on a virtual clock (the same scheduler on this model's latency table, no serving cost; "
            f"t1 {sim['t1_ms']:.2f} ms, {sim['seeds']} seeds x {sim['requests']} requests per cell; the "
            f"\"Simulated\" table below): best graph batcher / lazy average latency ")
    verdict = (f" -> the algorithm itself stays under 2x at {', '.join(miss)} on this table, so no implementation of "
               "LazyBatching meets that goal on this model and hardware" if miss else
               " -> the algorithm meets 2x on this table: what the server misses, serving cost loses")
    return [head + ", ".join(parts) + verdict + (f"; beyond mu {beyond}" if beyond else "") + "; lazy has the "
            f"fewest {key} violations at {lowest} of {len(loads)} loads; peak throughput lazy / serial {peak:.2f}x."]


def simulated_table(res: dict) -> list[str]:
    sim = res.get("simulated")
    if not sim:
        return []
    key = f"{res['sched_multiple']:g}x"
    present = {c["policy"] for c in sim["cells"]}
    names = [p for p in ("lazy", "lazy_benefit", "oracle", "serial", *SIM_BASELINES) if p in present]
    by = {(c["policy"], c["load"]): c for c in sim["cells"]}
    L = ["### Simulated on this model's latency table (the algorithm without serving cost)", "",
         f"`lazybatch/simulator/loads_on_table.py`: the scheduler core on a virtual clock, every stage taking exactly"
         f" its latency-table time (time_scale 1), seeded Poisson arrivals at the same fractions of the table's own "
         f"batch-1 rate (t1 = {sim['t1_ms']:.2f} ms, mu = {sim['mu']:.1f}/s), {sim['seeds']} seeds x "
         f"{sim['requests']} requests per cell, averaged; lazy_benefit is lazy:preempt=benefit (not counted among "
         "all policies for the fewest violations); graph_N ms is Triton's dynamic batcher with max_queue_delay"
         f" N ms. Average latency in ms; viol: share of requests over {key} t1. Where a policy is past its capacity "
         f"its queue grows for the whole run, so its average grows with the run's length ({sim['requests']} "
         "requests here, a few seconds per cell on the server): compare those cells by throughput, not with the "
         "server's averages.", "",
         "| load | " + " | ".join(names) + f" | best graph / lazy | lazy viol {key} | fewest viol {key} | "
         "thr lazy / serial |",
         "| --- " * (len(names) + 5) + "|"]
    for f in sorted({c["load"] for c in sim["cells"]}):
        best = sim_best(by, f)
        v = {p: by[(p, f)]["violations"][key] for p in names if p not in SIM_VARIANTS}
        low = min(v, key=v.get)
        L.append(f"| {f:.0%} | " + " | ".join(fmt(by[(p, f)]["avg_ms"], ".2f" if sim["t1_ms"] < 20 else ".1f")
                                               for p in names)
                 + f" | {by[(best, f)]['avg_ms'] / by[('lazy', f)]['avg_ms']:.2f}x ({best}) | {v['lazy']:.1%} | "
                 f"{v[low]:.1%} ({'lazy' if v['lazy'] <= v[low] + 1e-12 else low}) | "
                 f"{by[('lazy', f)]['throughput'] / by[('serial', f)]['throughput']:.2f}x |")
    return L + [""]


def goals(res: dict) -> list[str]:
    """The issue's goals, evaluated on this run's figures (lazybatch load driver, scheduling SLA)."""
    kind = res["model"]
    cells = res["cells"]
    key = f"{res['sched_multiple']:g}x"
    by = {(c["policy"], c["load"]): c for c in cells}
    loads = sorted({c["load"] for c in cells})
    pols = sorted({c["policy"] for c in cells}, key=ROW_ORDER.index)
    lines = []
    if "lazy" not in pols:
        return ["lazy was not measured"]
    if res["scaling"]["regime"] == "no batching gain":
        if "serial" not in pols:
            return lines
        worst = []
        for f in loads:
            a, s = by[("lazy", f)]["avg_ms"], by[("serial", f)]["avg_ms"]
            worst.append((a / s if s else math.nan, f))
        ok = all(r <= 1.1 for r, _ in worst)
        lower = sum(1 for r, _ in worst if r < 1.0)
        cap = batch_cap(res["scaling"], res["max_batch_size"])
        lines.append(f"No batching gain on this model: lazy's average latency / serial's at each load: "
                     + ", ".join(f"{f:.0%}: {r:.2f}" for r, f in worst)
                     + f" -> goal (<= 1.10 at every load) {'met' if ok else 'NOT met'} on average latency"
                     + (f" (lazy lower at {lower} of {len(worst)} loads; lazy ran whole passes, serial stage by "
                        "stage)" if res.get("lazy_fused") else
                        f" (lazy lower at {lower} of {len(worst)} loads; with a batch cap of 1 lazy and serial "
                        "run the same one-at-a-time arrival-order schedule, so differences in either direction "
                        "are mostly this machine's run-to-run noise)" if cap == 1 else "") + ".")
        # Past capacity an average latency is not a property of the policy: the queue grows for the whole cell, so
        # it measures the cell's length times the capacity shortfall. There the steady-state figure is capacity.
        past = [f for f in loads if not keeps_up(by[("serial", f)])]
        kept = [(r, f) for r, f in worst if f not in past]
        if past:
            cap_ratio = [(by[("serial", f)]["throughput"] / by[("lazy", f)]["throughput"], f) for f in past]
            ok2 = all(r <= 1.1 for r, _ in kept) and all(r <= 1.1 for r, _ in cap_ratio)
            lines.append("The same goal judged where each figure is defined: average latency where serial keeps "
                         "up (" + (", ".join(f"{f:.0%}: {r:.2f}" for r, f in kept) or "no load")
                         + "), capacity where serial is past it (its throughput below 95% of the rate sent; "
                         "serial's / lazy's throughput: " + ", ".join(f"{f:.0%}: {r:.2f}" for r, f in cap_ratio)
                         + f") -> {'met' if ok2 else 'NOT met'}.")
        return lines
    mid = [f for f in loads if 0.4 <= f <= 0.9 + 1e-9]
    tri = [p for p in TRITON + GRAPH if p in pols]
    if mid and tri:
        parts, ok, ceil = [], True, []
        t1l = res.get("t1_lazy_ms") or math.nan
        for f in mid:
            best = best_of(by, tri, f)
            ratio = by[(best, f)]["avg_ms"] / by[("lazy", f)]["avg_ms"]
            ok &= ratio >= 2.0
            parts.append(f"{f:.0%}: {ratio:.2f}x vs {best}")
            ceil.append((by[(best, f)]["avg_ms"] / t1l, f))
        what = "graph-batching config (graph:0/5/20 in the backend)" if tri[0] in GRAPH else \
            "Triton dynamic-batcher config"
        lines.append(f"Average latency, best {what} / lazy (goal >= 2x at 40-90% load): "
                     + ", ".join(parts) + f" -> {'met' if ok else 'NOT met'}.")
        if not ok and all(not math.isnan(c) for c, _ in ceil):
            # lazy serves no request faster than it serves it alone (batching makes a step cheaper per sample,
            # never shorter), so best baseline / t1_lazy bounds the ratio any scheduler in this backend can reach
            reach = all(c >= 2.0 for c, _ in ceil)
            whole = "" if kind in SEQ2SEQ_KINDS else (
                f"; with no per-stage cost at all (t1 of the whole graph, {res['t1_ms']:.1f} ms) it would be "
                + ", ".join(f"{f:.0%}: {c * t1l / res['t1_ms']:.2f}x" for c, f in ceil))
            lines.append(f"Ceiling of that ratio: lazy answers no request faster than it serves it alone (t1 lazy "
                         f"{t1l:.1f} ms; batching makes a step cheaper per sample, not shorter), so best baseline "
                         f"average / t1 lazy bounds it: " + ", ".join(f"{f:.0%}: {c:.2f}x" for c, f in ceil) + whole
                         + (" -> the 2x goal is out of reach at " + ", ".join(f"{f:.0%}" for c, f in ceil if c < 2.0)
                            + " on this machine: there the best baseline's average is under twice the time lazy "
                            "needs for a request alone." if not reach else " -> within reach at every load."))
        over = [f for f in loads if f > 1.0 + 1e-9]
        if over:
            lines.append("Beyond mu (the paper's regime: its loads are several times the batch-1 rate), best "
                         f"{what.split(' (')[0]} / lazy: "
                         + ", ".join(f"{f:.0%}: {by[(b, f)]['avg_ms'] / by[('lazy', f)]['avg_ms']:.2f}x vs {b}"
                                     for f, b in ((f, best_of(by, tri, f)) for f in over))
                         + " (reported, not a goal of the issue).")
    lowest, missed = 0, []
    for f in loads:
        v = {p: by[(p, f)]["violation"][key] for p in pols if p not in VARIANTS}
        if v["lazy"] <= min(v.values()) + 1e-12:
            lowest += 1
        else:
            b = min(v, key=v.get)
            missed.append(f"{f:.0%} (lazy {v['lazy']:.1%}, {b} {v[b]:.1%})")
    lines.append(f"SLA violations at {key} t1 (goal: lazy lowest of all policies at every load): lowest at "
                 f"{lowest} of {len(loads)} loads" + (f"; not at {', '.join(missed)}" if missed else "")
                 + f" -> {'met' if not missed else 'NOT met'}.")
    if "serial" in pols:
        pl = max(by[("lazy", f)]["throughput"] for f in loads)
        ps = max(by[("serial", f)]["throughput"] for f in loads)
        lines.append(f"Peak throughput (highest over the loads): lazy {pl:.1f}/s, serial {ps:.1f}/s, ratio "
                     f"{pl / ps:.2f}x (goal >= 1.2x) -> {'met' if pl >= 1.2 * ps else 'NOT met'}"
                     + (f" (bounded by the highest offered load: lazy kept up with the {top['send_rate']:.1f}/s the "
                        f"client sent there, {top['send_rate'] / res['mu']:.0%} of mu, so the ratio is a lower bound)"
                        if (top := by[("lazy", loads[-1])])["throughput"] >= 0.95 * top["send_rate"]
                        else "") + ".")
    return lines


def default_vs_best(res: dict) -> list[str]:
    """The default policy (eager) and the paper's (lazy) against the best baseline (Triton's batcher at 0/5/20 ms;
    graph batching for seq2seq models), with the slices as repetitions: per load the geometric mean and the range of
    best / policy average latency over the slices, slice k's best chosen on the other slices (harness.held_out_ratios),
    and the project's rule (a range across 1.00 is a tie)."""
    cells = res["cells"]
    by = {(c["policy"], c["load"]): c for c in cells}
    pols = [p for p in ("eager", "lazy") if any(c["policy"] == p for c in cells)]
    base = [p for p in TRITON + GRAPH if any(c["policy"] == p for c in cells)]
    if not pols or not base:
        return []
    if any("slice_avg_ms" not in c for c in cells):
        return ["This run kept no per-slice figures (results from before they were recorded): no spread to show."]
    if not all(len(c["slice_avg_ms"]) > 1 for c in cells):
        return ["One slice per cell (`--slices 1`): no repetitions, no spread to show."]
    what = "graph batching (graph:0/5/20 in the backend)" if base[0] in GRAPH else "Triton's batcher (0/5/20 ms)"
    head = "| load | " + " | ".join(f"best {what.split(' (')[0]} avg / {p} avg [range] | {p}: goal >= 1.00"
                                    for p in pols) + f" | best p99 / {pols[0]} p99 [range] | best (per slice) |"
    L = [f"Best of {what} / policy, slice by slice: the {len(cells[0]['slice_avg_ms'])} slices of a cell are its "
         "repetitions (every policy sees the same seeded arrivals in a slice); geometric mean [min-max] over them; "
         "slice k's best is the configuration with the lowest mean over the other slices, so that its own noise "
         "does not choose it.", "", head, "| --- " * (3 + 2 * len(pols)) + "|"]
    counts = {p: {"met": 0, "tie": 0, "missed": 0} for p in pols}
    for f in sorted({c["load"] for c in cells}):
        if not all((p, f) in by for p in pols + base):
            continue
        row = [f"{f:.0%}"]
        picks: list[str] = []
        for p in pols:
            slices = {b: by[(b, f)]["slice_avg_ms"] for b in base}
            ratios, chosen = held_out_ratios(slices, by[(p, f)]["slice_avg_ms"])
            picks = picks or chosen
            if not ratios:
                row += ["-", "-"]
                continue
            said = goal_verdict(spread(ratios), 1.0)
            counts[p][said.split(" ")[0]] += 1
            row += [f"{geomean(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]", said.split(" (")[0]]
        p99, _ = held_out_ratios({b: by[(b, f)]["slice_p99_ms"] for b in base}, by[(pols[0], f)]["slice_p99_ms"])
        row.append(f"{geomean(p99):.2f}x [{min(p99):.2f}-{max(p99):.2f}]" if p99 else "-")
        row.append(", ".join(f"{b} x{n}" for b, n in Counter(picks).most_common()))
        L.append("| " + " | ".join(row) + " |")
    L += ["", "Per load, " + "; ".join(f"{p}: {n['met']} met, {n['tie']} tie, {n['missed']} missed"
                                       for p, n in counts.items()) + "."]
    return L


def batch_cap(sc: dict, max_batch: int, min_gain: float = DEFAULT_MIN_BATCH_GAIN) -> int:
    """lazy's batch cap, by the policy's own rule (useful_batch_size), from the whole-program curve on the page."""
    from lazybatch.batcher.graph import ModelGraph, StageType

    whole = [ms * 1e-3 for ms in sc["whole_ms"]]
    table = LatencyTable(ModelGraph("whole", [("whole", StageType.STATIC)]), sc["batch_sizes"], [whole])
    return useful_batch_size(table, max_batch, min_gain)


def why(res: dict, st: Settings) -> list[str]:
    """The mechanisms behind this model's figures, each with the numbers of this run that show it."""
    cells = res["cells"]
    by = {(c["policy"], c["load"]): c for c in cells}
    pols = {c["policy"] for c in cells}
    loads = sorted({c["load"] for c in cells})
    key = f"{st.sched_sla_multiple:g}x"
    sc = res["scaling"]
    out = []
    cap = batch_cap(sc, res["max_batch_size"])
    ov = [c["overhead_per_stage_ms"] for c in cells if c["policy"] == "lazy" and c["overhead_per_stage_ms"]]
    if ov:
        fused = bool(res.get("lazy_fused"))  # lazy's one "stage" was the whole graph
        per_pass = statistics.median(ov) * (1 if fused else res["stages"])
        out.append(f"Our backend's own cost (decision, hand-off, tensor joins and splits; onnxruntime excluded): "
                   + (f"median {per_pass:.3f} ms per whole-graph pass" if fused else
                      f"median {statistics.median(ov):.3f} ms per stage x {res['stages']} stages = "
                      f"{per_pass:.2f} ms per pass")
                   + f", {per_pass / res['t1_ms']:.0%} of t1. Serving one request alone through lazy took "
                   f"{fmt(res['t1_lazy_ms'], '.2f')} ms against {res['t1_ms']:.2f} ms "
                   + ("under serial (the same requests)." if res["model"] in SEQ2SEQ_KINDS else
                      "for the whole graph in one onnxruntime call under Triton."))
    # results taken before the seq2seq runtime calibrated keep the initial 1.0: nothing to say about them
    if "time_scale" in res and not (res["model"] in SEQ2SEQ_KINDS and res["time_scale"] == 1.0):
        out.append(f"Stages ran {res['time_scale']:.2f}x the latency table's time at the end of the run (moving "
                   f"average; the table is profiled once, alone, before serving, and the machine's background load "
                   f"differs between then and now): the backend passes this factor to the slack predictor "
                   f"(`time_scale`).")
    if cap < res["max_batch_size"]:
        out.append(f"lazy's batch cap from the latency table is {cap} (one more sample costs at least "
                   f"{1 - DEFAULT_MIN_BATCH_GAIN:.0%} of a batch-1 run beyond that size)"
                   + (": lazy runs requests one at a time in arrival order, like serial, and with no sub-batch to "
                      "preempt or merge it has no use for stage boundaries, so it runs each request through the "
                      "whole graph in one onnxruntime call (`fuse_stages: auto`; the server said: "
                      f"{res['lazy_fused']}). serial stays stage by stage: it is the papers' layer-wise baseline."
                      if cap == 1 and res.get("lazy_fused") else
                      ": lazy runs requests one at a time in arrival order, like "
                      "serial, so the two differ by per-request overhead and noise only." if cap == 1 else "."))
    if sc["regime"] == "no batching gain" and {"lazy", "serial"} <= pols:
        kept = [f for f in loads if keeps_up(by[("lazy", f)]) and keeps_up(by[("serial", f)])]
        sat = [f for f in loads if f not in kept]
        if sat:
            out.append("Where lazy and serial both keep up with the offered rate ("
                       + (", ".join(f"{f:.0%}" for f in kept) or "no load") + "), lazy / serial average latency is "
                       + (", ".join(f"{by[('lazy', f)]['avg_ms'] / by[('serial', f)]['avg_ms']:.2f}" for f in kept)
                          or "-")
                       + ". From there on both run at their capacity and the queue grows for the whole cell; "
                       "throughput lazy / serial (req/s): "
                       + ", ".join(f"{f:.0%}: {by[('lazy', f)]['throughput']:.1f}/{by[('serial', f)]['throughput']:.1f}"
                                   for f in sat)
                       + (f". lazy's whole-graph passes give it the higher capacity (alone: lazy "
                          f"{fmt(res['t1_lazy_ms'], '.1f')} ms, serial {fmt(res.get('t1_serial_ms'), '.1f')} ms per "
                          f"request), and at capacity a capacity gap becomes a much larger gap in queueing delay."
                          if res.get("lazy_fused") else
                          ". A few percent of capacity, which is what the shared cores' drift between turns amounts "
                          "to, becomes tens of percent of queueing delay, in either direction."))
    if sc["regime"] != "no batching gain" and "triton_0us" in pols and "lazy" in pols:
        gaps = [by[("lazy", f)]["avg_ms"] - by[("triton_0us", f)]["avg_ms"] for f in loads]
        out.append("Triton's dynamic batcher at max_queue_delay 0 is work-conserving: it runs whatever queued "
                   "while the previous batch ran, as one batch of the whole graph. LazyBatching can only save the "
                   "wait for the rest of the running batch (less than one t1) by preempting, and pays its per-stage "
                   "cost on every pass; a 2x lower average than that baseline is out of reach when t1 is a few ms. "
                   "lazy minus triton_0us average latency per load (ms): "
                   + ", ".join(f"{f:.0%}: {g:+.1f}" for f, g in zip(loads, gaps)) + ".")
    for v in (v for v in VARIANTS if {"lazy", v} <= pols):  # one knob of lazy's, measured in the same run
        vov = [c["overhead_per_stage_ms"] for c in cells if c["policy"] == v and c["overhead_per_stage_ms"]]
        out.append(f"{VARIANT_WHY[v][0]} (`{v}`: {VARIANTS[v]}): average latency {v} / lazy per load: "
                   + ", ".join(f"{f:.0%}: {by[(v, f)]['avg_ms'] / by[('lazy', f)]['avg_ms']:.2f}" for f in loads)
                   + f"; violations at {key} {v} / lazy: "
                   + ", ".join(f"{f:.0%}: {by[(v, f)]['violation'][key]:.0%}/{by[('lazy', f)]['violation'][key]:.0%}"
                               for f in loads)
                   + (f"; its backend cost (onnxruntime excluded) median {statistics.median(vov):.3f} ms per "
                      f"{VARIANT_WHY[v][1]}" if vov else "") + f". {VARIANT_WHY[v][2]}")
    lv = [by[("lazy", f)]["violation"][key] for f in loads] if "lazy" in pols else []
    ovv = [by[("oracle", f)]["violation"][key] for f in loads] if "oracle" in pols else []
    if sc["regime"] != "no batching gain" and lv and ovv and any(a > b for a, b in zip(lv, ovv)):
        out.append(f"The conservative slack predictor (Eq. 2: a batch costs the sum of its members' single-input "
                   f"times) over-estimates a k-request batch by up to k times on a model with a {sc['gain']:.1f}x "
                   f"gain, so lazy refuses preemptions the oracle (exact batched times) accepts; violations at {key}"
                   f" lazy vs oracle: " + ", ".join(f"{f:.0%}: {a:.0%}/{b:.0%}" for f, a, b in zip(loads, lv, ovv))
                   + ".")
    if "serial" in pols and sc["regime"] != "no batching gain":
        lost = [f for f in loads if by[("serial", f)]["throughput"] < 0.9 * by[("serial", f)]["send_rate"]]
        if lost:
            out.append(f"serial cannot keep up from {lost[0]:.0%} load on (its throughput falls below 90% of the "
                       f"rate the client sent): without batching, the backend's per-stage cost and the shared cores cap it "
                       f"below mu, measured on the whole graph.")
    return out


def driver_notes(res: dict) -> list[str]:
    """Where lazybatch load and perf_analyzer disagree, in numbers."""
    by = {(c["policy"], c["load"]): c for c in res["cells"]}
    out = []
    for pc in res["perf"]:
        c = by.get((pc["policy"], pc["load"]))
        if pc.get("error") or c is None or "avg_ms" not in pc:
            continue
        out.append((pc["server_requests"] / pc["wall_s"] / pc["rate"] if pc["wall_s"] else math.nan,
                    pc["avg_ms"] / c["avg_ms"] if c["avg_ms"] else math.nan))
    if not out:
        return []
    rr = [a for a, _ in out if not math.isnan(a)]
    lr = [b for _, b in out if not math.isnan(b)]
    return [f"perf_analyzer delivered at least {min(rr):.0%}-{max(rr):.0%} of the asked rate (server-counted requests "
            f"over its whole wall time, start-up and drain included), the load driver "
            f"{min_rate(res):.0%}-{max_rate(res):.0%}; "
            f"perf_analyzer's average latency / the load driver's at the same cell: {min(lr):.2f}-{max(lr):.2f}x "
            f"(median {statistics.median(lr):.2f}x)."]


def min_rate(res: dict) -> float:
    return min(c["server_rate"] / c["rate"] for c in res["cells"])


def max_rate(res: dict) -> float:
    return max(c["server_rate"] / c["rate"] for c in res["cells"])


def model_section(res: dict, img_rel: str, st: Settings) -> list[str]:
    kind = res["model"]
    sc = res["scaling"]
    key = f"{st.sched_sla_multiple:g}x"
    L = [f"## {kind}: {res['description']}", "",
         f"**Regime: {sc['regime']}** (per-sample latency falls {sc['gain']:.2f}x from batch 1 to the best batch "
         f"size up to {res['max_batch_size']}; {res['stages']} stages). Single-request latency t1 = "
         f"{res['t1_ms']:.2f} ms ("
         + ("serial in the backend, mean" if kind in SEQ2SEQ_KINDS else "whole graph under Triton, median")
         + f" of {res['calibration_requests']} sequential "
         f"requests; lazy backend {fmt(res['t1_lazy_ms'], '.2f')} ms, serial {fmt(res['t1_serial_ms'], '.2f')} "
         f"ms): batch-1 service rate mu = {res['mu']:.2f}/s. SLA targets: "
         + ", ".join(f"{m:g}x t1 = {s:.1f} ms" for m, s in zip(st.sla_multiples, res["sla_ms"]))
         + f"; eager, lazy and oracle schedule by the {key} target. Tritonserver {res['tritonserver']}.", "",
         f"![{kind}: latency, violations and throughput vs load]({img_rel})", "",
         "### Goals", ""]
    judged = res | {"sched_multiple": st.sched_sla_multiple}
    L += [f"- {g}" for g in goals(judged) + simulated_goals(judged)]
    vs = default_vs_best(res)
    if vs:
        L += ["", "### The default policy (eager) against the best baseline, with the spread over slices", ""] + vs
    L += ["", "### Why (mechanisms, with this run's figures)", ""] + [f"- {w}" for w in why(res, st)]
    L += [""] + simulated_table(judged) if res.get("simulated") else []
    cell = st.seq2seq_duration if kind in SEQ2SEQ_KINDS else st.duration
    L += ["", f"### `lazybatch load` (open-loop Poisson, Python asyncio gRPC client), {cell:g} s per cell"
          " (see Method)",
          "", "asked/s: offered rate; sent/s: what the client sent; server/s: requests Triton counted for the "
          "model in the cell (warm-up excluded) over the cell's time. b̄: mean executed batch (samples per stage run "
          "for our scheduler; inferences per execution for Triton's batcher). pre/mrg: preemptions and merges.", "",
          "| load | policy | asked/s | sent/s | server/s | thr/s | avg ms | p50 | p99 | "
          + " | ".join(f"viol {m:g}x" for m in st.sla_multiples) + " | b̄ | pre | mrg | err |",
          "| --- " * (13 + len(st.sla_multiples)) + "|"]
    for c in sorted(res["cells"], key=lambda c: (c["load"], ROW_ORDER.index(c["policy"]))):
        L.append(f"| {c['load']:.0%} | {c['policy']} | {c['rate']:.1f} | {c['send_rate']:.1f} | "
                 f"{c['server_rate']:.1f} | {c['throughput']:.1f} | {fmt(c['avg_ms'])} | {fmt(c['p50_ms'])} | "
                 f"{fmt(c['p99_ms'])} | " + " | ".join(f"{v:.1%}" for v in c["violation"].values())
                 + f" | {fmt(c['mean_batch'], '.2f')} | {fmt(c['preemptions'], 'd')} | {fmt(c['merges'], 'd')} "
                 f"| {c['errors']} |")
    same = sum(1 for c in res["cells"] if c["server_requests"] == c["sent"])
    worst = max(res["cells"], key=lambda c: abs(c["server_requests"] - c["sent"]))
    send = [c["send_rate"] / c["rate"] for c in res["cells"]]
    L += ["", f"Offered rate check: the client sent {min(send):.0%}-{max(send):.0%} of the asked rate (a Poisson "
          f"sample of a few hundred arrivals differs from its mean by several percent); Triton counted exactly the "
          f"requests the client sent in {same} of {len(res['cells'])} cells"
          + (f" (largest difference: {worst['server_requests'] - worst['sent']:+d} at {worst['load']:.0%} "
             f"{worst['policy']})" if same < len(res["cells"]) else "") + "."]
    if res["perf"]:
        L += ["", f"### perf_analyzer (Poisson, --async, 3 windows of {st.perf_measurement_ms} ms, stability check "
              "off)", "", "server/s: requests Triton counted over perf_analyzer's whole run / its wall time, which "
              "includes its start-up and the wait for the last answers (for slow models a large share): a lower "
              "bound of the rate it sent; thr/s is what it measured inside its windows. Δavg: perf_analyzer's "
              "average latency / the load driver's in the same cell.", "",
              "| load | policy | asked/s | server/s | thr/s | avg ms | p50 | p99 | Δavg | note |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        by = {(c["policy"], c["load"]): c for c in res["cells"]}
        for pc in sorted(res["perf"], key=lambda c: (c["load"], ROW_ORDER.index(c["policy"]))):
            c = by.get((pc["policy"], pc["load"]))
            ok = "avg_ms" in pc
            ratio = pc["avg_ms"] / c["avg_ms"] if ok and c and c["avg_ms"] else math.nan
            L.append(f"| {pc['load']:.0%} | {pc['policy']} | {pc['rate']:.1f} | "
                     f"{pc['server_requests'] / pc['wall_s']:.1f} | {fmt(pc.get('throughput'))} | "
                     f"{fmt(pc.get('avg_ms'))} | {fmt(pc.get('p50_ms'))} | {fmt(pc.get('p99_ms'))} | "
                     f"{fmt(ratio, '.2f')} | {pc.get('error') or ''} |")
        L += [""] + [f"- {n}" for n in driver_notes(res)] + [
            "- Why the drivers can disagree: (1) where a policy is near or past its capacity, latency depends on "
            "how long the queue has been building: the load driver's cell is cut into slices that each start from an"
            " empty queue, perf_analyzer's three windows follow its warm-up back to back; (2) perf_analyzer's "
            "Poisson schedule has a fixed seed, and short windows were seen to send fewer requests than asked "
            "(perf_analyzer 2.41, the one `lazybatch perf` installs; docs/triton.md, \"Clients\"); "
            "compare its thr/s with the asked rate; (3) the "
            "Python asyncio client and perf_analyzer's C++ client cost different CPU time on the cores the server "
            "uses; (4) the two ran minutes apart on a machine whose background load drifts. Where the two agree "
            "within a few ms (light load), the figures carry; where they do not, the policy is at its limit."]
    return L + [""]


def write_page(results: list[dict], meta: dict, st: Settings, page: Path, img_dir: Path) -> None:
    page.parent.mkdir(parents=True, exist_ok=True)
    img_dir.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(img_dir, page.parent)
    for res in results:
        res["scaling"]["regime"] = regime_of(res["scaling"], res["max_batch_size"])
    plot_scaling(results, img_dir / "regimes_scaling.png")
    for res in results:
        plot_model(res, img_dir / f"regimes_{res['model']}.png", st)
    L = ["# Where batching pays: every policy on a real Triton server", "",
         "Generated by `benchmarks/bench_regimes.py` (do not edit by hand; rerun the command). "
         "Users pick a batcher by how it behaves on their model and hardware: this page measures every policy of "
         "the lazybatch backend and Triton's own dynamic batcher on models in different batching regimes, from "
         "light load to overload, on a real tritonserver.", "",
         "```", meta["command"], "```", "",
         f"- Run: {meta['started']} to {meta['finished']} UTC ({meta['elapsed_min']:.1f} min)."
         + "".join(f" Models {', '.join(x['models'])} come from a further run on the same machine, "
                   f"{x['started']} to {x['finished']} UTC ({x['elapsed_min']:.1f} min, load average "
                   f"{x['loadavg_before']} / {x['loadavg_after']}, commit `{x['commit']}`"
                   + ("; policies in reverse order in every other slice" if x.get("alternating") else "")
                   + f"): `{x['command']}`." for x in meta.get("extra_runs", []))
         + (f" The page was rendered from the {len(meta['extra_runs']) + 1} runs' results with `--from-results`"
            " (a later run's model replaces the earlier one's)." if meta.get("extra_runs") else ""),
         f"- Machine: {meta['cpu']} ({meta['cores']} cores), {meta['platform']}. Load average before / after: "
         f"{meta['loadavg_before']} / {meta['loadavg_after']}. "
         + ("**The machine was shared with other jobs during this run** (server, load generator and others on the "
            "same cores): timings drift, differences of a few ms or a few points of violations are noise."
            if meta["shared"] else "The machine was reported quiet (`--quiet-machine`)."),
         f"- Versions: Python {meta['python']}, onnxruntime {meta['onnxruntime']}, tritonserver "
         f"{meta['tritonserver']} (nvidia-pytriton {meta['pytriton']}), tritonclient {meta['tritonclient']}, "
         f"perf_analyzer 2.41 (from the tritonclient 2.41.0 wheel), numpy {meta['numpy']}, lazybatch commit "
         f"`{meta['commit']}`.",
         f"- Method: per model one tritonserver; loads {', '.join(f'{f:.0%}' for f in st.loads)} of the batch-1 "
         f"service rate"
         + (f" (models whose profile shows batching pays also at {', '.join(f'{f:.0%}' for f in st.overload_loads)}"
            ", for their peak throughput)" if st.overload_loads else "")
         + f"; {st.duration:g} s of open-loop Poisson load per policy and load (light loads stretched up to "
         f"{2 * st.duration:g} s to hold about {st.min_requests} requests), in {st.slices} slices in which the "
         f"policies take turns" + (" (in reverse order in every other slice)" if meta.get("alternating") else "")
         + f"; perf_analyzer at {', '.join(f'{f:.0%}' for f in st.perf_loads) or '-'}"
         f". SLA targets {', '.join(f'{m:g}x' for m in st.sla_multiples)} the model's single-request latency; eager, "
         f"lazy and oracle schedule by {st.sched_sla_multiple:g}x. Policies: "
         + ", ".join(f"`{p}` ({VARIANTS.get(p, ALL_POLICIES[p])})" for p in st.policies)
         + "".join(f", `{v}` ({VARIANTS[v]}; {', '.join(ms)} only)" for v, ms in variants_in(results).items()
                   if v not in st.policies) + "."
         + (" Seq2seq models (gnmt) run graph:0/5/20 inside the backend (`graph_0ms`, `graph_5ms`, `graph_20ms`) in "
            f"place of Triton's dynamic batcher, which has no decoder loop; their requests take a few hundred ms "
            f"each, so their cells last {st.seq2seq_duration:g} s (light loads up to {2 * st.seq2seq_duration:g} s) "
            "and their t1 is the mean over the same 20 seeded requests served one at a time (serial)." if any(r["model"] in SEQ2SEQ_KINDS
                                                                                     for r in results) else ""), "",
         "## Batch-scaling curves (the regimes)", "",
         "Per-sample latency vs batch size from each model's profiled latency table (sum of its stages, "
         "onnxruntime CPU, this run).", "",
         f"![per-sample latency vs batch size]({rel}/regimes_scaling.png)", "",
         "| model | stages | batch-1 ms | per-sample ms at each batch size | gain | regime |",
         "| --- | --- | --- | --- | --- | --- |"]
    for res in results:
        sc = res["scaling"]
        L.append(f"| {res['model']} | {res['stages']} | {sc['t1_ms']:.2f} | "
                 + ", ".join(f"b{b}: {v:.2f}" for b, v in zip(sc["batch_sizes"], sc["per_sample_ms"]))
                 + f" | {sc['gain']:.2f}x | {sc['regime']} |")
    L.append("")
    for k, why in NOT_SERVED.items():
        if k not in {r["model"] for r in results}:
            L += [f"- {why}", ""]
    L += ["## Choosing a policy", ""]
    L += summary(results, st) + [""]
    for res in results:
        L += model_section(res, f"{rel}/regimes_{res['model']}.png", st)
    data = meta.get("data_copy")
    where = f"[{os.path.relpath(data, page.parent)}]({os.path.relpath(data, page.parent)})" if data else \
        f"`{meta['results_json']}`"
    L += ["## Raw data", "", f"Every cell (latencies summarised, server counters, backend statistics, the settings "
          f"of the run): {where}. `--from-results FILE` renders this page again from such a file.", ""]
    page.write_text("\n".join(L))


def variants_in(results: list[dict]) -> dict[str, list[str]]:
    """Variants some model of a merged page was measured under (--from-results A,B: B's run may have asked)."""
    found: dict[str, list[str]] = {}
    for res in results:
        for v in sorted({c["policy"] for c in res["cells"]} & set(VARIANTS)):
            found.setdefault(v, []).append(res["model"])
    return found


def summary(results: list[dict], st: Settings) -> list[str]:
    """A few generated lines per model: which policy had the lowest average latency and violations, per load."""
    key = f"{st.sched_sla_multiple:g}x"
    out = []
    for res in results:
        loads = sorted({c["load"] for c in res["cells"]})
        best_lat, best_v = [], []
        for f in loads:
            cs = [c for c in res["cells"] if c["load"] == f]
            a = min(cs, key=lambda c: c["avg_ms"] if not math.isnan(c["avg_ms"]) else math.inf)
            v = min(cs, key=lambda c: c["violation"][key])
            best_lat.append(f"{f:.0%} {a['policy']}")
            best_v.append(f"{f:.0%} {v['policy']}")
        out.append(f"- **{res['model']}** ({res['scaling']['regime']}, {res['scaling']['gain']:.2f}x): lowest "
                   f"average latency: {', '.join(best_lat)}; fewest violations at {key}: {', '.join(best_v)}.")
    return out


def plot_scaling(results: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for res in results:
        sc = res["scaling"]
        axes[0].plot(sc["batch_sizes"], [v / sc["per_sample_ms"][0] for v in sc["per_sample_ms"]], marker="o",
                     label=f"{res['model']} ({sc['t1_ms']:.1f} ms at b1)")
        axes[1].plot(sc["batch_sizes"], sc["whole_ms"], marker="o", label=res["model"])
    axes[0].set_ylabel("per-sample latency / batch-1 latency")
    axes[0].set_ylim(bottom=0)
    axes[1].set_ylabel("whole-program latency (ms)")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("batch size")
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_model(res: dict, path: Path, st: Settings) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    key = f"{st.sched_sla_multiple:g}x"
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
    pols = [p for p in ROW_ORDER if any(c["policy"] == p for c in res["cells"])]
    for p in pols:
        cs = sorted((c for c in res["cells"] if c["policy"] == p), key=lambda c: c["load"])
        x = [c["load"] * 100 for c in cs]
        style = {"linewidth": 2.5} if p == "lazy" else {}
        axes[0].plot(x, [c["avg_ms"] for c in cs], marker="o", label=p, **style)
        axes[1].plot(x, [c["p99_ms"] for c in cs], marker="o", label=p, **style)
        axes[2].plot(x, [c["violation"][key] * 100 for c in cs], marker="o", label=p, **style)
        axes[3].plot(x, [c["throughput"] for c in cs], marker="o", label=p, **style)
        pcs = sorted((c for c in res["perf"] if c["policy"] == p and "avg_ms" in c), key=lambda c: c["load"])
        if pcs:
            axes[0].scatter([c["load"] * 100 for c in pcs], [c["avg_ms"] for c in pcs], marker="x", s=50,
                            color=axes[0].lines[-1].get_color())
    axes[0].set_ylabel("average latency (ms); x: perf_analyzer")
    axes[1].set_ylabel("p99 latency (ms)")
    axes[2].set_ylabel(f"SLA violations at {key} t1 (%)")
    axes[3].set_ylabel("throughput (requests/s)")
    for ax in axes[:2]:
        ax.set_yscale("log")
    for ax in axes:
        ax.set_xlabel("offered load (% of batch-1 service rate)")
        ax.legend(fontsize=7)
    fig.suptitle(f"{res['model']}: {res['description']} ({res['scaling']['regime']})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def parse_list(text: str, cast: Any = float) -> list:
    return [cast(v.strip()) for v in text.split(",") if v.strip()]


def main(argv: list[str] | None = None) -> int:
    from lazybatch.batcher.errors import ConfigError

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=None, help="comma list of mlp, bert, resnet50, gnmt, tiny "
                    "(default mlp,bert,resnet50,gnmt; --quick: tiny)")
    ap.add_argument("--loads", default=None, help="load fractions of the batch-1 service rate "
                    "(default 0.1,0.4,0.7,0.9,1.2,1.5; --quick: 0.3,0.9)")
    ap.add_argument("--overload-loads", default=None, help="further loads for models whose profile shows "
                    "batching pays (gain >= 2x), for their peak throughput (default 2,3; --quick and '': none)")
    ap.add_argument("--perf-loads", default=None, help="fractions driven by perf_analyzer too (default 0.4,0.9; "
                    "--quick: 0.9; '' for none)")
    ap.add_argument("--duration", type=float, default=None, help="seconds of load per policy and load "
                    "(default 8; --quick: 2)")
    ap.add_argument("--seq2seq-duration", type=float, default=None, help="seconds per cell for seq2seq models "
                    "(default 30; --quick: 2)")
    ap.add_argument("--min-requests", type=int, default=None, help="stretch a light load's cell (up to twice "
                    "--duration) to about this many requests (default 16; --quick: 0)")
    ap.add_argument("--slices", type=int, default=None, help="policies take turns in this many slices per load "
                    "(default 3, the cell's repetitions; --quick: 1)")
    ap.add_argument("--perf-measurement-ms", type=int, default=None,
                    help="perf_analyzer window (-p), three windows per cell (default 2500; --quick: 1000)")
    ap.add_argument("--sla-multiples", default="2,5,10", help="SLA targets as multiples of t1")
    ap.add_argument("--sched-sla-multiple", type=float, default=5.0, help="the target eager/lazy/oracle schedule by")
    ap.add_argument("--policies", default=",".join(POLICY_ORDER),
                    help="subset of " + ",".join(POLICY_ORDER) + "; variants, asked for by name: "
                    + "; ".join(f"{k} ({v})" for k, v in VARIANTS.items()))
    ap.add_argument("--out", default=None, help="work and raw results (default lazybatch-results/regimes[-quick])")
    ap.add_argument("--page", default=None,
                    help="results page (default docs/results/regimes.md; --quick: OUT/regimes.md)")
    ap.add_argument("--img-dir", default=None, help="plots (default docs/img; --quick: OUT/img)")
    ap.add_argument("--data", default=None, help="copy of the raw results (default docs/data/regimes.json; "
                    "--quick: none)")
    ap.add_argument("--from-results", default=None, help="render the page again from a results.json, measure nothing; "
                    "A.json,B.json: B's models (a later run) join A's or replace A's results for the same model")
    ap.add_argument("--reuse-profile", action="store_true", help="keep latency tables from an earlier run in --out")
    ap.add_argument("--quiet-machine", action="store_true", help="say on the page that nothing else ran")
    ap.add_argument("--quick", action="store_true", help="smoke test: tiny model, two loads, short windows")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    q = args.quick
    try:
        models = parse_list(args.models or ("tiny" if q else "mlp,bert,resnet50,gnmt"), str)
        for m in models:
            if m not in DESCRIPTION:
                raise ConfigError(f"--models: unknown model {m!r}; choose from {', '.join(DESCRIPTION)}"
                                  + (f" ({NOT_SERVED[m]})" if m in NOT_SERVED else ""))
        policies = parse_list(args.policies, str)
        for p in policies:
            if p not in KNOWN_POLICIES:
                raise ConfigError(f"--policies: unknown policy {p!r}; choose from {', '.join(KNOWN_POLICIES)}")
        policies = [p for p in KNOWN_POLICIES if p in policies]
        loads = parse_list(args.loads or ("0.3,0.9" if q else "0.1,0.4,0.7,0.9,1.2,1.5"))
        perf_loads = parse_list(args.perf_loads if args.perf_loads is not None else ("0.9" if q else "0.4,0.9"))
        overload = parse_list(args.overload_loads if args.overload_loads is not None else ("" if q else "2,3"))
        if any(f <= 0 for f in loads + perf_loads + overload):
            raise ConfigError("--loads/--perf-loads/--overload-loads: fractions must be > 0")
    except ValueError as e:
        raise SystemExit(f"bench_regimes: error: {e}") from None
    except ConfigError as e:
        raise SystemExit(f"bench_regimes: error: {e}") from None
    out = Path(args.out or ("lazybatch-results/regimes-quick" if q else "lazybatch-results/regimes"))
    st = Settings(models=models, loads=loads, perf_loads=perf_loads,
                  duration=args.duration or (2.0 if q else 8.0),
                  min_requests=args.min_requests if args.min_requests is not None else (0 if q else 16),
                  slices=args.slices or (1 if q else 3),
                  perf_measurement_ms=args.perf_measurement_ms or (1000 if q else 2500),
                  sla_multiples=parse_list(args.sla_multiples), sched_sla_multiple=args.sched_sla_multiple,
                  policies=policies, out=out, seed=args.seed, reprofile=not args.reuse_profile,
                  seq2seq_duration=args.seq2seq_duration or (2.0 if q else 30.0), overload_loads=tuple(overload))
    page = Path(args.page or (out / "regimes.md" if q else ROOT / "docs" / "results" / "regimes.md"))
    img_dir = Path(args.img_dir or (out / "img" if q else ROOT / "docs" / "img"))
    data_copy = Path(args.data) if args.data else (None if q else ROOT / "docs" / "data" / "regimes.json")
    if args.from_results:
        files = [Path(f) for f in args.from_results.split(",") if f.strip()]
        saved = json.loads(files[0].read_text())
        home = {r["model"]: files[0].parent for r in saved["results"]}  # where each model's run kept its files
        for f in files[1:]:  # further runs: their models join the page or replace the same model's earlier results
            more = json.loads(f.read_text())
            home |= {r["model"]: f.parent for r in more["results"]}
            newer = {r["model"]: r for r in more["results"]}
            saved["results"] = [newer.pop(r["model"], r) for r in saved["results"]] + list(newer.values())
            saved["meta"].setdefault("extra_runs", []).append(
                {k: more["meta"].get(k, "?") for k in ("command", "started", "finished", "elapsed_min",
                                                        "loadavg_before", "loadavg_after", "commit")}
                | {"alternating": more["meta"].get("alternating", False)}
                | {"models": [r["model"] for r in more["results"]]})
        if "settings" in saved["meta"]:
            st = Settings(**(saved["meta"]["settings"] | {"out": Path(saved["meta"]["settings"]["out"])}))
        for res in saved["results"]:  # results from before the simulated figures: add them from the run's table
            add_simulated(res, st, home.get(res["model"]))
        if data_copy is not None and files[0].resolve() != data_copy.resolve():
            saved["meta"]["data_copy"] = str(data_copy)
            data_copy.parent.mkdir(parents=True, exist_ok=True)
            data_copy.write_text(json.dumps(saved, indent=1))
        m = saved["meta"]  # a results file written before the run ended (after each model) lacks these
        for k, v in (("finished", "? (run not finished)"), ("elapsed_min", math.nan), ("loadavg_after", "?"),
                     ("shared", True), ("results_json", args.from_results)):
            m.setdefault(k, v if k != "results_json" else str(files[0]))
        m.setdefault("tritonserver", saved["results"][0]["tritonserver"] if saved["results"] else "?")
        for res in saved["results"]:  # a run's statistics files, when the results predate time_scale in them
            if "time_scale" not in res and "lazy" in st.policies:
                final = runtime_stats(st.out / "stats" / res["model"], f"{res['model']}_lazy", timeout=0.0)
                if "time_scale" in final:
                    res["time_scale"] = final["time_scale"]
        write_page(saved["results"], saved["meta"], st, page, img_dir)
        print(f"results page: {page}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    meta = machine_meta()
    meta["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(st).items()}
    meta["command"] = "python -m benchmarks.bench_regimes " + " ".join(sys.argv[1:] if argv is None else argv)
    meta["started"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    meta["alternating"] = True  # odd slices reverse the policies' order (runs before this key did not)
    t_start = time.monotonic()
    from tqdm import tqdm

    total = len(models) * (len(loads) * st.slices + len(perf_loads)) * len(policies)
    results = []
    with tqdm(total=total, desc="regimes", unit="run") as bar:
        for m in models:
            results.append(measure_model(m, st, bar))
            (out / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    meta.update({"finished": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                 "elapsed_min": (time.monotonic() - t_start) / 60,
                 "loadavg_after": " ".join(f"{v:.1f}" for v in os.getloadavg()), "shared": not args.quiet_machine,
                 "tritonserver": results[0]["tritonserver"] if results else "?",
                 "results_json": str(out / "results.json")})
    if data_copy is not None:
        meta["data_copy"] = str(data_copy)
        data_copy.parent.mkdir(parents=True, exist_ok=True)
        data_copy.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    (out / "results.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    write_page(results, meta, st, page, img_dir)
    print(f"results page: {page}\nraw results: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
