"""Decoder models: step-level batching against Triton's own dynamic batcher, on a real tritonserver.

    python -m benchmarks.bench_decoder                                  # the decoder LM, 70/100/150% load
    python -m benchmarks.bench_decoder --models gnmt,transformer --loads 0.1,0.7,1.5,3 --reps 3 --duration 30
    python -m benchmarks.bench_decoder --models gnmt --variants eager_join     # an opt-in rule beside the default
    python -m benchmarks.bench_decoder --models gnmt --loads 0.7 --driver perf_analyzer   # the load from perf_analyzer

Goal (docs/results/decoder.md): on the decoder-only LM with long-tail lengths, at 70-150% of the batch-1 rate, best
Triton dynamic-batcher config (0/5/20 ms queue delay) average and p99 latency / lazybatch's >= 3, and lazybatch's peak
throughput >= 2x Triton's best; on GNMT and the Transformer, average >= 1.5 at 70-150% and >= 1.0 at every load.

Per model, one tritonserver serves it under lazybatch's default policy (eager: decoder steps of requests at different
timesteps share a batch, a finished request leaves at once, a new one joins at the next step) and under Triton's
dynamic batcher at 0, 5 and 20 ms (`triton:<us>`: Triton forms each batch, the backend decodes it to its longest
member's end in one execute; finished rows ride along, as in any request-level batcher). Prompt and output lengths
are drawn from the model's shipped histogram (the chat-like one for the LM: most outputs short, a tail of several
hundred tokens; `ignore_eos`, so random weights cannot end a request early). The batch-1 rate is 1 / the mean
latency of 20 such requests sent one at a time to triton_0us. At each load every repetition runs every policy once,
taking turns (the order reverses every repetition). Ratios are mean [min-max] over repetitions; a range that straddles
the goal is a tie. Beside each served table, the same loads replayed on a virtual clock on the latency table the
served policies read (Triton's batcher at N ms is graph:N there): the ceiling of the algorithm with no serving cost.
The raw cells go to OUT/decoder.json; ``--data`` copies them into the docs.

``--driver perf_analyzer``: NVIDIA perf_analyzer offers the load instead of `lazybatch load` (`lazybatch perf`:
Poisson request rate, --async, requests of the same histogram's lengths drawn with the repetition's seed, three
measurement windows of a third of the cell's duration; harness.perf_row). Its latency counts the requests that end
inside its windows, so past capacity, where Triton's batcher leaves requests waiting longer than a window, its
figures understate that queue: use it at loads the server keeps up with.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from tqdm import tqdm

from benchmarks.harness import (PerfMeasuredNothing, add_perf_arrivals_arg, add_sweep_args, command_line, machine_meta,
                                parse_sweep_args, perf_row, seq2seq_t1, served, served_table, turns, write_json)
from lazybatch.client.load import run_load
from lazybatch.shipped import KIND_SLA_MS, build_default_repository
from benchmarks.reports.decoder import POLICIES, VARIANTS, report
from benchmarks.reports.decoder import simulated



def bench_model(kind: str, args: argparse.Namespace, out: Path) -> dict:
    policies = {**POLICIES, **{v: VARIANTS[v] for v in args.variants}}
    repo = build_default_repository(out / "repos" / kind, kind=kind, work=out / "build" / kind, policies=policies,
                                    profile_reps=5, seq2seq_baselines=False)
    sla_ms = KIND_SLA_MS[kind]
    cells = []
    with served(repo, out / f"tritonserver_{kind}.log", stats_dir=out / "stats") as server:
        url, http = server.endpoints.grpc, server.endpoints.http
        t1 = seq2seq_t1(url, http, f"{kind}_triton_0us", 20)
        tqdm.write(f"[{kind}] t1 {t1 * 1e3:.1f} ms (batch-1 rate {1 / t1:.2f}/s), SLA {sla_ms:g} ms")
        for f, k, pol in turns(args.loads, args.reps, policies, kind):
            # light loads run long enough to hold --min-requests arrivals (10% of the LM's rate: about 0.5/s)
            duration = max(args.duration, args.min_requests * t1 / f)
            if args.driver == "perf_analyzer":
                cell = perf_cell(url, f"{kind}_{pol}", f / t1, duration, sla_ms, 100 * k, out,
                                 seeded_arrivals=args.perf_arrivals == "seeded")
            else:
                cell = load_cell(url, f"{kind}_{pol}", f / t1, duration, sla_ms, 100 * k, out)
            cells.append({"load": f, "rep": k, "policy": pol} | cell)
            time.sleep(0.5)
    return {"model": kind, "t1_ms": t1 * 1e3, "sla_ms": sla_ms, "driver": args.driver,
            **({"perf_arrivals": args.perf_arrivals} if args.driver == "perf_analyzer" else {}), "cells": cells,
            "simulated": simulated(*served_table(repo / f"{kind}_eager" / "1"), args.loads, sla_ms, args.variants)}


def load_cell(url: str, model: str, rate: float, duration: float, sla_ms: float, seed: int, out: Path) -> dict:
    """One cell under `lazybatch load`, with every request's send offset and latency."""
    r = run_load(url, model, rate, duration, sla_ms=sla_ms, seed=seed, timeout_s=600.0)
    return {"sent": r.sent, "ok": r.ok, "errors": r.errors, "avg_ms": r.avg_ms, "p99_ms": r.p99_ms,
            "throughput": r.throughput, "violations": r.sla_violation_rate,
            # per request, in send order: [send offset s, latency ms (null: failed)]; the same trace (seed) goes to
            # every policy of a repetition, so requests pair across policies
            "records": [[round(o, 4), None if lat != lat else round(lat, 2)] for o, lat, _ in r.records]}


