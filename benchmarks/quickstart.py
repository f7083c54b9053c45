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
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from benchmarks.colocation.pair import PAUSE_S, TWIN, pair_slas
from benchmarks.pair import parse_kinds
from benchmarks.harness import command_line, geomean, judge, machine_meta, served, write_json
from benchmarks.harness.measure import load_segment, pool_load, service_time
from benchmarks.harness.cli import turned
from benchmarks.harness.method import floor_note, floor_settled, measured, p99_note, segments_for
from benchmarks.harness.page import table_head, write_page
from benchmarks.harness.plots import latency_cdfs
from benchmarks.harness.procs import niced, processes
from lazybatch.client.api import Client
from lazybatch.client.load import run_load
from lazybatch.client.together import model_seed, run_together
from lazybatch.shipped import KIND_SLA_MS, PAIR_OURS, build_default_repository, default_build_dir

CONFIGS = {"lazybatch": PAIR_OURS, "Triton 0 ms": "triton_0us", "copy": TWIN}  # name -> model suffix
HAND = "hand-set nice"  # Triton 0 ms's models, the neighbour's stub at HAND_NICE for the window
HAND_NICE = 10  # the CPU share's first step (batcher/cpu_rank.py NICE_STEPS[1])
LOADS = (0.4, 0.7)  # question 1: fractions of the MLP's batch-1 rate
# question 2: the latency-critical model (small), its busy neighbour (large) and their fractions of their own batch-1
# rates: why not the MLP beside ResNet-50, docs/colocation.md "The quickstart's pair"
PAIR = {"small": "tiny", "large": "mlp"}
SMALL_LOAD, LARGE_LOAD = 0.3, 0.5
SEGMENT_S, WINDOW_S, REPS = 2.0, 2.0, 3
SEGMENTS, ALONE_SEGMENTS = 3, 2  # question 2's windows per configuration and repetition: together, and alone
GOALS = {"avg": 1.2, "p99": 1.5}  # the small model beside the large one / alone, under lazybatch (docs/colocation.md)
LABEL = {"mlp": "the MLP", "resnet50": "ResNet-50", "tiny": "tiny", "bert": "BERT", "mobilenet": "MobileNet"}
LATER = ["python -m benchmarks.bench_default   # the standing guard: four models, both load generators, settled",
         "python -m benchmarks.pair            # the pair beside Triton 5 ms and pinning (host policies)",
         "python -m benchmarks.pair --capacity --kinds small=tiny,large=mlp   # best-effort capacity under an SLA",
         "lazybatch load MODEL --capacity --rate 5 --sla-ms 200            # one model's capacity under its SLA",
         "python -m benchmarks.bench_colocation   # four models, the rate limiter among Triton's configurations"]


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
                    r, m = measured(lambda: run_load(url, f"mlp_{CONFIGS[name]}", rate, seg_s, sla_ms=10.0,
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


IN_WINDOW = 0.95  # answers inside their window / sends at least this, or the window cannot call the cell sustained


def cell(runs: list[dict], sla_ms: float, **key: object) -> dict:
    """The pooled figures of the runs matching ``key`` (harness.measure.pool_load), with per-repetition averages
    and the steal the windows saw. Sustained also needs IN_WINDOW of the requests answered before their window
    ended: a steady queue answers all but rate x its average latency of them (Little's law), so this asks for an
    average under 5% of the window; a longer one a window this short cannot tell from a queue growing through it."""
    mine = [r for r in runs if all(r.get(k) == v for k, v in key.items())]
    c = pool_load(mine, sla_ms)
    reps = sorted({r["rep"] for r in mine})
    c["rep_avg"] = [float(np.mean([v for r in mine if r["rep"] == k for v in r["latencies"]] or [math.nan]))
                    for k in reps]
    c["steal"] = max((r["steal"] for r in mine), default=math.nan)
    c["busy"] = float(np.mean([r["busy"] for r in mine])) if mine else math.nan
    span = sum(r["duration"] for r in mine)
    c["goodput"] = sum(1 for r in mine for v in r["latencies"] if v <= sla_ms) / span if span else math.nan
    inside = sum(1 for r in mine for t, lat, ok in r["records"] if ok and t + lat / 1e3 <= r["duration"])
    c["in_window"] = inside / max(c["sent"], 1)
    c["sustained"] = c["sustained"] and c["in_window"] >= IN_WINDOW
    return c


def ratio(base: dict, other: dict) -> dict:
    """base / other per repetition (average latency: above 1.00 ``other`` is faster): geomean, range, p99s pooled."""
    per = [b / o for b, o in zip(base["rep_avg"], other["rep_avg"]) if o > 0 and math.isfinite(b / o)]
    geo, lo, hi = geomean(per) if per else math.nan, min(per, default=math.nan), max(per, default=math.nan)
    return {"per_rep": per, "geo": geo, "lo": lo, "hi": hi, "p99": base["p99_ms"] / other["p99_ms"],
            "text": f"{geo:.2f}x [{lo:.2f}-{hi:.2f}]"}


def both(a: dict, b: dict) -> dict:
    """Two identical copies as one baseline, their figures averaged: against one copy, a policy equal to the other
    came out "behind" (a run at 40%: Triton 0 ms / lazybatch 0.90x, / its copy 0.91x; identical sessions run a few
    percent apart, and a server keeps the ones it drew)."""
    return {"rep_avg": [(x + y) / 2 for x, y in zip(a["rep_avg"], b["rep_avg"])],
            "p99_ms": (a["p99_ms"] + b["p99_ms"]) / 2}


def said(r: dict, goal: float = 1.0, *, lower_is_better: bool = False) -> str:
    v = judge(r["lo"], r["hi"], goal, lower_is_better=lower_is_better)
    return {"met": "ahead" if goal == 1.0 else "met", "missed": "behind" if goal == 1.0 else "missed"}.get(v, "tie")


def latency(c: dict) -> str:
    """A cell's latency, or why it has none: a cell that is not sustained shows throughput and goodput."""
    if not c["sustained"]:
        return (f"not sustained (drift {c['drift']:.2f}x, {c['in_window']:.0%} answered in the window) | "
                f"throughput {c['throughput']:.1f}/s, goodput {c['goodput']:.1f}/s")
    return f"{c['avg_ms']:.1f} | {c['p99_ms']:.1f}"


def first_table(runs: list[dict], t1_ms: float) -> list[str]:
    lines = [f"**1. Is the default level with Triton's batcher on a model alone?** The MLP (t1 {t1_ms:.1f} ms) "
             "alone. Ratio: the average of Triton 0 ms and its identical copy / lazybatch's, per repetition (above "
             "1.00 lazybatch is faster); noise floor: Triton 0 ms / its copy.", "",
             *table_head(["load", "configuration", "requests", "avg ms", "p99 ms", "drift", "max steal"])]
    verdicts = ["", *table_head(["load", "Triton 0 ms and its copy / lazybatch, avg", "noise floor", "verdict",
                                 "p99 ratio (noise floor)"])]
    for f in LOADS:
        cells = {name: cell(runs, 10.0, question=1, load=f, config=name) for name in CONFIGS}
        for name, c in cells.items():
            lines.append(f"| {f:.0%} | {name} | {p99_note(c['requests'])} | {latency(c)} | {c['drift']:.2f} | "
                         f"{c['steal']:.1%} |")
        tri = both(cells["Triton 0 ms"], cells["copy"])
        ours, floor = ratio(tri, cells["lazybatch"]), ratio(cells["Triton 0 ms"], cells["copy"])
        if not all(c["sustained"] for c in cells.values()):
            verdict = "no verdict: not every configuration sustained this load"
        elif not floor_settled(floor["per_rep"]):
            verdict = floor_note(floor["per_rep"])
        else:
            verdict = f"lazybatch {said(ours)}" if said(ours) != "tie" else "level (a tie)"
        verdicts.append(f"| {f:.0%} | {ours['text']} | {floor['text']} | {verdict} | {ours['p99']:.2f}x "
                        f"({floor['p99']:.2f}x) |")
    return lines + verdicts


def second_table(runs: list[dict], meta: dict) -> list[str]:
    slas, t1, kinds = meta["slas_ms"], meta["t1_ms"], meta["pair"]
    small, large = (LABEL.get(kinds[r], kinds[r]) for r in ("small", "large"))
    together = [c for c in [*CONFIGS, HAND] if any(r.get("mode") == "together" and r["config"] == c for r in runs)]
    offered = sum(meta["rates"][r] * t1[r] / 1e3 for r in kinds)
    cells = {(mode, cfg, role): cell(runs, slas[role], question=2, mode=mode, config=cfg, role=role)
             for mode in ("together", "alone") for cfg in together for role in kinds
             if any(r.get("mode") == mode and r["config"] == cfg and r["role"] == role for r in runs)}
    busy = np.nanmean([c["busy"] for (mode, _, _), c in cells.items() if mode == "together"])
    lines = [f"**2. What does a latency-critical model keep beside a busy neighbour?** {small} (t1 "
             f"{t1['small']:.1f} ms, SLA {slas['small']:g} ms) at {meta['loads']['small']:.0%} of its batch-1 rate "
             f"({meta['rates']['small']:.0f}/s) beside {large} (t1 {t1['large']:.1f} ms) at "
             f"{meta['loads']['large']:.0%} of its own ({meta['rates']['large']:.0f}/s), both at once: offered "
             f"{offered:.0%} of the machine (rate x t1 summed), /proc/stat busy {busy:.0%}.", "",
             *table_head(["configuration", f"{small}: requests", "avg ms", "p99 ms", f"{large}: requests", "avg ms",
                          "p99 ms", f"sustained (drift {small}, {large})", "max steal"])]
    for (mode, cfg, role), c in cells.items():
        if role != "small":
            continue
        big = cells.get((mode, cfg, "large"))
        label = f"{cfg}{', ' + str(HAND_NICE) + ' by hand' if cfg == HAND else ''}" if mode == "together" else \
            f"{small} alone, {cfg}"
        other = f"{p99_note(big['requests'])} | {latency(big)}" if big else "- | - | -"
        steady = all(x["sustained"] for x in (c, big) if x)
        lines.append(f"| {label} | {p99_note(c['requests'])} | {latency(c)} | {other} | "
                     f"{'yes' if steady else 'no'} ({c['drift']:.2f}, {big['drift'] if big else math.nan:.2f}) | "
                     f"{max(c['steal'], big['steal'] if big else 0):.1%} |")

    def get(mode: str, cfg: str, role: str = "small") -> dict | None:
        return cells.get((mode, cfg, role))

    def unsustained(*turns: tuple[str, str]) -> str:
        """'' where every model of these turns sustained its load, else which did not."""
        bad = [f"{cfg}{' alone' if mode == 'alone' else ''} ({name})" for mode, cfg in turns
               for role, name in (("small", small), ("large", large))
               if (c := get(mode, cfg, role)) is not None and not c["sustained"]]
        return f"no verdict: not sustained under {', '.join(bad)}" if bad else ""

    def row(figure: str, r: dict, goal: str, verdict: str) -> str:
        return f"| {figure} | {r['text']} | {r['p99']:.2f}x | {goal} | {verdict} |"

    lines += ["", *table_head(["figure", "ratio [range over repetitions]", "p99 ratio (pooled)", "goal", "verdict"])]
    for cfg in ("lazybatch", "Triton 0 ms"):  # beside / alone: lower is better
        if get("alone", cfg) and get("together", cfg):
            r = ratio(get("together", cfg), get("alone", cfg))
            lines.append(row(f"{small} beside {large} / alone, {cfg}", r,
                             f"avg <= {GOALS['avg']:g}x, p99 <= {GOALS['p99']:g}x",
                             unsustained(("alone", cfg), ("together", cfg)) or
                             f"avg {said(r, GOALS['avg'], lower_is_better=True)}, "
                             f"p99 {'met' if r['p99'] <= GOALS['p99'] else 'missed'}"))
    floors = {role: ratio(get("together", "Triton 0 ms", role), get("together", "copy", role))
              for role in kinds if get("together", "copy", role) and get("together", "Triton 0 ms", role)}
    for role, name in (("small", small), ("large", large)):
        if role in floors:
            lines.append(row(f"noise floor, {name}: Triton 0 ms / its identical copy", floors[role], "0.90-1.10x",
                             "settled" if floor_settled(floors[role]["per_rep"]) else "not settled"))
    for other in ("Triton 0 ms", HAND):  # Triton 0 ms, and the hand-set line, against lazybatch on both models
        for role, name in (("small", small), ("large", large)):
            theirs, mine = get("together", other, role), get("together", "lazybatch", role)
            if theirs is None or mine is None or role not in floors:
                continue
            why = unsustained(("together", other), ("together", "lazybatch"), ("together", "copy"))
            base = both(theirs, get("together", "copy", role)) if other == "Triton 0 ms" else theirs
            r, floor = ratio(base, mine), floors[role]["per_rep"]
            verdict = why or (said(r) if floor_settled(floor) else floor_note(floor))
            who = "Triton 0 ms and its copy" if other == "Triton 0 ms" else other
            if why and not (theirs["sustained"] and mine["sustained"]):  # what each carried, not a latency
                lines.append(f"| {name} beside {small if role == 'large' else large}, {who} / lazybatch | "
                             f"throughput {theirs['throughput']:.1f} / {mine['throughput']:.1f}/s, goodput "
                             f"{theirs['goodput']:.1f} / {mine['goodput']:.1f}/s | - | - | {verdict} |")
            else:
                goal = ">= 1.00x" if other == "Triton 0 ms" and role == "small" else "-"
                lines.append(row(f"{name} beside {small if role == 'large' else large}, {who} / lazybatch", r,
                                 goal, verdict))
    return lines


def cdf(runs: list[dict], kinds: dict[str, str], path: Path) -> Path | None:
    """The latency-critical model's latency CDF beside its neighbour per configuration, and alone (dashed)."""
    small, large = (LABEL.get(kinds[r], kinds[r]) for r in ("small", "large"))
    colours = dict(zip([*CONFIGS, HAND], ("tab:blue", "tab:orange", "tab:gray", "tab:green")))
    series = {f"{cfg}, {f'beside {large}' if mode == 'together' else 'alone'}": (
        [v for r in runs if r["question"] == 2 and r.get("mode") == mode and r["config"] == cfg and r["role"] ==
         "small" for v in r["latencies"]],
        {"color": colours[cfg], "linestyle": "--" if mode == "alone" else "-",
         "linewidth": 1 if cfg == "copy" else 1.8})
        for mode in ("together", "alone") for cfg in colours}
    return latency_cdfs(series, path, xlabel=f"{small} latency (ms, log scale)",
                        title=f"The latency-critical {small} beside {large}, and alone")


def render(data: dict, out: Path) -> list[str]:
    """The page's lines from the raw data (``quickstart.json``), with the CDF plot beside it."""
    meta, runs = data["meta"], data["runs"]
    tables = [*first_table(runs, meta["alone_t1_ms"]), "", *second_table(runs, meta), ""]
    plot = cdf(runs, meta["pair"], out / "cdf.png")
    lines = [f"Measured at commit {meta.get('commit', '?')} on {meta.get('cpu', '?')} ({meta.get('cores')} cores): "
             + ", ".join(f"{k} {v:.0f} s" for k, v in meta["phases_s"].items()) + ".", "", *tables]
    if plot is not None:
        lines += [f"The latency-critical model's latency CDF: {plot}", ""]
    return lines + ["Longer runs, each a command of its own:", "", "```", *LATER, "```"]


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
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.from_data:
        print("\n".join(render(json.loads(Path(args.from_data).read_text()), out)))
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
    data = {"meta": meta, "runs": runs}
    write_json(out / "quickstart.json", data)
    lines = render(data, out)
    write_page(out / "quickstart.md", lines)
    print("\n" + "\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
