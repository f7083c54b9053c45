"""Real-server benchmark: LazyBatching vs Triton's dynamic batcher (0/5/20 ms) vs serial on ResNet-50.

    python benchmarks/bench_triton.py                    # the issue's Speed experiment (about 15 minutes)
    python benchmarks/bench_triton.py --duration 5 --fractions 0.1,0.9   # a quick look

One tritonserver serves the default repository (`lazybatch repo default`). The batch-1 service rate mu is measured
first (sequential whole-graph requests); then open-loop Poisson load at fractions of mu, every configuration one
after the other at each rate: resnet50_lazy once per SLA target (it uses the SLA in its decisions), the SLA-unaware
ones once (their violation rate is computed at each SLA from the same latencies). The backend's own counters give
the scheduler overhead per stage (decision + hand-off + tensor concatenation/splitting, excluding onnxruntime).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

from lazybatch.client.api import Client
from lazybatch.client.load import LoadResult, run_load
from lazybatch.repo import build_default_repository
from lazybatch.serving import TritonServer, free_port

BASELINES = ["resnet50_triton_0us", "resnet50_triton_5000us", "resnet50_triton_20000us", "resnet50_serial"]
LAZY = "resnet50_lazy"


def service_time(client: Client, model: str, n: int) -> float:
    x = client.random_inputs(model, 1, seed=0)
    for _ in range(3):
        client.infer(model, x)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        client.infer(model, x, sla_ms=10_000)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def read_stats(stats_dir: Path, model: str, at_least: int = 0, timeout: float = 15.0) -> dict:
    """The backend's counters, written whenever it holds nothing: wait until they cover ``at_least`` requests."""
    p = stats_dir / f"{model}.json"
    end = time.monotonic() + timeout
    data: dict = {}
    while time.monotonic() < end:
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            data = {}
        if data.get("requests", 0) >= at_least and (data or at_least == 0):
            return data
        time.sleep(0.1)
    return data