def perf_cell(url: str, model: str, rate: float, duration: float, sla_ms: float, seed: int, out: Path,
              seeded_arrivals: bool = False) -> dict:
    """One cell under perf_analyzer: its average, p99 and throughput. It counts no requests for us (a run with a
    failed request fails), so sent and errors stay null; its own request-level figures stay in OUT/perf/. Where no
    request ended inside its windows (Triton's batcher on the LM at 70%: a batch decodes until its longest member
    ends), the cell says so and holds no figures, and the sweep goes on."""
    none = {"sent": None, "ok": None, "errors": None, "violations": None, "records": None}
    try:
        row = perf_row(url, model, rate, duration, seed, out, sla_ms=sla_ms, seeded_arrivals=seeded_arrivals)
    except PerfMeasuredNothing as e:
        tqdm.write(f"{model} at {rate:.3f}/s: {e}")
        return none | {"avg_ms": None, "p99_ms": None, "throughput": None, "measured_nothing": str(e)}
    return none | {"avg_ms": row["avg_ms"], "p99_ms": row["p99_ms"], "throughput": row["throughput"]}




def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="lm", help="comma list of lm, gnmt, transformer (default lm)")
    add_sweep_args(ap, loads="0.7,1,1.5", reps=2, duration=20.0, out="lazybatch-results/decoder",
                   data="docs/data/decoder.json")
    ap.add_argument("--min-requests", type=int, default=12,
                    help="stretch a cell's duration to hold at least this many expected arrivals (12)")
    ap.add_argument("--variants", default="", help=f"opt-in rules served beside eager, from {sorted(VARIANTS)}")
    ap.add_argument("--driver", choices=("load", "perf_analyzer"), default="load",
                    help="what offers the load: lazybatch load (default) or NVIDIA perf_analyzer")
    add_perf_arrivals_arg(ap, "--driver perf_analyzer")
    ap.add_argument("--rerender", default=None, metavar="JSON",
                    help="print the report of a saved run (e.g. docs/data/decoder.json), measuring nothing")
    args = parse_sweep_args(ap, argv)
    if args.rerender:
        for m in json.loads(Path(args.rerender).read_text())["models"]:
            print("\n".join(report(m)) + "\n")
        return 0
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if unknown := sorted(set(args.variants) - set(VARIANTS)):
        ap.error(f"unknown variant(s) {unknown}; choose from {sorted(VARIANTS)}")
    out = Path(args.out)
    res = {"meta": {**machine_meta(), "command": command_line()}, "models": []}
    for kind in args.models.split(","):
        res["models"].append(bench_model(kind, args, out))
        write_json(out / "decoder.json", res)
    for m in res["models"]:
        print("\n".join(report(m)) + "\n")
    if args.data:
        write_json(args.data, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
