"""Many models, one device, served (docs/colocation.md): four models of different sizes on one tritonserver under
lazybatch's device scheduler (``--lineup device``) or its CPU share (``--lineup cpu_share``), without either, and
under Triton's dynamic batcher (0/5/20 ms, and 0 ms behind Triton's rate limiter), with an identical copy of Triton
0 ms as the noise floor; the simulated ceiling on the same arrivals beside every served figure.

    python -m benchmarks.bench_colocation                   # the device scheduler's run (about 50 min on 2 cores)
    python -m benchmarks.bench_colocation --lineup cpu_share --no-perf   # the CPU share's (about 40 min)
    python -m benchmarks.bench_colocation --quick           # every part once, tiny durations (a few minutes)
    python -m benchmarks.bench_colocation --from-results docs/data/colocation.json --page docs/results/colocation.md

What it measures, in order (benchmarks/colocation/ has the parts):

1. Each model's t1 alone (Triton 0 ms, sequential batch-1 requests; the decoder's mean over its length
   histogram's requests). SLAs are ``--sla-multiple`` x t1; loads are fractions of the device's capacity,
   sum over models of rate x t1 = 1 at 100% (as the simulator defines it).
2. The four-model sweep: each mix (equal request shares, or the CNN 70%) at each load, each repetition running
   every configuration once, taking turns; each model alone (Triton 0 ms, the first repetition's arrivals) for its
   p99 alone.
3. The same at one cell set (70%, equal) under perf_analyzer, one process per model at once.
4. The pair: the small model at 30% of its batch-1 rate beside the large one at 110% of its own, and each alone.
5. A high-priority model beside best-effort ones, and it alone, under each configuration that can say priority.

Then the simulator replays every load-driver cell's arrivals (simulate.py), the figures and verdicts are computed
(figures.py) and the page is written (page.py) from the raw data, which goes to OUT/colocation.json (``--data``
copies it, e.g. into docs/data/).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from tqdm import tqdm

from benchmarks.colocation import repo as R
from benchmarks.colocation.drive import alone_cell, load_cell, perf_cell
from benchmarks.colocation.mix import KINDS, PAIR, PRIO, mixes, rates_for
from benchmarks.colocation.page import plots, render
from benchmarks.colocation.simulate import Tables, simulate
from benchmarks.harness import command_line, machine_meta, seq2seq_t1, served, static_t1, write_json
from benchmarks.harness.page import write_page
from lazybatch.batcher.cpu_rank import BEST_EFFORT, LATENCY_CRITICAL
from lazybatch.batcher.errors import ConfigError

PAUSE_S = 0.5


def estimate(args: argparse.Namespace) -> float:
    """Seconds the run should take on a quiet 2-core machine (servers, t1, cells with their drain and pause)."""
    n_cfg, cell = len(R.LINEUPS[args.lineup].configs), args.duration + 3.0
    sweep = len(args.mixes) * len(args.loads) * (args.reps * n_cfg * cell + len(KINDS) * (args.duration + 1.5))
    perf = 0 if args.no_perf else args.reps * n_cfg * (3 * max(1.0, args.duration / 3, 3.5) + 5)
    pair = args.reps * (n_cfg + 4) * (args.duration + 2.0)
    prio = args.reps * 2 * len(prio_lineup(args.lineup, "mobilenet")) * cell
    return 150 + sweep + perf + pair + prio + 30


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lineup", choices=sorted(R.LINEUPS), default="device",
                    help="which configurations to measure and whose goals to judge: the device scheduler's (device) "
                         "or the CPU share's (cpu_share)")
    ap.add_argument("--loads", default="0.4,0.7,1.2", help="fractions of the device's capacity (0.4,0.7,1.2)")
    ap.add_argument("--mixes", default="equal,skewed")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per cell (3)")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds of arrivals per cell (5)")
    ap.add_argument("--sla-multiple", type=float, default=10.0, help="each model's SLA in multiples of its t1 (10)")
    ap.add_argument("--cnn", choices=("mobilenet", "resnet50"), default="mobilenet",
                    help="the CNN among the four (mobilenet: the cheaper run)")
    ap.add_argument("--perf-load", type=float, default=0.7, help="the perf_analyzer cell set's load (0.7, equal)")
    ap.add_argument("--no-perf", action="store_true", help="skip the perf_analyzer cell set")
    ap.add_argument("--reprofile", action="store_true", help="profile the models' latency tables again (an OUT kept "
                    "from an earlier run reuses its tables, which the lazybatch models and the simulator read)")
    ap.add_argument("--quick", action="store_true", help="every part once with tiny durations (development, tests)")
    ap.add_argument("--out", default="lazybatch-results/colocation", help="results folder (repositories, logs, "
                    "colocation.json, the page)")
    ap.add_argument("--data", default=None, help="also copy the raw results here (docs/data/colocation.json)")
    ap.add_argument("--page", default=None, help="write the page here (default OUT/colocation.md; "
                    "docs/results/colocation.md puts its plots in docs/img/)")
    ap.add_argument("--from-results", default=None, metavar="JSON", help="re-render the page of a saved run, "
                    "measuring nothing")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.from_results:
        res = json.loads(Path(args.from_results).read_text())
        return write_outputs(res, out, args.page, data_path=Path(args.from_results))
    if args.quick:
        args.loads, args.mixes, args.reps, args.duration = "0.7", "equal", 1, 3.0
    args.loads = [float(x) for x in str(args.loads).split(",")]
    args.mixes = str(args.mixes).split(",")
    kinds = [args.cnn if k == "mobilenet" else k for k in KINDS]
    est = estimate(args)
    up = R.LINEUPS[args.lineup]
    print(f"co-location benchmark ({args.lineup}, judging {up.ours}): {len(up.configs)} configurations x "
          f"{len(args.mixes)} mixes x {len(args.loads)} loads x {args.reps} repetitions of {args.duration:g} s, "
          f"{'' if args.no_perf else 'perf set, '}pair, priority; estimated {est / 60:.0f} min on a quiet 2-core "
          "machine", flush=True)
    # a run stopped with SIGTERM (e.g. `timeout`) still stops its two servers: served()'s exit runs on SystemExit
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t_start = time.monotonic()
    meta = {**machine_meta(), "command": command_line(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    urgent = args.cnn
    prio = prio_lineup(args.lineup, urgent)
    configs = [R.CONFIGS[c] for c in up.configs] + [c for c in prio.values() if c not in R.CONFIGS.values()]
    main_repo, rl_repo = R.build(out, kinds, configs, reprofile=args.reprofile)
    arbiters = out / "arbiters"
    arbiters.mkdir(parents=True, exist_ok=True)
    res: dict = {"meta": meta, "kinds": kinds, "cells": []}
    res["settings"] = {"lineup": args.lineup, "loads": args.loads, "mixes": args.mixes, "reps": args.reps,
                       "duration_s": args.duration,
                       "sla_multiple": args.sla_multiple, "skew_kind": args.cnn, "rl_priority": R.RL_PRIORITY,
                       "quick": args.quick, "estimate_s": est, "wall_s": 0.0,
                       "pair": {"small": PAIR[0], "large": PAIR[1], "small_load": PAIR[2], "large_load": PAIR[3]},
                       "prio": {"urgent": urgent, "urgent_load": PRIO[1], "best_effort": [k for k in kinds
                                                                                          if k != urgent],
                                "best_effort_load": PRIO[2], "rl_urgent": R.RL_PRIORITY,
                                "rl_best_effort": R.RL_BEST_EFFORT}}
    with served(main_repo, out / "tritonserver.log", env={"LAZYBATCH_ARBITER_DIR": str(arbiters)}) as s1, \
            served(rl_repo, out / "tritonserver_rl.log", extra_args=["--rate-limit=execution_count"]) as s2:
        url = {False: s1.endpoints.grpc, True: s2.endpoints.grpc}
        t1 = {}
        for k in kinds:
            t1[k] = 1e3 * (seq2seq_t1(url[False], s1.endpoints.http, f"{k}_triton_0us", 20) if R.is_decoder(k)
                           else static_t1(url[False], k))
        sla = {k: args.sla_multiple * t1[k] for k in kinds}
        tqdm.write("t1: " + ", ".join(f"{k} {v:.2f} ms" for k, v in t1.items()))
        res.update(t1_ms=t1, sla_ms=sla)
        tables = Tables({k: R.lazybatch_table(out, k, up.ours) for k in kinds})
        plan = steps(args, kinds, t1, prio, urgent)
        for step in tqdm(plan, desc="cells", unit="cell"):
            cfg = step["cfg"]
            names = {k: R.model_name(k, cfg) for k in step["rates"]}
            u = url[cfg.rate_limited]
            if step.get("alone"):
                k = step["alone"]
                c = alone_cell(u, k, names[k], step["rates"][k], step["index"], args.duration, step["seed"],
                               sla[k], t1[k])
            elif step["driver"] == "perf":
                try:
                    c = perf_cell(u, names, step["rates"], args.duration, step["seed"], sla, t1,
                                  out / "perf" / f"{step['config']}_{step['rep']}")
                except ConfigError as e:  # perf_analyzer gives up on a window where nothing finished: say so
                    tqdm.write(f"perf_analyzer failed on {step['config']} rep {step['rep']}: {str(e)[:300]}")
                    c = {"error": str(e)[-500:], "models": {}, "all": {}}
            else:
                c = load_cell(u, names, step["rates"], args.duration, step["seed"], sla, t1)
            if step["driver"] == "load":  # the simulated ceiling on the same arrivals
                rates = step["rates"] if not step.get("alone") else {step["alone"]: step["rates"][step["alone"]]}
                idx = {step["alone"]: step["index"]} if step.get("alone") else None
                levels = {k: 0 if k == urgent else 1 for k in rates} if step["exp"] == "prio" else None
                roles = ({k: LATENCY_CRITICAL if k == urgent else BEST_EFFORT for k in rates}
                         if step["exp"] == "prio" else None)
                c["sim"] = simulate(tables, step["config"], rates, args.duration, step["seed"], sla, t1,
                                    indices=idx, levels=levels, roles=roles)
            res["cells"].append({k: v for k, v in step.items() if k != "cfg"} | c)
            time.sleep(PAUSE_S)
            res["settings"]["wall_s"] = time.monotonic() - t_start
            write_json(out / "colocation.json", res)  # a long run keeps what it measured (--from-results reads it)
    res["settings"]["wall_s"] = time.monotonic() - t_start
    write_json(out / "colocation.json", res)
    if args.data:
        write_json(args.data, res)
    return write_outputs(res, out, args.page, data_path=Path(args.data) if args.data else out / "colocation.json")


def prio_lineup(lineup: str, urgent: str) -> dict[str, R.Config]:
    """The priority experiment's configurations that ``lineup`` measures (those that can say priority)."""
    return {k: v for k, v in R.prio_configs(urgent).items() if k in R.LINEUPS[lineup].configs}