def violation(r: LoadResult, sla_ms: float) -> float:
    if not r.sent:
        return math.nan
    late = sum(1 for l in r.latencies_ms if l > sla_ms)
    return (late + r.errors) / r.sent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repository", default="model_repository")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of load per configuration and rate")
    ap.add_argument("--fractions", default="0.1,0.4,0.7,0.9,1.2", help="load as fractions of the batch-1 rate")
    ap.add_argument("--slas", default="100,200", help="SLA targets in ms")
    ap.add_argument("--out", default="lazybatch-results/triton-bench")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    fractions = [float(v) for v in args.fractions.split(",")]
    slas = [float(v) for v in args.slas.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stats_dir = out / "stats"
    repo = build_default_repository(args.repository)
    server = TritonServer(repo, http_port=free_port(), grpc_port=free_port(), metrics_port=free_port(),
                          log_file=out / "tritonserver.log", env={"LAZYBATCH_STATS_DIR": str(stats_dir.resolve())})
    print(f"starting tritonserver on {repo} ...", flush=True)
    results: list[dict] = []
    with server:
        url = server.endpoints.grpc
        with Client(url) as c:
            t_whole = service_time(c, "resnet50_triton_0us", 15)
            t_lazy = service_time(c, LAZY, 15)
        mu = 1.0 / t_whole
        print(f"batch-1 latency: whole graph {t_whole * 1e3:.1f} ms, lazy backend {t_lazy * 1e3:.1f} ms; "
              f"service rate {mu:.2f}/s", flush=True)
        for f in fractions:
            rate = f * mu
            runs = [(LAZY, s) for s in slas] + [(m, None) for m in BASELINES]
            for model, sla in runs:
                before = read_stats(stats_dir, model) if model == LAZY else {}
                r = run_load(url, model, rate, args.duration, sla_ms=sla if sla is not None else max(slas),
                             seed=args.seed, timeout_s=60.0, send_sla=sla is not None)
                after = read_stats(stats_dir, model, before.get("requests", 0) + r.sent + 1) if model == LAZY else {}
                overhead = None
                if after and before is not None:
                    runs_n = after.get("stage_runs", 0) - before.get("stage_runs", 0)
                    if runs_n > 0:
                        ov = (after["io_s"] + after["sched_s"]) - (before.get("io_s", 0) + before.get("sched_s", 0))
                        ort_s = after["ort_s"] - before.get("ort_s", 0)
                        overhead = {"per_stage_ms": ov / runs_n * 1e3, "ort_per_stage_ms": ort_s / runs_n * 1e3,
                                    "fraction": ov / ort_s if ort_s else math.nan, "stage_runs": runs_n,
                                    "mean_batch": (sum(int(b) * n for b, n in after["batch_hist"].items()) -
                                                   sum(int(b) * n for b, n in before.get("batch_hist", {}).items()))
                                    / runs_n}
                for s in ([sla] if sla is not None else slas):
                    row = {"fraction": f, "rate": rate, "model": model, "sla_ms": s,
                           "sent": r.sent, "ok": r.ok, "errors": r.errors, "throughput": r.throughput,
                           "avg_ms": r.avg_ms, "p50_ms": r.p50_ms, "p90_ms": r.p90_ms, "p99_ms": r.p99_ms,
                           "violation": violation(r, s), "overhead": overhead}
                    results.append(row)
                print(f"  {f:>4.0%} {rate:6.2f}/s {model:<24} sla={sla or '-'}: sent {r.sent} ok {r.ok} "
                      f"err {r.errors} avg {r.avg_ms:.1f} p99 {r.p99_ms:.1f} ms thr {r.throughput:.2f}/s"
                      + (f" overhead/stage {overhead['per_stage_ms']:.3f} ms ({overhead['fraction']:.1%}), "
                         f"mean sub-batch {overhead['mean_batch']:.2f}" if overhead else ""), flush=True)
                time.sleep(1.0)
    meta = {"t_whole_ms": t_whole * 1e3, "t_lazy_ms": t_lazy * 1e3, "mu": mu, "duration_s": args.duration,
            "fractions": fractions, "slas": slas, "cpu_count": os.cpu_count(),
            "command": " ".join([sys.executable, *sys.argv])}
    (out / "bench.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    table = markdown(results, meta)
    (out / "bench.md").write_text(table)
    print(table)
    plot(results, out / "bench.png")
    return 0


def markdown(results: list[dict], meta: dict) -> str:
    lines = [f"batch-1 whole-graph latency {meta['t_whole_ms']:.1f} ms (service rate {meta['mu']:.2f}/s), lazy "
             f"backend batch-1 {meta['t_lazy_ms']:.1f} ms; {meta['duration_s']:g} s of Poisson load per cell", "",
             "| load | rate/s | SLA ms | model | sent | err | thr/s | avg ms | p50 | p99 | SLA viol | overhead/stage |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in sorted(results, key=lambda r: (r["fraction"], r["sla_ms"], r["model"])):
        ov = r["overhead"]
        ovs = f"{ov['per_stage_ms']:.3f} ms ({ov['fraction']:.1%}), b̄={ov['mean_batch']:.2f}" if ov else ""
        lines.append(f"| {r['fraction']:.0%} | {r['rate']:.2f} | {r['sla_ms']:g} | {r['model']} | {r['sent']} | "
                     f"{r['errors']} | {r['throughput']:.2f} | {r['avg_ms']:.1f} | {r['p50_ms']:.1f} | "
                     f"{r['p99_ms']:.1f} | {r['violation']:.1%} | {ovs} |")
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    slas = sorted({r["sla_ms"] for r in results})
    fig, axes = plt.subplots(2, len(slas), figsize=(6 * len(slas), 8), squeeze=False)
    for j, s in enumerate(slas):
        rows = [r for r in results if r["sla_ms"] == s]
        for model in dict.fromkeys(r["model"] for r in rows):
            rs = sorted((r for r in rows if r["model"] == model), key=lambda r: r["fraction"])
            x = [r["fraction"] * 100 for r in rs]
            axes[0][j].plot(x, [r["avg_ms"] for r in rs], marker="o", label=model)
            axes[1][j].plot(x, [r["violation"] * 100 for r in rs], marker="o", label=model)
        axes[0][j].set_title(f"SLA {s:g} ms")
        axes[0][j].set_ylabel("average latency (ms)")
        axes[0][j].set_yscale("log")
        axes[1][j].set_ylabel("SLA violations (%)")
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xlabel("offered load (% of batch-1 service rate)")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
