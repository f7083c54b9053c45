"""What eager costs over Triton's batcher under load, and which of its parts costs it: a diagnostic, not a benchmark.

    python -m benchmarks.probes.probe_loaded_cost --model mobilenet --loads 0.7,0.9 --reps 3 --driver perf

The loaded counterpart of probe_idle_cost.py. Where eager answers every request inline (docs/results/default.md:
the same whole-graph passes on the same groups as Triton's batcher at 0 ms), what it loses under load is what its
stub does besides those passes, on the cores onnxruntime needs. One tritonserver serves Triton 0 ms (twice: the
second copy is the noise floor), eager, and eager with one of its parts switched off (probe_idle_cost.py's
VARIANTS); at each load every repetition runs each of them once, taking turns (bench_default.py's cells, either
driver). Per load and variant: the mean average latency, and Triton 0 ms / the variant paired by repetition, mean
[min-max].
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from benchmarks.bench_default import PERF_INPUT_DATA, SLA_MULTIPLE, drive_load, drive_perf
from benchmarks.harness import command_line, fmt, machine_meta, spread, static_t1, write_json, served
from benchmarks.probes.probe_idle_cost import VARIANTS
from tqdm import tqdm

from lazybatch import repo as repo_mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mobilenet", choices=repo_mod.MODEL_KINDS)
    ap.add_argument("--loads", default="0.7,0.9", help="fractions of the batch-1 rate")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0, help="seconds of load per cell")
    ap.add_argument("--driver", choices=("load", "perf"), default="perf")
    ap.add_argument("--variants", default="triton_0us,triton_0us_twin,eager,eager_nometrics",
                    help="suffixes of probe_idle_cost.py's VARIANTS, comma-separated")
    ap.add_argument("--out", default="lazybatch-results/loaded-cost")
    ap.add_argument("--json", default=None, help="also write the cells and figures here (raw data for the docs)")
    args = ap.parse_args(argv)
    names = args.variants.split(",")
    if "triton_0us" not in names or any(n not in VARIANTS for n in names):
        ap.error(f"--variants: triton_0us and any of {', '.join(VARIANTS)}")
    for n in names:
        if VARIANTS[n][1]:
            repo_mod.POLICY_PARAMETERS[n] = VARIANTS[n][1]
    out = Path(args.out)
    repo = repo_mod.build_default_repository(out / "repos" / args.model, kind=args.model,
                                             work=out / "build" / args.model,
                                             policies={n: VARIANTS[n][0] for n in names}, profile_reps=5)
    loads = [float(v) for v in args.loads.split(",")]
    cells = []
    with served(repo, out / f"tritonserver_{args.model}.log") as server:
        url = server.endpoints.grpc
        t1 = static_t1(url, args.model)
        sla_ms = SLA_MULTIPLE * t1 * 1e3
        for f in loads:
            for k in tqdm(range(args.reps), desc=f"{args.model} {f:.0%}", unit="rep"):
                for n in (names if k % 2 == 0 else list(reversed(names))):
                    model = f"{args.model}_{n}"
                    c = (drive_load(url, model, f / t1, args.duration, sla_ms, seed=100 * k) if args.driver == "load"
                         else drive_perf(url, model, f / t1, args.duration, sla_ms, seed=100 * k, out=out,
                                         input_data=PERF_INPUT_DATA.get(args.model)))
                    cells.append({"load": f, "rep": k, "variant": n, **c})
                    time.sleep(0.3)
    figures = {}
    print(f"{args.model} ({args.driver} driver): t1 {t1 * 1e3:.2f} ms; Triton 0 ms avg / variant avg, mean [min-max] "
          f"over {args.reps} repetitions")
    for f in loads:
        by = {(c["rep"], c["variant"]): c for c in cells if c["load"] == f}
        row = {}
        for n in names:
            ratio = spread([by[k, "triton_0us"]["avg_ms"] / by[k, n]["avg_ms"] for k in range(args.reps)])
            row[n] = {"avg_ms": statistics.fmean(by[k, n]["avg_ms"] for k in range(args.reps)), "ratio": ratio}
        figures[f"{f:g}"] = row
        print(f"  {f:.0%}: " + "; ".join(f"{n} {v['avg_ms']:.2f} ms {fmt(v['ratio'])}" for n, v in row.items()))
    if args.json:
        write_json(args.json, {"meta": {**machine_meta(), "command": command_line()}, "model": args.model,
                               "t1_ms": t1 * 1e3, "cells": cells, "figures": figures})
    return 0


if __name__ == "__main__":
    sys.exit(main())
