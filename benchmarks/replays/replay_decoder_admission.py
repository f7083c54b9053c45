"""Eager's decoder admission as served at commit 8f5b84f (the backend handed it no length histogram: one more step
predicted per row) replayed beside the curves with the histogram and Eq. 2, on the tables of that served run.

    python -m benchmarks.replays.replay_decoder_admission docs/data/decoder_admission_replay.json

Reads lazybatch-results/decoder-r2/repos/ (bench_decoder.py's --out of docs/results/decoder.md); 3 seeds x 400
Poisson requests per cell, SLA 5 s, as bench_decoder's replay."""
import argparse, json, statistics, sys
from pathlib import Path
from benchmarks.harness import command_line, served_table
from lazybatch.simulator.loads_on_table import single_request_ms
from lazybatch.simulator import workload
from lazybatch.simulator.engine import Simulation
from lazybatch.batcher.policies import parse_policy


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="where the cells are written (JSON)")
    args = ap.parse_args(argv)
    out = {"commit_of_tables": "8f5b84f", "cells": [], "command": command_line()}
    for kind in ("lm", "gnmt", "transformer"):
        tab, hist = served_table(Path(f"lazybatch-results/decoder-r2/repos/{kind}/{kind}_eager/1"))
        t1 = single_request_ms(tab, hist) / 1e3
        for load in (1.5, 3.0):
            for name, text, h in (("served_8f5b84f", "eager", None), ("curves", "eager", hist), ("eq2", "eager:admission=eq2", hist)):
                avg, p99 = [], []
                for seed in range(3):
                    reqs = workload.requests(workload.poisson(load / t1, 400, seed, graph=tab.graph, lengths=hist), 5.0)
                    Simulation(tab, parse_policy(text).build(max_batch_size=tab.max_batch_size, length_histogram=h)).run(reqs)
                    lat = sorted(r.finish - r.arrival for r in reqs)
                    avg.append(statistics.fmean(lat) * 1e3); p99.append(lat[int(0.99 * len(lat))] * 1e3)
                c = {"model": kind, "load": load, "admission": name, "avg_ms": statistics.fmean(avg), "p99_ms": statistics.fmean(p99)}
                out["cells"].append(c); print(c, flush=True)
    json.dump(out, open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
