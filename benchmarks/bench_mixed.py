"""Mixed traffic on one model: interactive requests beside bulk ones, the default policy against Triton's own dynamic
batcher with priority levels and queue timeouts, on a real tritonserver.

    python -m benchmarks.bench_mixed                                   # MLP and ResNet-50, 70/100/120% load
    python -m benchmarks.bench_mixed --models resnet50 --loads 0.7,1.2 --reps 3 --duration 10

Goal (docs/results/mixed.md): 20% interactive requests (SLA 2 x t1, priority level 1) and 80% bulk
(SLA 20 x t1, level 2) at 70-120% of the batch-1 rate: the interactive class misses its SLA at least 5x less often
than under the best Triton configuration, while the bulk class keeps >= 0.9x of its throughput and misses no more
than 1.1x as often.

Per model, one tritonserver serves it under eager with its urgency rule (`eager:urgency=true`; an interactive request
that would miss its deadline behind the running batch preempts it at the next stage boundary; the rule was eager's
default at 47592d7, where docs/data/mixed_47592d7.json was measured, and is opt-in since; eager_seg4 runs it on the stages merged into 4 segments) and under Triton's dynamic batcher at
0, 5 and 20 ms queue delay, each with two priority levels (interactive first in its queue) and a queue timeout per
level equal to that class's SLA (a request still queued past it is rejected: Triton's "at its best" for deadlines;
written once t1 is measured, and the models reloaded).
Both get the same classes from `lazybatch load --class` (client/load.py): each request is drawn into a class
(seeded), carries its SLA and priority. t1 is the median latency of sequential batch-1 requests to triton_0us. At
each load every repetition
runs every policy once, taking turns (the order reverses every repetition). "Best Triton" at a load is the
configuration with the fewest interactive misses (mean over repetitions); its bulk figures are the ones compared.
Ratios are mean [min-max] over repetitions (repetition k of eager against repetition k of that configuration); a
range that straddles the goal is a tie. Beside each served table, the same mix replayed on a virtual clock on the
table the served policy reads (lazybatch/simulator/mixed.py; Triton's batcher is graph:N with its queue ordered by
level, no timeouts). Raw cells go to OUT/mixed.json; ``--data`` copies them into the docs.

Decoder models (`--models gnmt`, `transformer`, `lm`): each request has lengths drawn from the model's shipped
histogram (as `lazybatch load` draws them); t1 is the mean latency of such requests sent one at a time, so the
interactive SLA of 2 x t1 is twice an average request's, and a request whose own decode is longer than that misses
it under any policy. An interactive request joins the running decode at the next step (eager's urgency rule for
decoder graphs); Triton's batcher decodes each group it hands over to its end in one execute. eager_seg4 is left out
there (its segments are a static graph's).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from tqdm import tqdm

from benchmarks.harness import (add_sweep_args, command_line, machine_meta, parse_sweep_args, seq2seq_t1, served,
                                served_table, static_t1, turns, write_json)
from lazybatch.backend.fusion import segment_table
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.client.load import run_load
from lazybatch.sessions.segments import balanced_cuts, segment_ranges
from lazybatch.repo import set_priority_timeouts
from lazybatch.shipped import KIND_MAX_BATCH, SEQ2SEQ_KINDS, build_default_repository
from lazybatch.simulator.loads_on_table import single_request_ms
from lazybatch.simulator.mixed import simulate_mixed
from lazybatch.traffic import TrafficClass
from benchmarks.reports.mixed import MIX, POLICIES, TRITON, plot, report

SEGMENTS = {"eager_seg4": 4}
SIM_POLICIES = {"eager": "eager:urgency=true", "triton_0us": "graph:0", "triton_5000us": "graph:5", "triton_20000us": "graph:20"}


def classes_for(t1_ms: float) -> list[TrafficClass]:
    return [TrafficClass(name, share, mult * t1_ms, level) for name, share, mult, level in MIX]


def bench_model(kind: str, args: argparse.Namespace, out: Path) -> dict:
    work = out / "build" / kind
    repo = out / "repos" / kind
    decoder = kind in SEQ2SEQ_KINDS
    policies = {p: v for p, v in POLICIES.items() if not (decoder and p in SEGMENTS)}
    build_default_repository(repo, kind=kind, work=work, profile_reps=5, seq2seq_baselines=False, policies=policies,
                             priority_levels=2, default_priority_level=2,
                             parameters={p: {"fuse_segments": str(k)} for p, k in SEGMENTS.items() if p in policies})
    if decoder:
        table, hist = served_table(repo / f"{kind}_eager" / "1")
    else:
        table, hist = LatencyTable.load(work / f"{kind}_latency_b{KIND_MAX_BATCH[kind]}.json"), None
    for pol in TRITON:  # a repository kept from an earlier run has its timeouts: t1 is measured without any
        set_priority_timeouts(repo / f"{kind}_{pol}", {})
    cells = []
    with served(repo, out / f"tritonserver_{kind}.log",
                extra_args=["--model-control-mode=explicit", "--load-model=*"]) as server:
        url = server.endpoints.grpc
        if decoder:
            t1 = seq2seq_t1(url, server.endpoints.http, f"{kind}_triton_0us", 20)
        else:
            t1 = static_t1(url, kind)
        # Triton's queue timeouts per level: the classes' SLAs, from the t1 just measured (a reload applies them)
        timeouts = {level: int(mult * t1 * 1e6) for _, _, mult, level in MIX}
        import tritonclient.grpc as grpcclient

        admin = grpcclient.InferenceServerClient(url)
        for pol in TRITON:
            set_priority_timeouts(repo / f"{kind}_{pol}", timeouts)
            admin.load_model(f"{kind}_{pol}")
        admin.close()
        classes = classes_for(t1 * 1e3)
        tqdm.write(f"[{kind}] t1 {t1 * 1e3:.2f} ms; classes "
                   + ", ".join(f"{c.name} {c.share:g} SLA {c.sla_ms:.1f} ms level {c.priority}" for c in classes))
        for f, k, pol in turns(args.loads, args.reps, policies, kind):
            r = run_load(url, f"{kind}_{pol}", f / t1, args.duration, classes=classes, seed=100 * k, timeout_s=120.0)
            cells.append({"load": f, "rep": k, "policy": pol, "sent": r.sent, "ok": r.ok, "errors": r.errors,
                          "error_kinds": r.error_kinds, "classes": r.classes})
            time.sleep(0.3)
    sim_t1 = single_request_ms(table, hist)
    sim = simulate_mixed(table, args.loads, classes_for(sim_t1), max_batch_size=KIND_MAX_BATCH[kind],
                         policies=SIM_POLICIES, seeds=3, requests=600 if decoder else 1500, histogram=hist,
                         t1_ms=sim_t1)
    # the same rule on the table of the segments it serves (stages summed)
    for pol, k in ({} if decoder else SEGMENTS).items():
        n = table.graph.n
        seg_table = segment_table(table, segment_ranges(n, balanced_cuts([table.dense[s][1] for s in range(n)], k)))
        sim["cells"] += simulate_mixed(seg_table, args.loads, classes_for(sim_t1), max_batch_size=KIND_MAX_BATCH[kind],
                                       policies={pol: POLICIES[pol]}, seeds=3, requests=1500, t1_ms=sim_t1)["cells"]
    return {"model": kind, "t1_ms": t1 * 1e3, "t1_table_ms": sim_t1, "timeouts_us": timeouts,
            "classes": [c.as_dict() for c in classes], "cells": cells, "simulated": sim}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,resnet50", help="comma list of model kinds (default mlp,resnet50)")
    ap.add_argument("--rerender", default=None, metavar="JSON", help="print the report and plot of a saved run "
                    "(e.g. docs/data/mixed.json) into --out, measuring nothing")
    add_sweep_args(ap, loads="0.7,1,1.2", reps=3, duration=10.0, out="lazybatch-results/mixed",
                   data="docs/data/mixed.json")
    args = parse_sweep_args(ap, argv)
    out = Path(args.out)
    if args.rerender:
        import json

        res = json.loads(Path(args.rerender).read_text())
        for m in res["models"]:
            print("\n".join(report(m)) + "\n")
        out.mkdir(parents=True, exist_ok=True)
        if plot(res["models"], out / "mixed.png"):
            print(f"wrote {out / 'mixed.png'}")
        return 0
    res = {"meta": {**machine_meta(), "command": command_line()}, "models": []}
    for kind in args.models.split(","):
        res["models"].append(bench_model(kind, args, out))
        write_json(out / "mixed.json", res)
    for m in res["models"]:
        print("\n".join(report(m)) + "\n")
    drawn = plot(res["models"], out / "mixed.png")
    print(f"wrote {out / 'mixed.json'}" + (f" and {out / 'mixed.png'}" if drawn else ""))
    if args.data:
        write_json(args.data, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
