"""Token streaming: time to first token under load against its unloaded value, on a real tritonserver.

    python -m benchmarks.bench_streaming                       # the LM: loads 50/90/120%, 2 repetitions of 20 s
    python -m benchmarks.bench_streaming --model gnmt --loads 0.9 --reps 3 --duration 12   # GNMT (or transformer)
    python -m benchmarks.bench_streaming --loads 0.9 --reps 3 --duration 30
    python -m benchmarks.bench_streaming --driver perf_analyzer --loads 0.9 --reps 3   # the load from perf_analyzer

Goal (docs/results/streaming.md): time to first token (TTFT) at 90% of the batch-1 rate <= 2x its unloaded value, under
lazybatch's default policy (eager), with the model decoupled (`repo add --decoupled`: each token is sent as it is
made), which admits up to the batch cap (`admission=first_token`). Beside it eager with the batch-curve admission
of models that answer once (`eager_curves`: every deadline that can still be met must hold), and the same model,
also streaming, under Triton's own dynamic batcher at 0/5/20 ms (`triton:<us>`: each batch decoded to its end in one
execute, so a request that arrives meanwhile waits for the whole batch before its first token).

Unloaded: at the start of every repetition, 20 requests of the model's chat-like lengths, one at a time, the policies
taking turns request by request (4 warm-ups each); the batch-1 rate is 1 / the first repetition's mean end-to-end
latency under triton_0us (as benchmarks/bench_decoder.py). Loaded: `lazybatch load`'s open-loop Poisson
client, which streams a decoupled model and times each request's parts (client/stream.py). TTFT ratio = mean TTFT
at the load / mean unloaded TTFT of the same policy in the same repetition; mean [min-max] over repetitions, a range that
straddles the goal is a tie. Time per output token (after the first) is reported beside it. The raw cells go to
OUT/streaming.json; ``--data`` copies them into the docs.

``--driver perf_analyzer``: the loaded cells come from NVIDIA perf_analyzer instead (`lazybatch perf`: Poisson
request rate, --streaming, every request's timestamps from its --profile-export-file; three measurement windows of
a third of --duration each, usually three), for eager and eager_curves only: Triton's batcher leaves requests waiting tens of
seconds past capacity, longer than perf_analyzer's windows, and is compared under `lazybatch load`. The unloaded
values are measured as above.
"""

from __future__ import annotations

import argparse
import json
import asyncio
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from tqdm import tqdm

from benchmarks.harness import (add_perf_arrivals_arg, add_sweep_args, command_line, machine_meta, parse_sweep_args,
                                perf_row, seq2seq_requests, served, write_json)
from lazybatch.client.load import run_load
from lazybatch.client.stream import StreamClient
from lazybatch.shipped import KIND_SLA_MS, build_default_repository
from benchmarks.reports.streaming import MODELS, POLICIES, report


def unloaded(url: str, kind: str, feeds: list[dict], warmup: int = 4) -> dict:
    """Per policy: mean TTFT, time per output token and end-to-end latency of requests sent one at a time, the
    policies taking turns request by request (so that a drift of the machine falls on all of them alike), after
    ``warmup`` untimed requests each."""
    async def go() -> dict:
        got: dict[str, list] = {p: [] for p in POLICIES}
        async with StreamClient(url) as c:
            for i, f in enumerate(feeds):
                order = list(POLICIES) if i % 2 == 0 else list(reversed(POLICIES))
                for pol in order:
                    got[pol].append(await c.generate(f"{kind}_{pol}", f, timeout_s=600))
        return got

    out = {}
    for pol, got in asyncio.run(go()).items():
        got = got[warmup:]
        bad = [a.error for a in got if not a.ok]
        if bad:
            raise SystemExit(f"{pol}: unloaded requests failed: {bad[:3]}")
        out[pol] = {"ttft_ms": statistics.fmean(a.ttft_s for a in got) * 1e3,
                    "ttft_p50_ms": statistics.median(a.ttft_s for a in got) * 1e3,
                    "tpot_ms": statistics.fmean(a.tpot_s for a in got if not math.isnan(a.tpot_s)) * 1e3,
                    "latency_ms": statistics.fmean(a.latency_s for a in got) * 1e3, "n": len(got)}
    return out


