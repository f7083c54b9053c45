"""BatchMonitor/BatchDispatcher against its seed's baselines, in the simulator, on a 300 s rate trace.

    python -m benchmarks.bench_monitor [--seed 0] [--sla-ms 100] [--out benchmarks/out/monitor]

Reproduces the evaluation shape of seed 002: a request rate that moves between 1 and 240 requests/s over 300 s,
ResNet-50, VGG-19 and BERT-base-like models (the shipped synthetic tables), average latency and executed batch
size, and latency / batch-size time series. Compared in one run: ad-hoc batching, max batch size under the
deadline, Triton's dynamic batcher (GraphB(5)) and LazyBatching. Goals printed as ratios: BatchMonitor's average
latency within 1.1x of ad-hoc; at least 10x lower than max-batch-under-deadline.

Energy per request is *modelled*: the NPU timing model's dynamic-energy estimate summed over the executed stage runs
(lazybatch/simulator/energy.py), for tables that carry it (`--model npu_resnet50`, any `lazybatch npu latency`
table); the synthetic tables carry none and print n/a. Latency and batch sizes are simulated, nothing is measured.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from benchmarks.harness.plots import pyplot, save
from benchmarks.harness.stats import bins, percentile
from lazybatch.batcher import LatencyTable, parse_policy
from lazybatch.batcher.decisions import DecisionLog
from lazybatch.simulator import workload
from lazybatch.simulator.engine import Simulation
from lazybatch.simulator.energy import per_request
from lazybatch.simulator.sweep import load_table

MODELS = ("resnet50", "vgg19", "bert_base")
POLICIES = ("adhoc", "monitor", "deadline", "graph:5", "lazy")


def scaled(model: str, factor: float) -> LatencyTable:
    t = load_table(model)  # shipped synthetic tables, NPU tables (npu_*) or a table path
    return LatencyTable(t.graph, t.batch_sizes, [[v * factor for v in row] for row in t.measured],
                        provenance=f"{t.provenance}; every latency x{factor:g}", meta=t.meta)


def run(model: str, policy: str, arrivals, sla: float, scale: float = 1.0):
    table = scaled(model, scale)
    pol = parse_policy(policy).build()
    batches: list[tuple[float, int]] = []
    sim = Simulation(table, pol, log=DecisionLog(capacity=1, enabled=False),
                     on_job=lambda t, job: batches.append((t, job.batch_size)) if job.stage == 0 else None)
    reqs = workload.requests(arrivals, sla)
    sim.run(reqs)
    pol.energy_j = sim.energy_j  # modelled energy of the run (None without an energy table)
    return reqs, batches, pol


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sla-ms", type=float, default=100.0)
    ap.add_argument("--duration", type=float, default=300.0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out/monitor"))
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--model", action="append", help=f"repeatable (default {', '.join(MODELS)}); npu_resnet50 or "
                    "a `lazybatch npu latency` table adds the modelled energy per request")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply every table latency (e.g. 4: a device 4x slower than the NPU-shaped tables, "
                         "closer to the seed's GPUs, where 240 requests/s needs batching)")
    args = ap.parse_args()
    sla = args.sla_ms / 1e3
    trace = workload.rate_trace(args.duration, 1.0, 240.0, seed=args.seed)
    arrivals = workload.arrivals_from_rates(trace, seed=args.seed, duration=args.duration)
    print(f"trace: {len(arrivals)} requests over {args.duration:g} s, rate 1..240 requests/s "
          f"(mean {len(arrivals) / args.duration:.1f}), SLA {args.sla_ms:g} ms, latencies x{args.scale:g}")
    args.out.mkdir(parents=True, exist_ok=True)
    workload.save_trace(arrivals, args.out / "trace.csv")
    results: dict[tuple[str, str], dict] = {}
    series: dict[str, dict[str, tuple]] = {}
    for model in args.model or MODELS:
        print(f"\n== {model} ==")
        print(f"  {'policy':18s} {'avg ms':>8} {'p99 ms':>8} {'mean batch':>10} {'SLA viol':>8} {'energy/req':>10}")
        for policy in POLICIES:
            reqs, batches, pol = run(model, policy, arrivals, sla, args.scale)
            lat = [r.latency for r in reqs]
            avg = statistics.fmean(lat)
            p99 = percentile(lat, 99)
            mean_b = statistics.fmean(b for _, b in batches)
            viol = sum(1 for r in reqs if r.finish > r.deadline) / len(reqs)
            label = parse_policy(policy).label
            mj, _ = per_request(pol.energy_j, sum(1 for r in reqs if r.status.name == "OK"))
            results[(model, label)] = {"avg": avg, "p99": p99, "batch": mean_b, "viol": viol, "mj": mj}
            series.setdefault(model, {})[label] = (
                bins([(r.arrival, r.latency * 1e3) for r in reqs], 1.0, args.duration)[1],
                bins([(t, float(b)) for t, b in batches], 1.0, args.duration)[1],
                getattr(pol, "history", None))
            print(f"  {label:18s} {avg * 1e3:8.2f} {p99 * 1e3:8.2f} {mean_b:10.2f} {viol * 100:7.1f}% {'n/a' if mj != mj else f'{mj:.3g} mJ':>10}")
        m, a, d = (results[(model, k)]["avg"] for k in ("BatchMonitor", "AdHoc", "MaxBatchDeadline"))
        print(f"  BatchMonitor / AdHoc average latency = {m / a:.3f}x (goal <= 1.1x); "
              f"MaxBatchDeadline / BatchMonitor = {d / m:.1f}x (goal >= 10x; the seed reports 14x); "
              f"mean batch {results[(model, 'BatchMonitor')]['batch']:.2f} vs AdHoc "
              f"{results[(model, 'AdHoc')]['batch']:.2f}")
    if not args.no_plots:
        name = "monitor_timeseries.png" if args.scale == 1 else f"monitor_timeseries_x{args.scale:g}.png"
        plot(trace, series, args.out / name, args.duration)
        print(f"\nwrote {args.out / name}")
    return 0


def plot(trace, series, path: Path, duration: float) -> None:
    plt = pyplot()
    if plt is None:
        print(f"no plot {path}: matplotlib is not installed (pip install -e '.[plots]')")
        return
    models = list(series)
    fig, axes = plt.subplots(3, len(models), figsize=(6 * len(models), 9), sharex=True, squeeze=False)
    for col, model in enumerate(models):
        ax = axes[0][col]
        ax.step([t for t, _ in trace], [r for _, r in trace], where="post", color="black", label="offered rate")
        ax.set_ylabel("requests/s")
        hist = series[model]["BatchMonitor"][2]
        if hist:
            ax2 = ax.twinx()
            ax2.step([h[0] for h in hist], [h[2] for h in hist], where="post", color="tab:red",
                     label="preferred batch size")
            ax2.set_ylabel("BatchMonitor preferred batch size", color="tab:red")
        ax.set_title(f"{model}: offered rate and BatchMonitor's choice")
        xs = list(range(len(next(iter(series[model].values()))[0])))
        for label, (lat, bs, _) in series[model].items():
            axes[1][col].plot(xs, lat, label=label, linewidth=1)
            axes[2][col].plot(xs, bs, label=label, linewidth=1)
        axes[1][col].set_yscale("log")
        axes[1][col].set_ylabel("mean latency per second (ms)")
        axes[2][col].set_ylabel("mean executed batch size")
        axes[2][col].set_xlabel("time (s)")
        axes[1][col].legend(fontsize=7)
    fig.tight_layout()
    save(fig, path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
