"""Scheduler-core speed: decision cost, simulator throughput, and the paper-sized sweep.

    python -m benchmarks.bench_scheduler            # all three parts (the sweep takes a few minutes)
    python -m benchmarks.bench_scheduler --quick    # decision cost and simulator throughput only
    python -m benchmarks.bench_scheduler --json docs/data/bench_scheduler.json   # also write every figure as JSON

Each figure is printed next to a baseline measured in the same run, and as a ratio to its goal:
decision <= 20 us with 64 requests queued; >= 100,000 simulated stage executions/s on one core; the paper-sized
sweep (3 models x 8 rates x 6+ policies x 20 seeds) in < 10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import platform
import statistics
import sys
import time


from benchmarks.harness import git_commit
from lazybatch.batcher import GraphBatching, LazyBatching, OracleLazyBatching, Request, Scheduler
from lazybatch.batcher.decisions import DecisionLog
from lazybatch.batcher.interfaces import StageJob
from lazybatch.batcher.lengths import LengthHistogram
from lazybatch.formats.histograms import shipped_histogram
from lazybatch.simulator import paper_tables, sweep, workload
from lazybatch.simulator.engine import Simulation


class _Clock:
    t = 1.0

    def now(self):
        return self.t


def decision_cost(policy_factory, sla: float, queued: int = 64, trials: int = 3000) -> tuple[float, float]:
    """Median ns of (a) next_job at a stage boundary with ``queued`` requests in InfQ and a sub-batch in flight,
    (b) the whole boundary: job_done of the finished stage + next_job."""
    table = paper_tables.resnet50()
    nxt, boundary = [], []
    for _ in range(trials):
        policy = policy_factory()
        sched = Scheduler(table, policy, _Clock(), log=DecisionLog())
        sched.arrive((Request(0, 0.9, sla=sla),))  # in flight: one request running stage 0
        job: StageJob = sched.schedule().job
        for i in range(1, queued + 1):
            sched.arrive((Request(i, 0.95 + i * 1e-5, sla=sla),))
        t0 = time.perf_counter_ns()
        policy.job_done(job, None, 1.0)
        t1 = time.perf_counter_ns()
        policy.next_job(1.0)
        t2 = time.perf_counter_ns()
        nxt.append(t2 - t1)
        boundary.append(t2 - t0)
    return statistics.median(nxt), statistics.median(boundary)


def bare_event_loop(n: int) -> float:
    """Events/s of a heap-based loop that does nothing else: the floor any Python simulator stands on."""
    heap: list = []
    t0 = time.perf_counter()
    t = 0.0
    for i in range(n):
        heapq.heappush(heap, (t + 1e-4, 0, i, None, None))
        t = heapq.heappop(heap)[0]
    return n / (time.perf_counter() - t0)


def sim_throughput(model: str, policy_factory, rate: float, n: int) -> tuple[float, int]:
    table = paper_tables.shipped_table(model)
    arr = workload.poisson(rate, n, 1, graph=table.graph, lengths=LengthHistogram.load(shipped_histogram()))
    reqs = workload.requests(arr, 0.1)
    sim = Simulation(table, policy_factory(), log=DecisionLog(capacity=1, enabled=False))
    t0 = time.perf_counter()
    sim.run(reqs)
    return sim.stage_execs / (time.perf_counter() - t0), sim.stage_execs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the paper-sized sweep")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default="benchmarks/out/paper_sweep")
    ap.add_argument("--json", default=None, metavar="PATH",
                    help="write every figure printed (decision costs, simulator throughputs, sweep wall time) here")
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}")
    record: dict = {"info": {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                             "python": platform.python_version(), "commit": git_commit(), "jobs": args.jobs,
                             "quick": args.quick,
                             "load_before": os.getloadavg(),
                             "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                    "decision_cost": {"queued": 64, "trials": 3000, "table": "resnet50"},
                    "sim_throughput": {}, "sweep": None}

    def finish() -> int:
        record["info"]["load_after"] = os.getloadavg()
        if args.json:
            from pathlib import Path
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
            print(f"\nwrote {args.json}")
        return 0

    print("\n1. One scheduling decision with 64 requests queued (median of 3000, ResNet-50 table)")
    hist = LengthHistogram.load(shipped_histogram())
    g_next, g_bound = decision_cost(lambda: GraphBatching(64, 0.005), 0.1)
    print(f"   baseline GraphB(5) : next_job {g_next / 1e3:6.2f} us   whole boundary {g_bound / 1e3:6.2f} us")
    record["decision_cost"]["GraphB(5)"] = {"next_job_us": g_next / 1e3, "boundary_us": g_bound / 1e3}
    for label, factory, sla in (("LazyB, admits all 64", lambda: LazyBatching(64, length_histogram=hist), 1.0),
                                ("LazyB, slack exhausted", lambda: LazyBatching(64, length_histogram=hist), 2e-3),
                                ("Oracle, admits all 64", lambda: OracleLazyBatching(64, length_histogram=hist), 1.0)):
        n, b = decision_cost(factory, sla)
        record["decision_cost"][label] = {"next_job_us": n / 1e3, "boundary_us": b / 1e3,
                                          "boundary_over_graphb": b / g_bound, "over_goal_20us": b / 20e3}
        print(f"   {label:22s}: next_job {n / 1e3:6.2f} us   whole boundary {b / 1e3:6.2f} us   "
              f"= {b / g_bound:4.1f}x GraphB, {b / 20e3:4.2f}x the 20 us goal")

    print("\n2. Simulator throughput, stage executions per second on one core")
    floor = bare_event_loop(200_000)
    print(f"   baseline: bare heapq event loop {floor:,.0f} events/s")
    record["sim_throughput"]["bare_heapq_events_per_s"] = floor
    for model, label, factory, rate, n in (
            ("resnet50", "LazyB", lambda: LazyBatching(64, length_histogram=hist), 1000, 20000),
            ("resnet50", "Serial", lambda: sweep.parse_policy("serial").build(), 800, 20000),
            ("gnmt", "LazyB", lambda: LazyBatching(64, length_histogram=hist), 500, 5000),
            ("gnmt", "GraphB(5)", lambda: GraphBatching(64, 0.005), 500, 5000)):
        rate_s, execs = sim_throughput(model, factory, rate, n)
        record["sim_throughput"][f"{model} {label} {rate} req/s"] = {
            "stage_execs_per_s": rate_s, "stage_execs": execs, "requests": n, "over_bare_loop": rate_s / floor,
            "over_goal_100k": rate_s / 1e5}
        print(f"   {model:9s} {label:9s} at {rate:5d} req/s: {rate_s:10,.0f} stage execs/s ({execs} execs) "
              f"= {rate_s / floor:4.2f}x the bare loop, {rate_s / 1e5:4.1f}x the 100k/s goal")

    if args.quick:
        return finish()
    policies = list(sweep.PAPER_POLICIES)
    models = list(paper_tables.PAPER_MODELS)
    specs = sweep.plan(models, policies, sweep.PAPER_RATES, [0.1], 20, requests=1000, keep_latencies_at=1000)
    print(f"\n3. Paper-sized sweep: {len(models)} models x {len(sweep.PAPER_RATES)} rates x {len(policies)} policies "
          f"x 20 seeds = {len(specs)} runs of 1000 requests on {args.jobs} processes")
    t0 = time.perf_counter()
    rows = sweep.run(specs, jobs=args.jobs, progress=sys.stderr.isatty())
    wall = time.perf_counter() - t0
    summary = sweep.summarize(rows)
    comps = sweep.compare(summary)
    from lazybatch.simulator import report
    report.print_tables(summary, comps, sys.stdout, header="1000 requests/run, ")
    from pathlib import Path
    out = Path(args.out)
    report.write_results(out, rows, summary, comps, {"runs": len(specs), "wall_s": wall})
    try:
        from lazybatch.simulator import plots
        plots.latency_vs_rate(summary, out / "fig12_latency_vs_rate.png")
        plots.throughput_vs_rate(summary, out / "fig13_throughput_vs_rate.png")
        plots.latency_cdf(rows, summary, 1000, out / "fig14_latency_cdf.png")
    except Exception as e:  # plots are optional here
        print(f"(plots skipped: {e})")
    worker_s = sum(r['wall_s'] for r in rows if r['sla_ms'] == 100)
    print(f"\n   sweep wall time {wall:.1f} s = {wall / 600:.2f}x the 10-minute goal "
          f"({worker_s:.1f} s of simulation in the workers)")
    record["sweep"] = {"models": models, "rates": list(sweep.PAPER_RATES), "policies": [str(p) for p in policies],
                       "seeds": 20, "requests_per_run": 1000, "runs": len(specs), "jobs": args.jobs,
                       "wall_s": wall, "over_goal_600s": wall / 600, "worker_s": worker_s, "out": str(args.out)}
    return finish()


if __name__ == "__main__":
    sys.exit(main())
