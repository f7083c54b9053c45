"""Where a grouped model's latency goes at light load (docs/colocation.md: at 40% of the device the grouped models met a tight
SLO far less often than ungrouped ones, and the MLP's average was twice its ungrouped figure at a8a79c0).

    python -m benchmarks.probes.probe_device_wait                       # 40% and 70%, equal mix, 3 x 15 s per cell
    python -m benchmarks.probes.probe_device_wait --loads 0.4,0.7 --duration 20

The co-location benchmark's four models (benchmarks/colocation, its built tables reused from
lazybatch-results/colocation/build when there) on one tritonserver, under the device scheduler (``lazybatch``), the
same models ungrouped (``lazybatch_nodevice``), the device scheduler with two onnxruntime threads per model
instead of the lanes' share of the cores (``lazybatch_wide``: ``intra_op_threads: "2"``, a group of its own) and
Triton 0 ms, each driven at the same seeded Poisson arrivals in turn. Per model and configuration it prints the average latency and, from the backend's statistics file
(LAZYBATCH_STATS_DIR, read before and after each cell), per request: the device grants, the wait for them, the
device seconds held, onnxruntime's seconds, the jobs and spans run; what the latency holds beyond those is the
hand-offs between processes and threads. A probe, not a results page: it prints and writes OUT/probe.json."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from benchmarks.colocation.mix import KINDS, mixes, rates_for
from benchmarks.colocation import repo as R
from benchmarks.colocation.drive import load_cell
from benchmarks.harness import command_line, machine_meta, seq2seq_t1, served, static_t1, write_json

# the device scheduler with every model at the full width of this 2-core machine, two lanes still: each stage job
# then shares the cores with the other lane's (no spin-wait is turned off: what a user setting intra_op_threads gets)
WIDE = R.Config("lazybatch_wide", "eager", lambda kind: {"device_group": "colocated_wide", "intra_op_threads": "2"})
CONFIGS = ("lazybatch", "lazybatch_wide", "lazybatch_nodevice", "triton_0us")


def config(name: str) -> R.Config:
    return WIDE if name == WIDE.suffix else R.CONFIGS[name]


def stats(folder: Path, name: str) -> dict:
    p = folder / f"{name}.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return {}


def delta(after: dict, before: dict) -> dict[str, float]:
    """Per-cell counts from two reads of a statistics file (the file holds totals since the model loaded)."""
    def get(d: dict, *keys: str) -> float:
        for k in keys:
            d = d.get(k, {}) if isinstance(d, dict) else {}
        return float(d) if isinstance(d, (int, float)) else 0.0

    out = {k: get(after, k) - get(before, k) for k in ("requests", "stage_runs", "span_runs", "inline_runs", "ort_s",
                                                       "sched_s", "io_s")}
    for k in ("device_s", "wait_s", "grants"):
        out[k] = get(after, "device", k) - get(before, "device", k)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loads", default="0.4,0.7", help="fractions of the device's capacity (0.4,0.7)")
    ap.add_argument("--mix", choices=("equal", "skewed"), default="equal")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration", type=float, default=15.0, help="seconds of arrivals per cell (15)")
    ap.add_argument("--out", default="lazybatch-results/probe-device-wait")
    ap.add_argument("--data", default=None, help="also copy the raw results here (docs/data/...)")
    ap.add_argument("--build-from", default="lazybatch-results/colocation/build",
                    help="split and profiled models to reuse (the co-location benchmark's)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    build = out / "build"
    src = Path(args.build_from).resolve()
    if not build.exists() and src.is_dir():
        build.symlink_to(src, target_is_directory=True)
    main_repo, _ = R.build(out, KINDS, [config(c) for c in CONFIGS])
    stats_dir, arbiters = out / "stats", out / "arbiters"
    shutil.rmtree(stats_dir, ignore_errors=True)  # a file of an earlier server's stub holds its totals, not ours
    arbiters.mkdir(exist_ok=True)
    loads = [float(x) for x in args.loads.split(",")]
    res: dict = {"meta": {**machine_meta(), "command": command_line()}, "cells": [],
                 "settings": {"mix": args.mix, "reps": args.reps, "duration_s": args.duration}}
    with served(main_repo, out / "tritonserver.log", stats_dir=stats_dir,
                env={"LAZYBATCH_ARBITER_DIR": str(arbiters)}) as server:
        url = server.endpoints.grpc
        t1 = {k: 1e3 * (seq2seq_t1(url, server.endpoints.http, f"{k}_triton_0us", 20) if R.is_decoder(k)
                        else static_t1(url, k)) for k in KINDS}
        print("t1 ms: " + ", ".join(f"{k} {v:.1f}" for k, v in t1.items()), flush=True)
        shares = mixes([args.mix], KINDS, "mobilenet")[args.mix]
        for load in loads:
            rates = rates_for(load, shares, t1)
            for rep in range(args.reps):
                order = CONFIGS if rep % 2 == 0 else CONFIGS[::-1]
                for cfg in order:
                    names = {k: R.model_name(k, config(cfg)) for k in KINDS}
                    before = {k: stats(stats_dir, n) for k, n in names.items()}
                    c = load_cell(url, names, rates, args.duration, rep, {k: 10 * t1[k] for k in KINDS}, t1)
                    time.sleep(1.0)  # the statistics file is written when the scheduler goes idle
                    per = {k: {"avg_ms": c["models"][k]["avg_ms"], "p50_ms": c["models"][k]["p50_ms"],
                               "ok": c["models"][k]["ok"],
                               **delta(stats(stats_dir, names[k]), before[k])} for k in KINDS}
                    res["cells"].append({"load": load, "rep": rep, "config": cfg, "models": per})
                    print(f"{load:.0%} rep {rep} {cfg}: " + "; ".join(
                        f"{k} {v['avg_ms']:.1f} ms" for k, v in per.items()), flush=True)
                    time.sleep(1.5)
    res["t1_ms"] = t1
    write_json(out / "probe.json", res)
    if args.data:
        write_json(args.data, res)
    print(report(res))
    return 0


def report(res: dict) -> str:
    """Per model and configuration, means over the repetitions, per request."""
    lines = ["model | config | load | avg ms | p50 ms | grants/req | wait ms/req | device ms/req | ort ms/req | "
             "jobs/req | spans/req | inline/req"]
    for load in sorted({c["load"] for c in res["cells"]}):
        for k in KINDS:
            for cfg in CONFIGS:
                cs = [c["models"][k] for c in res["cells"] if c["load"] == load and c["config"] == cfg]
                if not cs:
                    continue

                def per_req(key: str, scale: float = 1.0) -> float:
                    n = sum(c["requests"] for c in cs)
                    return sum(c[key] for c in cs) / n * scale if n else float("nan")

                avg = statistics.fmean(c["avg_ms"] for c in cs)
                p50 = statistics.fmean(c["p50_ms"] for c in cs)
                lines.append(f"{k} | {cfg} | {load:.0%} | {avg:.1f} | {p50:.1f} | {per_req('grants'):.2f} | "
                             f"{per_req('wait_s', 1e3):.2f} | {per_req('device_s', 1e3):.2f} | "
                             f"{per_req('ort_s', 1e3):.2f} | {per_req('stage_runs'):.2f} | "
                             f"{per_req('span_runs'):.2f} | {per_req('inline_runs'):.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
