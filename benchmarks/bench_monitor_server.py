"""BatchMonitor on the real Triton server: seed 002's evaluation shape, scaled to what this machine serves.

    python -m benchmarks.bench_monitor_server                       # ResNet-50, VGG-19, BERT-base (~25 min, 2 cores)
    python -m benchmarks.bench_monitor_server --models resnet50 --duration 30 --slices 1    # a shorter look
    python -m benchmarks.bench_monitor_server --quick               # a tiny MLP, ~1 minute (what the test runs)

For every model: one tritonserver serves it under BatchMonitor (``monitor``), ad-hoc batching (``adhoc``),
max-batch-under-deadline (``deadline``), Triton's own dynamic batcher on the whole graph (``triton:N``) and
LazyBatching (``lazy``); all lazybatch policies run the same stage directory and latency table.

Scaling, stated in the output: the seed's trace (``workload.rate_trace``: 1..240 requests/s over 300 s) keeps its
shape, but

* **rate**: every rate is multiplied by ``load * mu / 240``, where mu = 1 / (batch-1 latency measured on this server
  at the start of the run), so the trace's peak is ``load`` (default 1.1) times the batch-1 service rate;
* **time**: the 300 s are compressed into ``--duration`` seconds per policy (default 60: 5x).

The SLA is ``--sla-x`` times the measured batch-1 latency (sent with each request); it bounds how long
max-batch-under-deadline waits, so the goal ratio against it depends on it. All policies get the same arrival times.
The compressed trace is cut into ``--slices`` and the policies take turns slice by slice (rotating the order), so
that the load other processes put on this shared machine drifts evenly over all of them.

Per policy: average and p99 latency, SLA violations, mean executed batch size (from the backend's batch log,
``LAZYBATCH_STATS_DIR/<model>.batches.csv``, for every policy including Triton's batcher), sent / answered / failed,
and ``executed`` (requests run by the first stage in the run's window: equals ``sent`` when every request ran once).
Goals as ratios from the same run: BatchMonitor / AdHoc average latency (<= 1.1x) and MaxBatchDeadline /
BatchMonitor (>= 10x). Energy is not measured (a CPU, no power meter): no energy column.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import machine_meta, percentile, start_server, write_json
from benchmarks.harness.cli import turned
from benchmarks.harness.stats import bins
from benchmarks.harness.measure import service_time
from benchmarks.harness.plots import pyplot, save
from benchmarks.harness.page import table_head
from lazybatch.backend.stats_logs import read_log
from lazybatch.client.api import Client
from lazybatch.client.load import LoadResult, run_schedule, schedule_from_rates
from lazybatch.repo import add_model, split_into
from lazybatch.simulator.workload import rate_trace

POLICY_LABELS = {"monitor": "BatchMonitor", "adhoc": "AdHoc", "deadline": "MaxBatchDeadline", "triton": "Triton",
                 "lazy": "LazyB"}
MODELS = ("resnet50", "vgg19", "bert_base")
TRACE_S = 300.0  # the seed's trace length (trace seconds)
PEAK = 240.0  # the seed's peak rate


def build_onnx(kind: str, path: Path) -> None:
    """ResNet-50 and VGG-19: the onnx package's light models made batchable (random weights); BERT-base: the
    export zoo's encoder at sequence 32 (as the simulator's table); tiny: a small MLP for the quick mode."""
    from lazybatch.staging import batchable_light_model, make_mlp

    if kind in ("resnet50", "vgg19"):
        batchable_light_model(kind, path)
    elif kind == "bert_base":
        import onnx

        from lazybatch.onnx_tools.zoo.nlp import bert

        model = bert(seed=0, seq_len=32).model({"lazybatch.seed": "0"}, doc="BERT-base, sequence 32, random weights")
        onnx.save(model, str(path))
    elif kind == "tiny":
        make_mlp(path, in_dim=64, width=128, depth=4, out_dim=10, seed=0)
    else:
        raise SystemExit(f"unknown model {kind!r}; choose from {', '.join(MODELS)} or tiny")


def build_repository(kind: str, repo: Path, work: Path, *, max_batch_size: int, max_stages: int, triton_us: int,
                     policies: list[str], intra_op_threads: int, log: Any = print) -> dict[str, str]:
    """``kind`` built, split and profiled once (cached in ``work``), one model directory per policy; returns
    policy -> model name."""
    from lazybatch.backend.stages import StageRunner
    from lazybatch.backend.stage_profile import profile_batch_sizes

    work.mkdir(parents=True, exist_ok=True)
    onnx_path = work / f"{kind}.onnx"
    if not onnx_path.exists():
        log(f"{kind}: building {onnx_path}")
        build_onnx(kind, onnx_path)
    stages = work / f"{kind}_stages{max_stages}"
    if not (stages / "manifest.json").exists():
        log(f"{kind}: splitting into at most {max_stages} stages")
        split_into(onnx_path, stages, max_stages=max_stages, name=kind)
    table = table_path(work, kind, max_stages, max_batch_size, intra_op_threads)
    if not table.exists():
        log(f"{kind}: profiling the stages at batch sizes up to {max_batch_size}")
        runner = StageRunner(stages, intra_op_threads=intra_op_threads)
        runner.run_all(runner.sample_inputs(1))
        runner.profile(profile_batch_sizes(max_batch_size), reps=3).save(table)
    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir(parents=True)
    names = {}
    for p in policies:
        spec = f"triton:{triton_us}" if p == "triton" else p
        name = f"{kind}_{p}"
        add_model(None, repo, name=name, policy=spec, sla_ms=None, max_batch_size=max_batch_size, stages=stages,
                  latency_table=table, intra_op_threads=intra_op_threads, force=True)
        names[p] = name
    return names


def table_path(work: Path, kind: str, max_stages: int, max_batch_size: int, threads: int) -> Path:
    return work / f"{kind}_stages{max_stages}_latency_b{max_batch_size}_t{threads}.json"


def read_batch_log(path: Path) -> list[tuple[float, int, int, float]]:
    """(unix time at the batch's end, stage, batch size, onnxruntime seconds) from the backend's batch log."""
    return [(float(t), int(stage), int(size), float(sec)) for t, stage, size, sec in read_log(path)]


def wait_for_batches(path: Path, t0: float, t1: float, stage0_samples: int, timeout: float = 5.0) -> None:
    """The batch log is appended as batches end; give the last lines a moment to land."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if sum(s for t, st, s, _ in read_batch_log(path) if t0 <= t <= t1 + 1 and st == 0) >= stage0_samples:
            return
        time.sleep(0.1)


def run_model(kind: str, args: argparse.Namespace, out: Path) -> dict:
    policies = args.policies
    repo = out / f"repo-{kind}"
    names = build_repository(kind, repo, Path(args.work), max_batch_size=args.max_batch_size,
                             max_stages=args.max_stages, triton_us=args.triton_delay_us, policies=policies,
                             intra_op_threads=args.intra_op_threads)
    stats_dir = (out / f"stats-{kind}").resolve()
    if stats_dir.exists():
        shutil.rmtree(stats_dir)
    print(f"{kind}: starting tritonserver ({', '.join(names.values())}) ...", flush=True)
    server = start_server(repo, out / f"tritonserver-{kind}.log", stats_dir=stats_dir, timeout=600)
    try:
        url = server.endpoints.grpc
        with Client(url) as c:
            ref = names["adhoc"] if "adhoc" in names else next(iter(names.values()))
            t1 = service_time(c, ref, args.calibration, warmup=2)
        mu = 1.0 / t1
        sla_ms = args.sla_x * t1 * 1e3
        scale = args.load * mu / PEAK
        compress = TRACE_S / args.duration
        trace = [(t / compress, r * scale) for t, r in rate_trace(TRACE_S, 1.0, PEAK, seed=args.seed)]
        offsets = schedule_from_rates(trace, args.duration, seed=args.seed)
        peak = max(r for _, r in trace)
        print(f"{kind}: batch-1 latency {t1 * 1e3:.1f} ms (mu {mu:.2f}/s); trace rate x{scale:.4f} (peak "
              f"{peak:.2f}/s = {peak / mu:.2f} mu), time /{compress:g} ({args.duration:g} s per policy): "
              f"{len(offsets)} requests (mean {len(offsets) / args.duration:.2f}/s); SLA {sla_ms:.0f} ms "
              f"({args.sla_x:g} x batch-1)", flush=True)
        bounds = [args.duration * k / args.slices for k in range(args.slices + 1)]
        runs: dict[str, list[tuple[float, LoadResult, float, float]]] = {p: [] for p in policies}
        for k in range(args.slices):
            seg = [o - bounds[k] for o in offsets if bounds[k] <= o < bounds[k + 1]]
            order = turned(policies, k)
            for p in order:
                if not seg:
                    continue
                r = run_schedule(url, names[p], seg, sla_ms=sla_ms, seed=args.seed + k,
                                 timeout_s=max(120.0, 4 * sla_ms / 1e3))
                t_end = time.time()
                wait_for_batches(stats_dir / f"{names[p]}.batches.csv", r.start_unix, t_end, r.ok + r.errors)
                runs[p].append((bounds[k], r, r.start_unix, time.time()))
                print(f"  slice {k + 1}/{args.slices} {POLICY_LABELS[p]:<16} sent {r.sent} ok {r.ok} err {r.errors} "
                      f"avg {r.avg_ms:.0f} ms p99 {r.p99_ms:.0f} ms", flush=True)
                time.sleep(args.pause)
    finally:
        code = server.stop()
        if code:
            print(f"{kind}: tritonserver exited with {code}", flush=True)
    rows, series = {}, {}
    b1_time = b1_count = 0.0  # batch-1 device time during the run (policies that run whole requests together)
    for p in policies:
        log = read_batch_log(stats_dir / f"{names[p]}.batches.csv")
        recs: list[tuple[float, float, bool]] = []  # (trace-time s of the send, latency ms, ok)
        batches: list[tuple[float, int]] = []  # (trace-time s of the batch end, size), every stage
        sent = ok = errors = executed = 0
        ort_s = wall_s = 0.0
        for seg_start, r, u0, u1 in runs[p]:
            sent += r.sent
            ok += r.ok
            errors += r.errors
            wall_s += u1 - u0
            recs += [((seg_start + o) * compress, l, good) for o, l, good in r.records]
            for t, st, s, sec in log:
                if u0 <= t <= u1:
                    batches.append(((seg_start + t - u0) * compress, s))
                    executed += s if st == 0 else 0
                    ort_s += sec
                    if s == 1 and p != "lazy":
                        b1_time += sec
                        b1_count += 1 if st == 0 else 0
        lat = [l for _, l, good in recs if good]
        rows[p] = {"policy": POLICY_LABELS[p], "model": names[p], "sent": sent, "ok": ok, "errors": errors,
                   "unanswered": sent - ok - errors, "executed": executed,
                   "avg_ms": statistics.fmean(lat) if lat else math.nan, "p50_ms": percentile(lat, 50),
                   "p99_ms": percentile(lat, 99),
                   "sla_violation": (sum(1 for l in lat if l > sla_ms) + errors + (sent - ok - errors)) / sent
                   if sent else math.nan,
                   "mean_batch": statistics.fmean(s for _, s in batches) if batches else math.nan,
                   "batches": len(batches),
                   # onnxruntime time per request (batching's gain, and the machine's contention, show here) and
                   # the share of the run's wall time the model computed
                   "device_ms_per_request": ort_s / executed * 1e3 if executed else math.nan,
                   "busy": ort_s / wall_s if wall_s else math.nan}
        series[p] = {"latency": [(t, l) for t, l, good in recs if good], "batch": batches}
    table = table_path(Path(args.work), kind, args.max_stages, args.max_batch_size, args.intra_op_threads)
    res = {"model": kind, "table": str(table), "t1_ms": t1 * 1e3,
           "t1_during_ms": b1_time / b1_count * 1e3 if b1_count else math.nan, "mu": mu, "sla_ms": sla_ms,
           "rate_scale": scale,
           "time_compression": compress, "duration_s": args.duration, "requests": len(offsets),
           "trace": trace, "rows": rows, "series": series}
    res["goals"] = goals(rows)
    add_simulation(res, table, policies, args.slices, args.max_batch_size, args.seed)
    return res


def add_simulation(res: dict, table_path: Path, policies: list[str], slices: int, max_batch_size: int,
                   seed: int) -> None:
    from lazybatch.batcher import LatencyTable

    res["table"] = str(table_path)
    res["table_t1_ms"] = LatencyTable.load(table_path).whole_graph_latency(1) * 1e3
    res["sim"] = simulate(res, table_path, policies, slices, max_batch_size, seed)
    res["sim_goals"] = goals(res["sim"])


SIM_POLICY = {"triton": "graph:0"}  # Triton's dynamic batcher at max_queue_delay 0 is graph batching without a window


def simulate(res: dict, table_path: Path, policies: list[str], slices: int, max_batch_size: int,
             seed: int) -> dict[str, dict]:
    """The same arrivals, slices and SLA on the discrete-event simulator with the latency table the server used
    (one scheduler core, two clocks): what the policies would do on a device that runs exactly as profiled, without
    gRPC, Python-backend and other processes' overheads."""
    from lazybatch.batcher import LatencyTable, parse_policy
    from lazybatch.batcher.decisions import DecisionLog
    from lazybatch.simulator.engine import Simulation
    from lazybatch.simulator.workload import Arrival, requests

    table = LatencyTable.load(table_path)
    duration = res["duration_s"]
    offsets = schedule_from_rates([tuple(x) for x in res["trace"]], duration, seed=seed)
    bounds = [duration * k / slices for k in range(slices + 1)]
    out = {}
    for p in policies:
        lat: list[float] = []
        sizes: list[int] = []
        for k in range(slices):
            seg = [o - bounds[k] for o in offsets if bounds[k] <= o < bounds[k + 1]]
            if not seg:
                continue
            pol = parse_policy(SIM_POLICY.get(p, p)).build(max_batch_size=max_batch_size)
            sim = Simulation(table, pol, log=DecisionLog(capacity=1, enabled=False),
                             on_job=lambda t, job: sizes.append(job.batch_size))
            reqs = requests([Arrival(o) for o in seg], res["sla_ms"] / 1e3)
            sim.run(reqs)
            lat += [r.latency * 1e3 for r in reqs]
        out[p] = {"avg_ms": statistics.fmean(lat) if lat else math.nan, "p99_ms": percentile(lat, 99),
                  "sla_violation": sum(1 for v in lat if v > res["sla_ms"]) / len(lat) if lat else math.nan,
                  "mean_batch": statistics.fmean(sizes) if sizes else math.nan}
    return out


def goals(rows: dict[str, dict]) -> dict[str, float]:
    g = {}
    if "monitor" in rows and "adhoc" in rows:
        g["monitor_over_adhoc"] = rows["monitor"]["avg_ms"] / rows["adhoc"]["avg_ms"]
    if "monitor" in rows and "deadline" in rows:
        g["deadline_over_monitor"] = rows["deadline"]["avg_ms"] / rows["monitor"]["avg_ms"]
    return g


def markdown(results: list[dict], meta: dict) -> str:
    lines = [f"Machine: {meta.get('cpu', meta['machine'])} ({meta['machine']}), commit {meta.get('commit')}; load "
             f"average at the end {meta['loadavg']}. Command: `{meta['command']}`",
             ""]
    for res in results:
        lines += [f"**{res['model']}**: batch-1 latency {ms(res['t1_ms'])} ms at the start (mu {res['mu']:.2f}/s; "
                  f"onnxruntime time of a batch-1 request during the run: {ms(res.get('t1_during_ms', math.nan))} "
                  f"ms); trace rates "
                  f"x{res['rate_scale']:.4f} (peak {max(r for _, r in res['trace']):.2f}/s), time compressed "
                  f"{res['time_compression']:g}x ({res['duration_s']:g} s per policy, {res['requests']} requests); "
                  f"SLA {ms(res['sla_ms'])} ms" + (f"; the latency table's batch-1 time {ms(res['table_t1_ms'])} ms"
                                                   if "table_t1_ms" in res else ""), "",
                  *table_head(["policy", "sent", "ok", "err", "executed", "avg ms", "p50 ms", "p99 ms", "SLA viol",
                               "mean batch", "device ms/request", "busy", "sim avg ms", "sim p99 ms", "sim SLA viol",
                               "sim mean batch"])]
        for p, r in res["rows"].items():
            sm = res.get("sim", {}).get(p)
            simcols = (f"{ms(sm['avg_ms'])} | {ms(sm['p99_ms'])} | {sm['sla_violation']:.1%} | "
                       f"{sm['mean_batch']:.2f}" if sm else "- | - | - | -")
            lines.append(f"| {r['policy']} | {r['sent']} | {r['ok']} | {r['errors']} | {r['executed']} | "
                         f"{ms(r['avg_ms'])} | {ms(r['p50_ms'])} | {ms(r['p99_ms'])} | {r['sla_violation']:.1%} | "
                         f"{r['mean_batch']:.2f} | {ms(r.get('device_ms_per_request', math.nan))} | "
                         f"{r.get('busy', math.nan):.0%} | {simcols} |")
        lines += ["", "Goals, server: " + goal_text(res["goals"])]
        if "sim_goals" in res:
            lines += ["", "Goals, simulator (same arrivals, same table): " + goal_text(res["sim_goals"])]
        lines.append("")
    return "\n".join(lines) + "\n"


def ms(v: float) -> str:
    """Milliseconds with the digits that matter: 0.12, 3.4, 56, 789."""
    return "nan" if not math.isfinite(v) else f"{v:.2f}" if v < 1 else f"{v:.1f}" if v < 100 else f"{v:.0f}"


def goal_text(g: dict[str, float]) -> str:
    return "; ".join(
        ([f"BatchMonitor / AdHoc average latency **{g['monitor_over_adhoc']:.2f}x** (goal <= 1.1x)"]
         if "monitor_over_adhoc" in g else []) +
        ([f"MaxBatchDeadline / BatchMonitor **{g['deadline_over_monitor']:.1f}x** (goal >= 10x)"]
         if "deadline_over_monitor" in g else []))


def plot(res: dict, path: Path, bin_s: float) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    tr = res["trace"]
    c = res["time_compression"]
    axes[0].step([t * c for t, _ in tr], [r for _, r in tr], where="post", color="black", label="offered rate")
    axes[0].axhline(res["mu"], color="tab:gray", linestyle="--", label="batch-1 service rate")
    axes[0].set_ylabel("requests/s")
    axes[0].legend(fontsize=7)
    axes[0].set_title(f"{res['model']} on tritonserver (CPU): trace x{res['rate_scale']:.4f} in rate, /{c:g} in time; "
                      f"SLA {res['sla_ms']:.0f} ms")
    for p, s in res["series"].items():
        label = POLICY_LABELS[p]
        x, y = bins(s["latency"], bin_s, TRACE_S)
        axes[1].plot(x, y, label=label, linewidth=1, marker="o", markersize=2)
        x, y = bins([(t, float(b)) for t, b in s["batch"]], bin_s, TRACE_S)
        axes[2].plot(x, y, label=label, linewidth=1, marker="o", markersize=2)
    axes[1].axhline(res["sla_ms"], color="tab:red", linestyle=":", label="SLA")
    axes[1].set_yscale("log")
    axes[1].set_ylabel(f"mean latency per {bin_s:g} trace-s (ms)")
    axes[1].legend(fontsize=7)
    axes[2].set_ylabel("mean executed batch size")
    axes[2].set_xlabel("trace time (s; wall time x compression)")
    axes[2].legend(fontsize=7)
    fig.tight_layout()
    save(fig, path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list of {', '.join(MODELS)}, tiny")
    ap.add_argument("--policies", default="monitor,adhoc,deadline,triton,lazy")
    ap.add_argument("--duration", type=float, default=None,
                    help="wall seconds the 300 s trace is compressed into, per policy (60; --quick: 6)")
    ap.add_argument("--durations", default="",
                    help="per-model overrides of --duration, e.g. vgg19=90 (slow models need more wall time for as "
                         "many requests)")
    ap.add_argument("--load", type=float, default=1.1, help="trace peak as a multiple of the batch-1 service rate")
    ap.add_argument("--sla-x", type=float, default=20.0, help="SLA as a multiple of the batch-1 latency")
    ap.add_argument("--slices", type=int, default=3, help="policies take turns in this many slices of the trace")
    ap.add_argument("--max-batch-size", type=int, default=8)
    ap.add_argument("--max-stages", type=int, default=8)
    ap.add_argument("--intra-op-threads", type=int, default=1,
                    help="onnxruntime intra-op threads of every model (and of the profile): 1 keeps service times "
                         "steady when other processes share the cores (0: onnxruntime's default)")
    ap.add_argument("--triton-delay-us", type=int, default=0, help="max_queue_delay_microseconds of triton:N")
    ap.add_argument("--calibration", type=int, default=12, help="sequential requests that measure the batch-1 time")
    ap.add_argument("--pause", type=float, default=1.0, help="seconds between runs")
    ap.add_argument("--bin", type=float, default=10.0, help="time-series bin width in trace seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=".lazybatch-build/monitor-server", help="cache of built models and tables")
    ap.add_argument("--out", default="lazybatch-results/monitor-server")
    ap.add_argument("--img-dir", default=None, help="also copy the plots here (docs/img)")
    ap.add_argument("--json", default=None,
                    help="also write the figures here without the per-request series (docs/data/...)")
    ap.add_argument("--resimulate", metavar="BENCH_JSON", default=None,
                    help="add the simulator columns to an earlier run's bench.json (no server) and rewrite its report")
    ap.add_argument("--quick", action="store_true",
                    help="the tiny MLP, 6 s per policy, one slice: a smoke run (and the test's)")
    args = ap.parse_args(argv)
    if args.quick:
        args.models, args.slices, args.calibration, args.pause = "tiny", 1, 20, 0.3
        args.duration = args.duration or 6.0
        args.max_stages = 2
    args.duration = args.duration or 60.0
    args.policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in args.policies if p not in POLICY_LABELS]
    if bad:
        ap.error(f"unknown policy {bad[0]!r}; choose from {', '.join(POLICY_LABELS)}")
    if args.duration <= 0 or args.load <= 0 or args.sla_x <= 0 or args.slices < 1:
        ap.error("--duration, --load, --sla-x must be positive and --slices at least 1")
    if args.resimulate:
        return resimulate(Path(args.resimulate), args)
    try:
        overrides = {k.strip(): float(v) for k, v in (d.split("=") for d in args.durations.split(",") if d.strip())}
    except ValueError:
        ap.error(f"--durations takes MODEL=SECONDS,..., got {args.durations!r}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    results = []
    for m in (m.strip() for m in args.models.split(",") if m.strip()):
        results.append(run_model(m, argparse.Namespace(**{**vars(args), "duration": overrides.get(m, args.duration)}),
                                 out))
    meta = {**machine_meta(), "machine": f"{os.cpu_count()} CPU cores, {os.uname().machine}",
            "loadavg": " ".join(f"{v:.1f}" for v in os.getloadavg()), "wall_s": time.time() - t_start,
            "command": " ".join(["python -m benchmarks.bench_monitor_server", *(sys.argv[1:] if argv is None else argv)]),
            "policies": args.policies, "durations": {r["model"]: r["duration_s"] for r in results}, "load": args.load, "sla_x": args.sla_x, "slices": args.slices,
            "max_batch_size": args.max_batch_size, "intra_op_threads": args.intra_op_threads,
            "triton_delay_us": args.triton_delay_us}
    (out / "bench.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    if args.json:  # the docs' copy: every figure, not the per-request series the plots are drawn from
        write_json(args.json, {"meta": meta, "results": [{k: v for k, v in r.items() if k != "series"}
                                                         for r in results]})
    table = markdown(results, meta)
    (out / "bench.md").write_text(table)
    print(table)
    for res in results:
        png = out / f"monitor_server_{res['model']}.png"
        plot(res, png, args.bin)
        if args.img_dir and png.exists():
            Path(args.img_dir).mkdir(parents=True, exist_ok=True)
            shutil.copy(png, Path(args.img_dir) / png.name)
    print(f"wrote {out / 'bench.json'}, {out / 'bench.md'} and the plots in {out} ({meta['wall_s']:.0f} s)")
    return 0


def resimulate(path: Path, args: argparse.Namespace) -> int:
    data = json.loads(path.read_text())
    meta = data["meta"]
    for res in data["results"]:
        table = Path(res.get("table") or table_path(Path(args.work), res["model"], args.max_stages,
                                                    meta["max_batch_size"], args.intra_op_threads))
        add_simulation(res, table, meta["policies"], meta["slices"], meta["max_batch_size"], args.seed)
    path.write_text(json.dumps(data, indent=1))
    table_md = markdown(data["results"], meta)
    path.with_suffix(".md").write_text(table_md)
    print(table_md)
    for res in data["results"]:
        if "series" in res:  # plots need the per-request series (the full bench.json, not the docs' copy)
            plot(res, path.parent / f"monitor_server_{res['model']}.png", args.bin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
