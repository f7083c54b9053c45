"""The quickstart's two questions on one tritonserver, in about four minutes on 2 cores (scripts/quickstart.sh).

    python -m benchmarks.quickstart               # after `lazybatch repo default --pair` (its split and profile)
    python -m benchmarks.quickstart --scale 2     # every segment and window twice as long
    python -m benchmarks.quickstart --kinds small=mlp,large=resnet50 --neighbour-load 0.25   # another pair

1. **Is the default level with Triton's batcher on a model alone?** The 8 x 2048 MLP alone at 40% and 70% of its
   batch-1 rate under lazybatch's default (eager, the CPU share on), Triton 0 ms and an identical copy of it, in
   turns of 2 s segments with the same arrivals; 3 repetitions of 3 segments or more (a p99 pools 1,000 requests).
2. **What does a latency-critical model keep beside a busy neighbour?** tiny (~1 ms, SLA 5 ms) at 30% of its rate
   beside the MLP at 50% of its own (80% of the machine by rate x t1) under lazybatch's defaults, Triton 0 ms, its
   copy, and Triton 0 ms with the MLP's stub at nice 10 by hand (the hand-set nice line: the CPU share's lever
   without its aim; it needs CAP_SYS_NICE), in turns of 2 s windows, 3 each per repetition; then tiny alone under
   lazybatch and Triton 0 ms (2 windows each, the same arrivals) once the CPU share has seen the MLP idle.

The rules (benchmarks/harness/method.py, verdict.py): per repetition, the mean of Triton 0 ms's and its copy's
averages / the configuration's (above 1.00 it is faster; ``both``), the interval the range over the repetitions,
judged against 1.00 by the one rule (a range across it is a tie); no verdict where Triton 0 ms / its copy left
0.90-1.10x in any repetition (run longer: ``--scale``). A p99 pools the repetitions, with its request count. A cell
is sustained where its answers' second half has a median at most 1.2x the first half's, 98% of the requests were
answered (client/capacity.py) and 95% inside their window (``cell``); one that is not shows throughput and goodput,
and a ratio that needs it has no verdict. Each window's steal (/proc/stat) is shown, not measured again as the
standing guard (benchmarks/bench_default.py) does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from benchmarks.colocation.pair import PAUSE_S, pair_slas
from benchmarks.harness import command_line, machine_meta, served, write_json
from benchmarks.harness.cli import turned
from benchmarks.harness.measure import load_segment, service_time
from benchmarks.harness.method import measured, segments_for
from benchmarks.harness.page import write_page
from benchmarks.harness.procs import niced, processes
from benchmarks.pair import parse_kinds
from benchmarks.reports.quickstart import (ALONE_SEGMENTS, ALONE_SLA_MS, CONFIGS, HAND, HAND_NICE, LABEL, LARGE_LOAD,
                                           LOADS, PAIR, REPS, SEGMENT_S, SEGMENTS, SMALL_LOAD, WINDOW_S, render)
from lazybatch.client.api import Client
from lazybatch.client.load import run_load
from lazybatch.client.together import model_seed, run_together
from lazybatch.shipped import KIND_SLA_MS, build_default_repository, default_build_dir


def alone(url: str, t1_s: float, *, reps: int, seg_s: float, say: Callable[[str], None]) -> list[dict]:
    """Question 1: every configuration of CONFIGS on the MLP alone at each of LOADS, in turn segment by segment."""
    runs = []
    for f in LOADS:
        rate = f / t1_s
        n = segments_for(rate, seg_s, reps, minimum=3)
        say(f"alone at {f:.0%} ({rate:.0f}/s): {reps} x {n} segments of {seg_s:g} s per configuration")
        for k in range(reps):
            for j in range(n):
                for name in turned(list(CONFIGS), k * n + j):
                    r, m = measured(lambda: run_load(url, f"mlp_{CONFIGS[name]}", rate, seg_s, sla_ms=ALONE_SLA_MS,
                                                   seed=1000 * k + j, timeout_s=60.0, send_sla=False))
                    runs.append({"question": 1, "load": f, "rep": k, "config": name, "model": r.model,
                                 **m, **load_segment(r, seg_s)})
                    time.sleep(0.3)
    return runs


def beside(url: str, kinds: dict[str, str], rates: dict[str, float], slas: dict[str, float], *, reps: int,
           window_s: float, segments: int, hand: bool, server_pid: int, say: Callable[[str], None]) -> list[dict]:
    """Question 2: the pair (role -> kind) at once under each configuration in turn, ``segments`` windows each per
    repetition, the order turning every window; then the small model alone (ALONE_SEGMENTS windows each) once the
    CPU share has seen its neighbour idle. ``rates`` and ``slas`` by role; a window's arrivals are the same for every
    configuration, together and alone."""
    together = [*CONFIGS, *([HAND] if hand else [])]
    alone = ["lazybatch", "Triton 0 ms"]
    roles = list(kinds)  # small first: model_seed(k, 0) is its stream together and alone

    def name(cfg: str, role: str) -> str:
        return f"{kinds[role]}_{CONFIGS['Triton 0 ms' if cfg == HAND else cfg]}"

    def nice(cfg: str):
        if cfg != HAND:
            return contextlib.nullcontext()
        return niced([processes(server_pid)[name(cfg, "large")]], HAND_NICE)

    def drive(mode: str, cfg: str, seconds: float, k: int) -> list:
        if mode == "alone":
            return [run_load(url, name(cfg, "small"), rates["small"], seconds, sla_ms=slas["small"],
                             seed=model_seed(k, 0), timeout_s=60.0, send_sla=False)]
        total = sum(rates.values())
        return run_together(url, {name(cfg, role): rates[role] / total for role in roles}, total, seconds, seed=k,
                            timeout_s=60.0, sla_ms={name(cfg, role): slas[role] for role in roles},
                            send_sla=False)[:2]

    for cfg in together:  # unrecorded: the first second after a load runs slower (arenas growing)
        with nice(cfg):
            drive("together", cfg, 1.0, 10_000)
    runs = []
    say(f"beside: {reps} repetitions of {segments} windows of {window_s:g} s per configuration together, "
        f"{ALONE_SEGMENTS} alone")

    def turn(mode: str, cfg: str, k: int, j: int) -> None:
        with nice(cfg):
            results, m = measured(lambda: drive(mode, cfg, window_s, 100 * k + j))
        for role, r in zip(roles, results):
            runs.append({"question": 2, "mode": mode, "rep": k, "config": cfg, "role": role, "model": r.model,
                         **m, **load_segment(r, window_s)})
        time.sleep(0.3)

    for k in range(reps):
        for j in range(segments):
            for cfg in turned(together, k * segments + j):
                turn("together", cfg, k, j)
        time.sleep(PAUSE_S)  # past the CPU share's window: alone is alone for it too
        for j in range(ALONE_SEGMENTS):
            for cfg in turned(alone, k + j):
                turn("alone", cfg, k, j)
        mine = [r for r in runs if r["rep"] == k and r["role"] == "small"]
        say(f"  rep {k}: {LABEL.get(kinds['small'], kinds['small'])} avg " + ", ".join(
            f"{cfg}{' alone' if mode == 'alone' else ''} "
            f"{np.mean([v for r in mine if (r['mode'], r['config']) == (mode, cfg) for v in r['latencies']]):.1f}"
            for mode, cfg in [*(("together", c) for c in together), *(("alone", c) for c in alone)]) + " ms")
    return runs


def rounded(run: dict) -> dict:
    """A window's record with its times to the microsecond: every latency is kept, at a fifth of the size."""
    return {**run, "latencies": [round(v, 3) for v in run["latencies"]],
            "records": [(round(t, 6), round(lat, 3), ok) for t, lat, ok in run["records"]]}


