"""What eager costs over Triton's batcher at light load, and which of its parts costs it: a diagnostic, not a benchmark.

    python -m benchmarks.probes.probe_idle_cost --model mlp --rounds 6 --requests 150

At 10% load eager serves every request inline, on the same whole graph as Triton's batcher (docs/results/default.md),
yet measured 0.91x of it on the MLP and MobileNet. This probe serves one repository with Triton's batcher at 0 ms
(twice: the second copy is the noise floor), eager, and eager with one of its parts switched off per model (metrics,
the response thread, the idle-time memory release, the cancellation watcher's pace), and sends requests one at a
time with an exponential idle gap before each (the light-load regime: nothing queues, the server idles between
requests), one to every model per cycle in a fresh random order, so that the machine's drift lands on all alike. Per model: the median latency
per round, and its ratio to Triton 0 ms paired by cycle (per round, the median over cycles of Triton's latency / the
model's in the same cycle; mean [min-max] over rounds), and the CPU time per request of
the model's stub process and of tritonserver (from /proc, Linux).

Seq2seq and decoder models (`--model gnmt|transformer|lm`): each cycle sends one request of the model's histogram
lengths, the same one to every model, and t1 is the mean over 30 such requests; Triton's batcher decodes each group
to its end in one execute (`triton:<us>`, as benchmarks/bench_decoder.py serves it).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from benchmarks.harness import command_line, fmt, machine_meta, seq2seq_requests, spread, write_json, served
from benchmarks.harness.procs import cpu_seconds, processes

from lazybatch import shipped as repo_mod
from lazybatch.client.api import Client

# suffix -> (policy, parameters switched from the default)
VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "triton_0us": ("triton:0", {}),
    "triton_0us_twin": ("triton:0", {}),
    # more identical copies: with all of them in one sweep, any systematic difference is the order's (a position
    # effect of the turns), not a configuration's
    "triton_0us_twin2": ("triton:0", {}),
    "triton_0us_twin3": ("triton:0", {}),
    "eager": ("eager", {}),
    "eager_nometrics": ("eager", {"metrics": "false"}),
    "eager_norespthread": ("eager", {"response_thread": "false"}),
    "eager_nomemrelease": ("eager", {"memory_release_ms": "0"}),
    "eager_cancel1s": ("eager", {"cancel_poll_ms": "1000"}),
    # every part above off at once: what is left is the scheduler's idle thread and the stage sessions' memory
    "eager_bare": ("eager", {"metrics": "false", "response_thread": "false", "memory_release_ms": "0",
                             "cancel_poll_ms": "1000"}),
}

EXTRA = ("triton_0us_twin2", "triton_0us_twin3", "eager_bare")  # asked for by name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mlp", choices=repo_mod.SHIPPED_MODELS)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--requests", type=int, default=150, help="sequential requests per model and round")
    ap.add_argument("--gap", type=float, default=9.0, help="mean idle gap between requests, in multiples of t1 "
                                                            "(9: the spacing of 10%% load)")
    ap.add_argument("--variants", default=",".join(n for n in VARIANTS if n not in EXTRA),
                    help=f"suffixes to serve, comma-separated (default: all but {', '.join(EXTRA)})")
    ap.add_argument("--out", default="lazybatch-results/idle-cost")
    ap.add_argument("--json", default=None, help="also write the per-round figures here (raw data for the docs)")
    args = ap.parse_args(argv)
    names = args.variants.split(",")
    out = Path(args.out)
    repo = repo_mod.build_default_repository(out / "repos" / args.model, kind=args.model,
                                             work=out / "build" / args.model,
                                             policies={n: VARIANTS[n][0] for n in names}, profile_reps=5,
                                             parameters={n: VARIANTS[n][1] for n in names if VARIANTS[n][1]},
                                             seq2seq_baselines=False)  # triton_<us>: Triton's own batcher
    rng = random.Random(0)
    lat: dict[str, list[float]] = {n: [] for n in names}
    ratio: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    cpu_server: dict[str, list[float]] = {}
    with served(repo, out / f"tritonserver_{args.model}.log") as server, Client(server.endpoints.grpc) as c:
        ref = f"{args.model}_triton_0us"
        x = c.random_inputs(ref, 1, seed=0)
        # seq2seq models: one request of histogram lengths per cycle, the same one to every model (paired)
        feeds = seq2seq_requests(server.endpoints.http, ref, args.rounds * args.requests + 30, seed=0) or [x]
        t1 = statistics.fmean(c.latencies(ref, feeds[-30:], 30, warmup=3, sla_ms=60_000)) if len(feeds) > 1 \
            else c.median_latency(ref, x, 30, sla_ms=60_000)
        print(f"{args.model}: t1 {t1 * 1e3:.2f} ms; gap mean {args.gap * t1 * 1e3:.1f} ms")
        procs = processes(server.proc.pid)
        models = {n: f"{args.model}_{n}" for n in names}
        for n in names:
            for k in range(3):
                c.infer(models[n], feeds[k % len(feeds)], sla_ms=60_000)
        for r in range(args.rounds):
            c0 = {n: cpu_seconds(procs[models[n]]) for n in names}
            s0 = cpu_seconds(procs["tritonserver"])
            vals: dict[str, list[float]] = {n: [] for n in names}
            for i in range(args.requests):  # one request per model per cycle, in a fresh random order
                x = feeds[(r * args.requests + i) % len(feeds)]
                for n in rng.sample(names, len(names)):
                    time.sleep(rng.expovariate(1.0 / (args.gap * t1)))
                    vals[n].append(c.timed_infer(models[n], x, sla_ms=60_000)[1])
            medians = {n: statistics.median(v) for n, v in vals.items()}
            for n in names:
                lat[n].append(medians[n] * 1e3)
                # paired: the median over cycles of Triton's latency / this model's in the same cycle
                ratio[n].append(statistics.median(a / b for a, b in zip(vals["triton_0us"], vals[n])))
                cpu[n].append((cpu_seconds(procs[models[n]]) - c0[n]) / args.requests * 1e3)
            cpu_server["all"] = cpu_server.get("all", []) + [(cpu_seconds(procs["tritonserver"]) - s0)
                                                            / (args.requests * len(names)) * 1e3]
            print(f"round {r + 1}: " + ", ".join(f"{n} {medians[n] * 1e3:.2f}" for n in names))
    print(f"tritonserver CPU ms per request (all models): {fmt(spread(cpu_server['all']))}")
    if args.json:
        write_json(args.json, {"meta": {**machine_meta(), "command": command_line(), "model": args.model,
                                         "t1_ms": t1 * 1e3, "gap_t1": args.gap, "requests": args.requests,
                                         "rounds": args.rounds},
                               "median_ms": lat, "paired_ratio_triton_0us": ratio, "stub_cpu_ms_per_request": cpu,
                               "tritonserver_cpu_ms_per_request": cpu_server["all"],
                               "summary": {n: {"median_ms": spread(lat[n]), "ratio": spread(ratio[n]),
                                               "stub_cpu_ms": spread(cpu[n])} for n in names}})
    print(f"\n{'model':<22} {'median ms':<22} {'Triton 0 ms / it':<22} stub CPU ms/req")
    for n in names:
        print(f"{n:<22} {fmt(spread(lat[n])):<22} {fmt(spread(ratio[n])):<22} {fmt(spread(cpu[n]))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
