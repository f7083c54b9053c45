"""Which of eager's served extras costs it on one model: a diagnostic, not a benchmark.

    python -m benchmarks.probes.probe_eager_variants --model mobilenet --loads 0.4,0.9,1.2,2.0 --reps 5 \
        --json docs/data/eager_variants_mobilenet.json

The static-models page (docs/results/default.md) finds eager behind an identical copy of Triton 0 ms on MobileNet
under both drivers, while in-process its ``execute`` costs the same (probe_execute_cost). Served, eager's stub does
more beside its passes than Triton 0 ms's: the benchmark's statistics file (LAZYBATCH_STATS_DIR, written at quiet
moments), the Triton metrics it pushes every second, and onnxruntime arena memory given back at quiet moments. This
runs bench_default's cells (``--restart``: a fresh server per repetition, each policy in turn) with eager as
configured by default, eager with metrics and memory release off (``eager_quiet``), with each off alone
(``eager_nometrics``, ``eager_norelease``), Triton 0 ms and its identical copy; ``--stats`` keeps the statistics file on (bench_default always has it). Per variant: twin avg / variant avg
per cell, pooled over the cells with the session-draw interval (bench_default.pooled's rule).
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from pathlib import Path

from benchmarks import bench_default
from benchmarks.harness import command_line, judge, machine_meta, write_json

VARIANTS = {"eager": "eager", "eager_quiet": "eager", "eager_nometrics": "eager", "eager_norelease": "eager",
            "triton_0us": "triton:0", "triton_0us_twin": "triton:0"}
QUIET = {"eager_quiet": {"metrics": "false", "memory_release_ms": "0"}, "eager_nometrics": {"metrics": "false"},
         "eager_norelease": {"memory_release_ms": "0"}}
EAGERS = [v for v in VARIANTS if v.startswith("eager")]


def pooled(cells: list[dict], variant: str, draws: int = 4000) -> dict:
    """twin avg / variant avg over every (load, repetition), resampled by repetition (a server: one draw)."""
    by = {(c["load"], c["rep"], c["policy"]): c["avg_ms"] for c in cells}
    units: dict[int, list[float]] = {}
    for (f, k, p), avg in by.items():
        if p == variant and (f, k, bench_default.TWIN) in by:
            units.setdefault(k, []).append(math.log(by[f, k, bench_default.TWIN] / avg))
    logs = [d for v in units.values() for d in v]
    lo, hi = bench_default.draw_interval(list(units.values()), draws)
    return {"ratio": math.exp(sum(logs) / len(logs)), "lo": lo, "hi": hi, "draws": len(units),
            "verdict": judge(lo, hi, 1.0)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mobilenet")
    ap.add_argument("--loads", default="0.4,0.9,2.0", help="fractions of the batch-1 rate")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds of load per cell")
    ap.add_argument("--stats", action="store_true", help="keep the statistics file on, as bench_default does")
    ap.add_argument("--out", default="lazybatch-results/eager-variants")
    ap.add_argument("--json", default=None, help="also copy the raw cells and figures here")
    args = ap.parse_args(argv)
    meta = {**machine_meta(), "command": command_line(), "stats_file": args.stats}
    # bench_default's cells with these variants in place of its policies (its module state, this process only)
    bench_default.POLICIES = dict(VARIANTS)
    bench_default.TRITON = ["triton_0us"]
    bench_default.build_default_repository = functools.partial(bench_default.build_default_repository,
                                                               parameters=QUIET)
    if not args.stats:
        start = bench_default.start_server
        bench_default.start_server = lambda repo, log, stats_dir=None: start(repo, log)
    ns = argparse.Namespace(loads=[float(v) for v in args.loads.split(",")], reps=args.reps,
                            duration=args.duration, driver="load", restart=True, perf_arrivals="seeded")
    res = bench_default.bench_model(args.model, ns, Path(args.out))
    figures = {v: pooled(res["cells"], v) for v in EAGERS}
    for v, p in figures.items():
        print(f"{v:16s} twin avg / {v} avg {p['ratio']:.3f} [90% interval {p['lo']:.3f}-{p['hi']:.3f}, "
              f"{p['draws']} draws]: {p['verdict']}")
    data = {"meta": meta, "model": args.model, "variants": VARIANTS, "parameters": QUIET, "figures": figures,
            "result": res}
    write_json(Path(args.out) / "eager_variants.json", data)
    if args.json:
        write_json(args.json, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