def main(argv: list[str] | None = None) -> int:
    from lazybatch.backend.os_weights import Privileges

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repository", default="model_repository")
    ap.add_argument("--out", default="lazybatch-results/quickstart")
    ap.add_argument("--scale", type=float, default=1.0, help="every segment and window this many times longer (1)")
    ap.add_argument("--reps", type=int, default=REPS, help=f"repetitions ({REPS})")
    ap.add_argument("--kinds", default=None, metavar="small=KIND,large=KIND",
                    help="question 2's pair of shipped models (default small=tiny,large=mlp)")
    ap.add_argument("--neighbour-load", type=float, default=LARGE_LOAD,
                    help=f"question 2: the large model's load, a fraction of its batch-1 rate ({LARGE_LOAD:g})")
    ap.add_argument("--from-data", default=None, metavar="JSON", help="the tables again from a run's raw data")
    ap.add_argument("--page", default=None, help="--from-data: write them as this results page, its plot in docs/img")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if not (args.scale > 0 and args.reps >= 1 and 0 < args.neighbour_load < 10):
        ap.error("--scale must be above 0, --reps at least 1, --neighbour-load a fraction of the batch-1 rate in "
                 f"(0, 10); got {args.scale:g}, {args.reps}, {args.neighbour_load:g}")
    if args.from_data and not Path(args.from_data).is_file():
        ap.error(f"--from-data: no file {args.from_data} (a run writes {out}/quickstart.json)")
    if args.from_data:
        if not args.page:
            print("\n".join(render(json.loads(Path(args.from_data).read_text()), out / "cdf.png")))
            return 0
        page = Path(args.page)  # docs/results/X.md, its plot docs/img/X_cdf.png
        plot = page.parent.parent / "img" / f"{page.stem}_cdf.png"
        lines = ["# The quickstart's two questions", "", f"Generated by `{command_line()}` from the raw data "
                 f"([{args.from_data}](../../{args.from_data})) of `scripts/quickstart.sh` run from a clean clone; "
                 "what it measures and how it judges: benchmarks/quickstart.py.", "",
                 *render(json.loads(Path(args.from_data).read_text()), plot, f"../img/{plot.name}")]
        print("\n".join(lines))
        write_page(page, lines)
        return 0
    began = time.monotonic()
    phases: dict[str, float] = {}

    def say(text: str) -> None:
        print(f"[{time.monotonic() - began:5.0f} s] {text}", flush=True)

    kinds = parse_kinds(args.kinds) if args.kinds else dict(PAIR)
    slas = pair_slas(kinds)  # by kind: the small model's SLA the shorter, which ranks it first in the CPU share
    served_kinds = list(dict.fromkeys(["mlp", *kinds.values()]))
    repo = out / "repository"  # built from the drop-in repository's split and profile (its build folder): the
    shutil.rmtree(repo, ignore_errors=True)  # drop-in repository keeps only what users serve, not the copies
    for kind in served_kinds:
        build_default_repository(repo, kind=kind, work=default_build_dir(args.repository), log=lambda line: None,
                                 policies={CONFIGS[c]: p for c, p in zip(CONFIGS, ("eager", "triton:0", "triton:0"))},
                                 sla_ms=slas.get(kind, KIND_SLA_MS[kind]))
    models = [f"{kind}_{suffix}" for kind in served_kinds for suffix in CONFIGS.values()]
    hand = Privileges.probe().cap_sys_nice
    start = time.monotonic()
    with served(repo, out / "tritonserver.log") as server:
        url = server.endpoints.grpc
        phases["server start"] = time.monotonic() - start
        say(f"tritonserver ready with {len(models)} models ({phases['server start']:.0f} s)")
        with Client(url) as c:
            t1 = {kind: service_time(c, f"{kind}_triton_0us", 200 if kind != "resnet50" else 20)
                  for kind in served_kinds}
        say("t1: " + ", ".join(f"{LABEL.get(k, k)} {v * 1e3:.1f} ms" for k, v in t1.items()))
        t = time.monotonic()
        runs = alone(url, t1["mlp"], reps=args.reps, seg_s=SEGMENT_S * args.scale, say=say)
        phases["1. alone"] = time.monotonic() - t
        t = time.monotonic()
        if not hand:
            say("no hand-set nice line: raising the neighbour's threads back needs CAP_SYS_NICE (run as root)")
        loads = {"small": SMALL_LOAD, "large": args.neighbour_load}
        rates = {role: loads[role] / t1[kind] for role, kind in kinds.items()}
        runs += beside(url, kinds, rates, {role: slas[kind] for role, kind in kinds.items()}, reps=args.reps,
                       window_s=WINDOW_S * args.scale, segments=SEGMENTS, hand=hand, server_pid=server.proc.pid,
                       say=say)
        phases["2. beside"] = time.monotonic() - t
    phases["total, server start to last table"] = time.monotonic() - start  # the tables take a second more
    meta = {**machine_meta(), "command": command_line(), "pair": kinds, "alone_t1_ms": t1["mlp"] * 1e3,
            "t1_ms": {role: t1[kind] * 1e3 for role, kind in kinds.items()}, "rates": rates,
            "loads": {**loads, "alone": list(LOADS)}, "slas_ms": {role: slas[kind] for role, kind in kinds.items()},
            "reps": args.reps, "scale": args.scale,
            "hand_nice": HAND_NICE if hand else None, "phases_s": phases}
    data = {"meta": meta, "runs": [rounded(r) for r in runs]}
    write_json(out / "quickstart.json", data, compact=True)
    lines = render(data, out / "cdf.png")
    write_page(out / "quickstart.md", lines)
    print("\n" + "\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
