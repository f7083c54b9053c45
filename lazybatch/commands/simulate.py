"""``lazybatch simulate``: run batching policies on latency tables with a virtual clock."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.policies.registry import policy_choices
from lazybatch.commands import comma_list

DEFAULT_RATES = "16,128,500,1000,2000"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate", help="simulate batching policies on latency tables (the paper's experiments)",
        description="Runs the scheduler core on a virtual clock: open-loop Poisson arrivals (or a trace) against "
                    "a latency table, for every policy, rate, SLA target and seed; prints average/p99 latency, "
                    "throughput and SLA violations, LazyB against the best GraphB(N), and writes CSV/JSON and "
                    "plots shaped like the paper's Fig. 12-15.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", action="append", metavar="NAME|TABLE",
                   help="a shipped model (resnet50, gnmt, transformer, vgg19, bert_base) or a latency table .json/.csv; repeatable "
                        "(default: the paper's three: resnet50, gnmt, transformer)")
    p.add_argument("--policy", action="append", metavar="SPEC",
                   help=f"{policy_choices()} (graph:N: GraphB(N), N ms window; parameters as policy:key=value,..., "
                        "e.g. graph:max_queue_delay_microseconds=U,preferred_batch_size=4/8); repeatable (default: "
                        "Serial, GraphB(5,25,50,75,95), LazyB, Oracle)")
    p.add_argument("--rate", default=DEFAULT_RATES, help="arrival rates, requests/s, comma-separated")
    p.add_argument("--sla-ms", default="100", help="SLA targets in ms, comma-separated (several: Fig. 15)")
    p.add_argument("--seeds", type=int, default=3, help="runs per point, averaged (the paper uses 20)")
    p.add_argument("--requests", type=int, default=1000, help="requests per run")
    p.add_argument("--max-batch-size", type=int, default=None,
                   help="maximum batch size for graph/lazy/oracle (default 64, as in the paper)")
    p.add_argument("--dec-timesteps-coverage", type=float, default=0.9,
                   help="fraction of the length histogram that dec_timesteps covers (Alg. 1's N%%)")
    p.add_argument("--length-histogram", metavar="FILE",
                   help="output-length histogram (.json/.csv) for seq2seq models (default: the shipped WMT-like one)")
    p.add_argument("--trace", metavar="CSV", help="replay arrivals from a trace (arrival_s[,enc_steps,dec_steps,"
                                                  "sla_ms]) instead of Poisson arrivals")
    p.add_argument("--paper", action="store_true",
                   help="the paper-sized sweep: rates 16..2000 (8), 20 seeds (overrides --rate and --seeds)")
    p.add_argument("--cdf-rate", type=float, default=None,
                   help="rate whose latency CDF is plotted (default: the highest rate <= 1000)")
    p.add_argument("--max-queue-size", type=int, default=0, help="admission control: most requests held; more are "
                   "rejected (counted as SLA violations; default 0: unbounded)")
    p.add_argument("--timeout-action", type=str.upper, choices=("REJECT", "DELAY"), default="DELAY",
                   help="REJECT: refuse requests whose deadline cannot be met; DELAY: serve them late (default)")
    p.add_argument("--out", type=Path, default=Path("lazybatch-results"), help="directory for CSV/JSON/plots")
    p.add_argument("--no-plots", action="store_true", help="skip the matplotlib plots")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument("--explain", type=int, default=0, metavar="N",
                   help="instead of a sweep, run the first model/policy/rate once and print its first N decisions")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    c = p.add_argument_group("co-located models (--colocate)")
    c.add_argument("--colocate", action="store_true",
                   help="instead of a sweep, the paper's co-location experiment: the --model models (default "
                        "resnet50, bert_base, gnmt, transformer) on one device, lazybatch's default on the shared "
                        "device against per-model graph batching (processor sharing, and Triton's rate-limiter "
                        "token) and per-model eager without it; --requests per run across models, --seeds runs")
    c.add_argument("--load", default="0.4,0.7,1.0,1.2",
                   help="aggregate loads, fractions of the device's batch-1 capacity (sum of rate x t1)")
    c.add_argument("--mix", default="equal,skewed", help="request shares: equal, skewed (the first model 70%%)")
    c.add_argument("--sla-multiple", type=float, default=10.0, help="each model's SLA, a multiple of its t1")
    c.add_argument("--lag-ms", type=float, default=20.0,
                   help="the shared device's fairness bound: weighted device time one model may run ahead of a "
                        "waiting one (batcher/device.py)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lazybatch.simulator import paper_tables, plots, report, sweep

    models = args.model or list(paper_tables.PAPER_MODELS)
    policies = args.policy or list(sweep.PAPER_POLICIES)
    rates = list(sweep.PAPER_RATES) if args.paper else comma_list(args.rate, "rate")
    seeds = 20 if args.paper else args.seeds
    slas = [s / 1e3 for s in comma_list(args.sla_ms, "sla_ms")]
    if args.requests < 1:
        raise ConfigError(f"--requests must be at least 1, got {args.requests}", field="requests")
    if args.jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {args.jobs}", field="jobs")
    for r in rates:
        if not r > 0:
            raise ConfigError(f"arrival rates must be positive, got {r:g}", field="rate")
    if args.colocate:
        return _colocate(args)
    if args.explain:
        return _explain(args, models[0], policies[0], rates[0], slas[0])
    cdf_rate = args.cdf_rate
    if cdf_rate is None:
        below = [r for r in rates if r <= 1000]
        cdf_rate = max(below) if below else min(rates)
    specs = sweep.plan(models, policies, rates, slas, seeds, requests=args.requests,
                       max_batch_size=args.max_batch_size, dec_timesteps_coverage=args.dec_timesteps_coverage,
                       length_histogram=args.length_histogram, trace=args.trace,
                       keep_latencies_at=None if args.trace else cdf_rate, max_queue_size=args.max_queue_size,
                       timeout_action=args.timeout_action)
    if args.trace:
        rates, cdf_rate = [0.0], 0.0
    print(f"lazybatch simulate: {len(models)} model(s) x {len(policies)} policies x {len(rates)} rate(s) x "
          f"{len(slas)} SLA target(s) x {seeds} seed(s) = {len(specs)} runs of "
          f"{'the trace' if args.trace else f'{args.requests} requests'} on {args.jobs} process(es)", flush=True)
    t0 = time.perf_counter()
    rows = sweep.run(specs, jobs=args.jobs, progress=not args.quiet and sys.stderr.isatty())
    wall = time.perf_counter() - t0
    summary = sweep.summarize(rows)
    comps = sweep.compare(summary)
    report.print_tables(summary, comps, sys.stdout,
                        header=f"{'trace' if args.trace else f'{args.requests} requests/run'}, ")
    config = {"models": models, "policies": policies, "rates": rates, "sla_ms": [s * 1e3 for s in slas],
              "seeds": seeds, "requests": args.requests, "max_batch_size": args.max_batch_size,
              "dec_timesteps_coverage": args.dec_timesteps_coverage, "trace": args.trace,
              "length_histogram": args.length_histogram, "wall_s": wall, "runs": len(specs),
              "max_queue_size": args.max_queue_size, "timeout_action": args.timeout_action}
    files = report.write_results(args.out, rows, summary, comps, config)
    if not args.no_plots:
        files += [plots.latency_vs_rate(summary, args.out / "fig12_latency_vs_rate.png"),
                  plots.throughput_vs_rate(summary, args.out / "fig13_throughput_vs_rate.png")]
        for f in (plots.latency_cdf(rows, summary, cdf_rate, args.out / "fig14_latency_cdf.png"),
                  plots.violation_vs_sla(summary, cdf_rate if len(rates) > 1 else rates[0],
                                         args.out / "fig15_sla_violation.png")):
            if f is not None:
                files.append(f)
    print(f"\n{len(specs)} runs in {wall:.1f} s; wrote {', '.join(str(f) for f in files)}")
    return 0


def _explain(args: argparse.Namespace, model: str, policy: str, rate: float, sla: float) -> int:
    from lazybatch.batcher.decisions import DecisionLog
    from lazybatch.batcher.policies.spec import parse_policy
    from lazybatch.simulator import sweep, workload
    from lazybatch.simulator.engine import Simulation

    table = sweep.load_table(model)
    hist = sweep.load_histogram(args.length_histogram)
    pol = parse_policy(policy).build(max_batch_size=args.max_batch_size, length_histogram=hist,
                                     dec_timesteps_coverage=args.dec_timesteps_coverage)
    arrivals = workload.load_trace(args.trace) if args.trace else \
        workload.poisson(rate, args.requests, 0, graph=table.graph, lengths=hist)
    reqs = workload.requests(arrivals, sla)
    log = DecisionLog()
    from lazybatch.batcher.admission import QueuePolicy

    Simulation(table, pol, log=log, queue_policy=QueuePolicy(args.max_queue_size, args.timeout_action)).run(reqs)
    print(f"{table.name} under {pol.describe()} at {rate:g} requests/s, SLA {sla * 1e3:g} ms: "
          f"{', '.join(f'{k} {v}' for k, v in log.counts.items())}")
    for d in list(log)[:args.explain]:
        print("  " + d.explain())
    return 0


def _colocate(args: argparse.Namespace) -> int:
    import json

    from lazybatch.simulator import colocated_experiment as co

    if args.seeds < 1:
        raise ConfigError(f"--seeds must be at least 1, got {args.seeds}", field="seeds")
    loads = comma_list(args.load, "load")
    for x in loads:
        if not x > 0:
            raise ConfigError(f"loads must be positive, got {x:g}", field="load")
    mix = [m.strip() for m in args.mix.split(",") if m.strip()]
    hist = None
    if args.length_histogram:
        from lazybatch.simulator import sweep

        hist = sweep.load_histogram(args.length_histogram)
    exp = co.Experiment(args.model or list(co.PAPER_FOUR), requests=args.requests, sla_multiple=args.sla_multiple,
                        max_batch_size=args.max_batch_size, lag=args.lag_ms / 1e3, histogram=hist)
    t0 = time.perf_counter()
    result = exp.sweep(loads, mix, 20 if args.paper else args.seeds)
    result["wall_s"] = time.perf_counter() - t0
    print(co.format_tables(result))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "colocation.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{len(result['cells'])} cells in {result['wall_s']:.1f} s; wrote {path}")
    return 0
