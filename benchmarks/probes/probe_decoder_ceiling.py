"""How far GNMT's 70% goals are from what its latency table allows, on a virtual clock (no serving cost).

Two goals are missed on GNMT at 70% load: 1.5x lower average latency than Triton's best batcher (issue "Decoder
models"; served 1.26x, docs/results/decoder.md) and 5x fewer interactive SLA misses (issue "Mixed traffic";
served 2.8x, docs/results/mixed.md). This replays the table and says where eager's latency goes:

- per policy, the mean wait before a request's first stage and its mean latency over its own run alone (encoder
  and decoder steps at batch 1, which no schedule can beat: a step at batch b costs at least one at batch 1);
- the floor of the interactive class: requests whose own run alone exceeds 2 x t1 miss under any schedule;
- ``eager:join=benefit`` (opt-in, not yet served): newcomers join the running decode only if the summed latency of
  them and of the rows in flight is predicted lower than if they waited for those rows to end (a newcomer's encoder
  stalls every row in flight), on the histogram's expected remaining lengths, and told the true output lengths
  (clairvoyant: the rule's ceiling).

    python -m benchmarks.probes.probe_decoder_ceiling --table benchmarks/tables/gnmt_latency_7e215ec.json \\
        --out docs/data/decoder_ceiling_gnmt.json

benchmarks/tables/gnmt_latency_7e215ec.json is the table bench_regimes.py profiled for the regimes page (commit 7e215ec);
the length histogram is the shipped one GNMT's clients draw from (lazybatch/client/seq2seq.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from benchmarks.harness import command_line, git_commit, write_json

from lazybatch.batcher.decisions import DecisionLog
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.batcher.lengths import LengthHistogram
from lazybatch.batcher.policies.eager import DecoderAdmission, EagerBatching
from lazybatch.batcher.policies.spec import parse_policy
from lazybatch.formats.histograms import shipped_histogram
from lazybatch.simulator import workload
from lazybatch.simulator.engine import Simulation
from lazybatch.simulator.loads_on_table import single_request_ms
from lazybatch.simulator.mixed import simulate_mixed
from lazybatch.traffic import TrafficClass

POLICIES = {"eager": "eager", "eager (Eq. 2 admission)": "eager:admission=eq2",
            "eager (admit up to the cap)": "eager:admission=first_token",
            "join-or-wait (clairvoyant)": "clairvoyant", "join-or-wait (expected lengths)": "eager:join=benefit",
            "triton_0us": "graph:0", "triton_5000us": "graph:5", "triton_20000us": "graph:20"}
TRITON = [p for p in POLICIES if p.startswith("triton")]


def alone_s(table: LatencyTable, r) -> float:
    """A request's run alone: every stage it visits (encoder and decoder steps) at batch 1."""
    return sum(table.single[s] for s in table.graph.stage_visits(r.enc_steps, r.dec_steps))


class KnownLengths(DecoderAdmission):
    """Decoder admission told every request's true output length instead of predicting it from the histogram."""

    def steps_left(self, r, done: int) -> int:
        return max(1, r.dec_steps - done)


class Clairvoyant(EagerBatching):
    """``eager:join=benefit`` told every request's true output length: the rule's ceiling, not a servable policy."""

    decoder_admission = KnownLengths