def steps(args: argparse.Namespace, kinds: list[str], t1: dict[str, float], prio: dict, urgent: str) -> list[dict]:
    """Every cell to measure, in order: the sweep (each load's repetitions, configurations taking turns, the order
    reversed every other repetition), the perf_analyzer set, the pair, the priority experiment."""
    out: list[dict] = []
    up = R.LINEUPS[args.lineup]
    names = list(up.configs)

    def turns(k: int, cfgs: list[str]) -> list[str]:
        return cfgs if k % 2 == 0 else list(reversed(cfgs))

    all_mixes = mixes(args.mixes, kinds, args.cnn)
    for mi, (mix, shares) in enumerate(all_mixes.items()):
        for li, f in enumerate(args.loads):
            rates = rates_for(f, shares, t1)
            base = {"exp": "sweep", "driver": "load", "mix": mix, "load": f}
            for i, k in enumerate(kinds):  # each model alone, the first repetition's arrivals
                out.append({**base, "rep": 0, "config": "triton_0us", "cfg": R.CONFIGS["triton_0us"], "alone": k,
                            "index": i, "rates": rates, "seed": 100 * 0 + 10 * mi + li})
            for k in range(args.reps):
                for c in turns(k, names):
                    out.append({**base, "rep": k, "config": c, "cfg": R.CONFIGS[c], "rates": rates,
                                "seed": 100 * k + 10 * mi + li})
    if not args.no_perf:
        shares = mixes(["equal"], kinds, args.cnn)["equal"]
        for k in range(args.reps):
            for c in turns(k, names):
                out.append({"exp": "sweep", "driver": "perf", "mix": "equal", "load": args.perf_load, "rep": k,
                            "config": c, "cfg": R.CONFIGS[c], "rates": rates_for(args.perf_load, shares, t1),
                            "seed": 100 * k + 50})
    small, large, fs, fl = PAIR
    rates = {small: fs / (t1[small] / 1e3), large: fl / (t1[large] / 1e3)}
    for k in range(args.reps):
        base = {"exp": "pair", "driver": "load", "mix": "pair", "load": 0.0, "rep": k, "rates": rates,
                "seed": 100 * k + 70}
        for c in (up.ours, "triton_0us"):
            for i, m in enumerate(rates):
                out.append({**base, "config": c, "cfg": R.CONFIGS[c], "alone": m, "index": i})
        for c in turns(k, names):
            out.append({**base, "config": c, "cfg": R.CONFIGS[c]})
    be = [k for k in kinds if k != urgent]
    be_rates = rates_for(PRIO[2], {k: 1 / len(be) for k in be}, t1)
    rates = {urgent: PRIO[1] / (t1[urgent] / 1e3), **be_rates}
    for k in range(args.reps):
        base = {"exp": "prio", "driver": "load", "mix": "prio", "load": 0.0, "rep": k, "rates": rates,
                "seed": 100 * k + 90}
        for c in turns(k, list(prio)):
            out.append({**base, "config": c, "cfg": prio[c], "alone": urgent, "index": 0})
            out.append({**base, "config": c, "cfg": prio[c]})
    return out


def write_outputs(res: dict, out: Path, page: str | None, data_path: Path) -> int:
    """The page and its plots from the raw data: OUT/colocation.md with OUT/img/, or ``page`` (a page under
    docs/results/ puts its plots in docs/img/, as the other results pages, named after the page)."""
    page_path = Path(page) if page else out / "colocation.md"
    img_dir = page_path.parent.parent / "img" if page_path.parent.name == "results" else page_path.parent / "img"
    img_rel = "../img" if page_path.parent.name == "results" else "img"
    import os

    res.setdefault("settings", {})
    res["settings"]["data_name"] = data_path.name
    res["settings"]["data_link"] = os.path.relpath(data_path.resolve(), page_path.parent.resolve())
    plots(res, img_dir, page_path.stem)
    write_page(page_path, render(res, img_rel, page_path.stem))
    print(f"wrote {page_path} and its plots in {img_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