def run(args: argparse.Namespace, out: Path) -> dict:
    kind = args.model
    repo = build_default_repository(out / "repos" / kind, kind=kind, work=out / "build" / kind, policies=POLICIES,
                                    profile_reps=5, seq2seq_baselines=False, decoupled=True,
                                    stream_interval_tokens=args.stream_interval_tokens)
    sla_ms = KIND_SLA_MS[kind]
    cells, base = [], []
    with served(repo, out / "tritonserver.log", stats_dir=out / "stats") as server:
        url, http = server.endpoints.grpc, server.endpoints.http
        bar = tqdm(total=args.reps * (1 + len(args.loads)), desc="streaming", unit="cell")
        t1 = None
        for k in range(args.reps):  # each repetition: the unloaded values, then every load
            base.append(unloaded(url, kind, seq2seq_requests(http, f"{kind}_eager", args.unloaded + 4, seed=1 + k)))
            bar.update()
            if t1 is None:  # the batch-1 rate: fixed by the first repetition, so every repetition offers the same
                t1 = base[0]["triton_0us"]["latency_ms"] / 1e3
            tqdm.write(f"rep {k}: t1 {t1 * 1e3:.1f} ms (batch-1 rate {1 / t1:.2f}/s); unloaded TTFT "
                       + ", ".join(f"{p} {b['ttft_ms']:.1f} ms" for p, b in base[k].items()))
            loaded = list(POLICIES) if args.driver == "load" else ["eager", "eager_curves"]
            for f in args.loads:
                for pol in (loaded if k % 2 == 0 else list(reversed(loaded))):
                    cells.append({"load": f, "rep": k, "policy": pol, "driver": args.driver}
                                 | (perf_cell(url, f"{kind}_{pol}", f / t1, args.duration, k, out,
                                              seeded_arrivals=args.perf_arrivals == "seeded")
                                    if args.driver != "load"
                                    else load_cell(url, f"{kind}_{pol}", f / t1, args.duration, sla_ms, k)))
                    time.sleep(0.5)
                bar.update()
        bar.close()
    return {"model": kind, "t1_ms": t1 * 1e3, "sla_ms": sla_ms, "stream_interval_tokens": args.stream_interval_tokens,
            **({"perf_arrivals": args.perf_arrivals} if args.driver != "load" else {}),
            "unloaded": base, "cells": cells}


def load_cell(url: str, model: str, rate: float, duration: float, sla_ms: float, k: int) -> dict:
    r = run_load(url, model, rate, duration, sla_ms=sla_ms, seed=100 * k, timeout_s=600.0)
    assert r.streaming, "the model is decoupled: the load client must stream"
    return {"sent": r.sent, "ok": r.ok, "errors": r.errors, "ttft_avg_ms": r.ttft_avg_ms, "ttft_p50_ms": r.ttft_p50_ms,
            "ttft_p99_ms": r.ttft_p99_ms, "tpot_avg_ms": r.tpot_avg_ms, "avg_ms": r.avg_ms, "p99_ms": r.p99_ms,
            "throughput": r.throughput, "tokens": r.tokens}


def perf_cell(url: str, model: str, rate: float, duration: float, k: int, out: Path,
              seeded_arrivals: bool = False) -> dict:
    """One cell under perf_analyzer (harness.perf_row: --streaming, the TTFT from its profile export)."""
    row = perf_row(url, model, rate, duration, 100 * k, out, seeded_arrivals=seeded_arrivals)
    return {"sent": row["streamed_requests"] + row["unanswered_requests"], "ok": row["streamed_requests"],
            "errors": row["unanswered_requests"],
            "ttft_avg_ms": row["ttft_avg_ms"], "ttft_p50_ms": row["ttft_p50_ms"], "ttft_p99_ms": row["ttft_p99_ms"],
            "tpot_avg_ms": row["tpot_avg_ms"], "avg_ms": row["avg_ms"], "p99_ms": row["p99_ms"],
            "throughput": row["throughput"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_sweep_args(ap, loads="0.5,0.9,1.2", reps=2, duration=20.0, out="lazybatch-results/streaming",
                   data="docs/data/streaming.json")
    ap.add_argument("--model", choices=MODELS, default="lm", help="which model streams its tokens (default lm: the "
                    "decoder-only LM of the chat-like lengths; gnmt, transformer: the seq2seq models)")
    ap.add_argument("--unloaded", type=int, default=20, help="requests per policy for the unloaded values (20)")
    ap.add_argument("--driver", choices=("load", "perf_analyzer"), default="load",
                    help="what offers the load: lazybatch load's streaming client (default) or perf_analyzer")
    add_perf_arrivals_arg(ap, "--driver perf_analyzer")
    ap.add_argument("--stream-interval-tokens", type=int, default=1, metavar="K",
                    help="every model sends a response once a request holds K new tokens (config "
                         "stream_interval_tokens; default 1: every token); TTFT is then the time to the first K")
    ap.add_argument("--rerender", default=None, metavar="JSON",
                    help="print the report of a saved run (e.g. docs/data/streaming.json), measuring nothing")
    args = parse_sweep_args(ap, argv)
    if args.rerender:
        print("\n".join(report(json.loads(Path(args.rerender).read_text()))))
        return 0
    if args.stream_interval_tokens < 1:
        ap.error("--stream-interval-tokens must be at least 1")
    out = Path(args.out)
    res = {"meta": {**machine_meta(), "command": command_line()}, **run(args, out)}
    write_json(out / "streaming.json", res)
    print("\n".join(report(res)))
    if args.data:
        write_json(args.data, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