def replay(table: LatencyTable, hist: LengthHistogram, load: float, t1: float, seeds: int, n: int) -> dict:
    out = {}
    for name, text in POLICIES.items():
        lat, wait, stretch, alone = [], [], [], []
        for seed in range(seeds):
            reqs = workload.requests(workload.poisson(load / t1, n, seed, graph=table.graph, lengths=hist), 5.0)
            policy = (Clairvoyant(table.max_batch_size, length_histogram=hist, join="benefit") if text == "clairvoyant"
                      else parse_policy(text).build(max_batch_size=table.max_batch_size, length_histogram=hist))
            Simulation(table, policy, log=DecisionLog(1, enabled=False)).run(reqs)
            for r in reqs:
                lat.append(r.finish - r.arrival)
                wait.append(r.start - r.arrival)
                alone.append(alone_s(table, r))
                stretch.append((r.finish - r.arrival) / alone[-1])
        out[name] = {"avg_ms": statistics.fmean(lat) * 1e3, "wait_to_start_ms": statistics.fmean(wait) * 1e3,
                     "latency_over_alone": statistics.fmean(stretch), "alone_ms": statistics.fmean(alone) * 1e3}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", required=True, help="GNMT's latency table (a served model's latency.json, or "
                    "bench_regimes' build/gnmt/gnmt_latency_b8.json)")
    ap.add_argument("--loads", default="0.7,1.2,1.5", help="fractions of the table's batch-1 rate")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=600, help="Poisson requests per seed and cell")
    ap.add_argument("--out", default=None, help="write the figures here as JSON")
    args = ap.parse_args(argv)
    table = LatencyTable.load(args.table)
    hist = LengthHistogram.load(shipped_histogram(None))
    t1_ms = single_request_ms(table, hist)
    t1 = t1_ms / 1e3
    loads = [float(x) for x in args.loads.split(",")]
    # the interactive floor: the share of requests whose own run alone is longer than 2 x t1
    drawn = workload.requests(workload.poisson(1.0, 20000, 7, graph=table.graph, lengths=hist), 5.0)
    floor = sum(alone_s(table, r) > 2 * t1 for r in drawn) / len(drawn)
    print(f"t1 on the table {t1_ms:.1f} ms; requests longer than 2 x t1 alone: {floor:.1%}")
    res = {"commit": git_commit(), "command": command_line(), "table": args.table, "t1_ms": t1_ms,
           "interactive_floor": floor, "loads": {}}
    classes = [TrafficClass("interactive", 0.2, 2 * t1_ms, 1), TrafficClass("bulk", 0.8, 20 * t1_ms, 2)]
    mixed = simulate_mixed(table, loads, classes, max_batch_size=table.max_batch_size, seeds=args.seeds,
                           requests=args.requests, histogram=hist, t1_ms=t1_ms,
                           policies={"eager": "eager:urgency=true", "triton_0us": "graph:0",
                                     "triton_5000us": "graph:5", "triton_20000us": "graph:20"})
    print("| load | policy | avg ms | wait to first stage ms | latency / own run alone |")
    print("|---|---|---|---|---|")
    for load in loads:
        cells = replay(table, hist, load, t1, args.seeds, args.requests)
        best = min(TRITON, key=lambda p: cells[p]["avg_ms"])
        mine = {c["policy"]: c["classes"]["interactive"]["violations"] for c in mixed["cells"] if c["load"] == load}
        tbest = min((p for p in mine if p != "eager"), key=mine.get)
        res["loads"][str(load)] = {
            "policies": cells, "best_triton": best,
            "ratio_best_triton_over_eager": cells[best]["avg_ms"] / cells["eager"]["avg_ms"],
            "ratio_best_triton_over_join_or_wait": {
                k: cells[best]["avg_ms"] / cells[f"join-or-wait ({k})"]["avg_ms"] for k in ("clairvoyant",
                                                                                          "expected lengths")},
            # no schedule's mean is below the mean run alone of the same requests: the ceiling for any policy
            "ratio_ceiling_any_policy": cells[best]["avg_ms"] / cells["eager"]["alone_ms"],
            "mixed_interactive_misses": mine, "mixed_best_triton": tbest,
            "mixed_ratio_eager": mine[tbest] / mine["eager"] if mine["eager"] else float("inf"),
            "mixed_ratio_ceiling_any_policy": mine[tbest] / floor if floor else float("inf")}
        for name, c in cells.items():
            print(f"| {load:.0%} | {name} | {c['avg_ms']:.1f} | {c['wait_to_start_ms']:.1f} | "
                  f"{c['latency_over_alone']:.2f} |")
    for load, r in res["loads"].items():
        jw = r["ratio_best_triton_over_join_or_wait"]
        print(f"{float(load):.0%}: best Triton ({r['best_triton']}) / eager average {r['ratio_best_triton_over_eager']:.2f}x"
              f" (join-or-wait {jw['expected lengths']:.2f}x, clairvoyant {jw['clairvoyant']:.2f}x)"
              f" (any policy at most {r['ratio_ceiling_any_policy']:.2f}x); interactive misses "
              f"{r['mixed_best_triton']} / eager {r['mixed_ratio_eager']:.1f}x (any policy at most "
              f"{r['mixed_ratio_ceiling_any_policy']:.1f}x: {r['mixed_interactive_misses'][r['mixed_best_triton']]:.1%}"
              f" against the floor {floor:.1%})")
    if args.out:
        write_json(args.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
