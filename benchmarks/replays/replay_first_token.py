"""Time to first token under eager's decoder admission rules, replayed on the served streaming LM's latency table
(no serving cost): ``first_token`` (the decoupled models' default: admit up to the batch cap) beside ``curves``
(every deadline that can still be met must hold) and ``eq2``.

    python -m benchmarks.replays.replay_first_token --out docs/data/first_token_replay.json

The table is the one the streaming run of docs/results/decoder.md served (profiled by its repo at commit f0559c9);
lengths from the shipped chat-like histogram; 3 seeds x 400 Poisson requests per cell, SLA 5 s as served. Loads are
fractions of the table's batch-1 rate (the served runs' labels use the served t1, a little lower). Unloaded TTFT:
50 requests at 1% load. TPOT: (finish - first token) / (tokens - 1)."""
import argparse, json, statistics
from benchmarks.harness import command_line
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.lengths import LengthHistogram
from lazybatch.batcher.policies import parse_policy
from lazybatch.formats.histograms import shipped_histogram
from lazybatch.simulator import workload
from lazybatch.simulator.engine import Simulation
from lazybatch.simulator.loads_on_table import single_request_ms

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--table", default="benchmarks/tables/streaming_lm_latency_f0559c9.json")
ap.add_argument("--loads", default="0.5,0.9,1.2,1.5,2,3")
ap.add_argument("--out", default="docs/data/first_token_replay.json")
args = ap.parse_args()
table, hist = LatencyTable.load(args.table), LengthHistogram.load(shipped_histogram("chat"))
t1 = single_request_ms(table, hist) / 1e3


def run(rule: str, load: float, seed: int, n: int = 400) -> list:
    reqs = workload.requests(workload.poisson(load / t1, n, seed, graph=table.graph, lengths=hist), 5.0)
    policy = parse_policy(f"eager:admission={rule}").build(max_batch_size=table.max_batch_size, length_histogram=hist)
    Simulation(table, policy).run(reqs)
    return reqs


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[int(q * len(xs))]


out = {"table": args.table, "t1_ms": t1 * 1e3, "sla_s": 5.0, "cells": [], "command": command_line()}
print(f"t1 {t1 * 1e3:.1f} ms, batch cap {table.max_batch_size}")
print(f"{'rule':12s} {'load':>5s} {'TTFT ms':>8s} {'/unloaded':>9s} {'p99':>8s} {'TPOT ms':>8s} {'avg ms':>8s} "
      f"{'p99 ms':>8s} {'>SLA':>6s}")
for rule in ("first_token", "curves", "eq2"):
    unloaded = statistics.fmean(r.first_token - r.arrival for r in run(rule, 0.01, 0, 50))
    for load in map(float, args.loads.split(",")):
        reqs = [r for seed in range(3) for r in run(rule, load, seed)]
        ttft = [r.first_token - r.arrival for r in reqs]
        lat = [r.finish - r.arrival for r in reqs]
        tpot = [(r.finish - r.first_token) / (r.dec_steps - 1) for r in reqs if r.dec_steps > 1]
        c = {"rule": rule, "load": load, "unloaded_ttft_ms": unloaded * 1e3, "ttft_ms": statistics.fmean(ttft) * 1e3,
             "ttft_p99_ms": pct(ttft, 0.99) * 1e3, "tpot_ms": statistics.fmean(tpot) * 1e3,
             "avg_ms": statistics.fmean(lat) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3,
             "violations": sum(x > 5.0 for x in lat) / len(lat)}
        out["cells"].append(c)
        print(f"{rule:12s} {load:5.2f} {c['ttft_ms']:8.1f} {c['ttft_ms'] / c['unloaded_ttft_ms']:9.2f} "
              f"{c['ttft_p99_ms']:8.1f} {c['tpot_ms']:8.2f} {c['avg_ms']:8.1f} {c['p99_ms']:8.1f} "
              f"{c['violations']:6.3f}", flush=True)
json.dump(out, open(args.out, "w"), indent=1)
