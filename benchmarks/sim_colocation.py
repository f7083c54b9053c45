"""The LazyBatching paper's co-location experiment on the shipped tables, simulated, over several seeds.

    python -m benchmarks.sim_colocation                       # 5 seeds x 2,000 requests per run (~4 min on 2 cores)
    python -m benchmarks.sim_colocation --seeds 2 --requests 400

Four models (resnet50, bert_base, gnmt, transformer: lazybatch/simulator/paper_tables.py) on one device, each
model's SLA 10 x its batch-1 latency alone, aggregate load 40-120% of the device's batch-1 capacity, requests split
equally or 70% to resnet50. lazybatch's default (eager) on the shared device (batcher/device.py) against Triton's
dynamic batcher per model (graph:0 and graph:5) under processor sharing and behind one rate-limiter token, and
against eager per model without the shared device (lazybatch/simulator/colocated_experiment.py). Prints the tables
and the headline ratios, best baseline / co-located seed by seed with their spread (mean [min-max]), at 70-120%
(the goals of docs/colocation.md) and over every load; writes the raw runs with the machine and commit as JSON.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.harness import ROOT, command_line, machine_meta, write_json
from lazybatch.simulator import colocated_experiment as co

GOAL_LOADS = (0.7, 1.0, 1.2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=2000, help="requests per run, across the models")
    ap.add_argument("--loads", default="0.4,0.7,1.0,1.2")
    ap.add_argument("--sla-multiple", type=float, default=10.0)
    ap.add_argument("--json", type=Path, default=ROOT / "docs" / "data" / "sim_colocation.json")
    args = ap.parse_args(argv)
    loads = [float(x) for x in args.loads.split(",") if x.strip()]
    meta = machine_meta()
    t0 = time.perf_counter()
    exp = co.Experiment(requests=args.requests, sla_multiple=args.sla_multiple)
    result = exp.sweep(loads, ["equal", "skewed"], args.seeds)
    wall = time.perf_counter() - t0
    print(co.format_tables(result))
    heads = {}
    for name, base in (("vs_best_graph", co.GRAPH_BASELINES), ("vs_eager_ps", ("eager_ps",))):
        heads[name] = {"goal_loads": co.headline(result, GOAL_LOADS, baselines=base),
                       "all_loads": co.headline(result, baselines=base)}
    print(f"\nheadline, {args.seeds} seeds x loads {', '.join(f'{x:.0%}' for x in GOAL_LOADS)} "
          "(ratio > 1 favours the co-located default):")
    for name, h in heads.items():
        for mix, metrics in h["goal_loads"].items():
            print(f"  {name} {mix}: " + ", ".join(f"{m} {s['mean']:.2f}x [{s['min']:.2f}-{s['max']:.2f}]"
                                                 for m, s in metrics.items()))
    write_json(args.json, {"meta": meta, "command": command_line(), "wall_s": wall, "headline": heads,
                           "result": result})
    print(f"\n{len(result['cells'])} cells in {wall:.0f} s; wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
