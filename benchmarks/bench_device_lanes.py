"""Lanes 1 and 2 of a device group on this machine: a small model beside a large one on one tritonserver.

    python -m benchmarks.bench_device_lanes                       # 3 repetitions x 3 configurations x 20 s
    python -m benchmarks.bench_device_lanes --json docs/data/device_lanes.json

The device group's design (docs/colocation.md): "one job on the device at a time, or a configured number of lanes (measure 1 and 2 on this 2-core
machine and choose the default from the data)". The pair is the quickstart's: the 8-stage MLP (small) and ResNet-50
(large), both eager in one ``device_group``, driven at once by ``client/together.py`` (``lazybatch load
--together``): one open-loop Poisson stream per model, the small one at 30% of its batch-1 rate and the large one at
110% of its own (each from its served t1, measured once alone, sequential batch-1 requests, in the first server).
Configurations, each its own repository and server, taken in a rotated order per repetition:

- ``lanes 1``: ``device_lanes: "1"``, onnxruntime's default intra-op threads (one per core);
- ``lanes 2, every core``: ``device_lanes: "2"`` and ``intra_op_threads`` the machine's cores: two jobs at once,
  each with a pool as wide as the machine;
- ``lanes 2, cores shared``: ``device_lanes: "2"`` and no ``intra_op_threads``, the group's defaults since 73fc393:
  each model's pool the cores divided among the lanes (one thread each on 2 cores), two jobs at once; since a8a79c0
  a model alone on the device runs its whole graph on every core (``device_solo_intra_op_threads``);
- ``lanes 2, cores shared, narrow alone``: the same with ``device_solo_intra_op_threads: "0"`` (before a8a79c0).

After the pair, each server also serves the large model alone at the same rate (``--alone-duration``, once the
small model's last job is past the solo lease's window): what a grouped model gets with its siblings idle.

Per configuration and repetition: each model's avg and p99 latency and throughput, and the aggregate.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import command_line, fmt, machine_meta, spread, write_json
from benchmarks.harness.served import served
from lazybatch.backend.arbiter.sizing import usable_cores

SMALL, LARGE = "mlp", "resnet50"
CONFIGS = {"lanes 1": {"device_lanes": "1"},
           "lanes 2, every core": {"device_lanes": "2", "intra_op_threads": str(usable_cores())},
           "lanes 2, cores shared": {},  # the defaults: two lanes, the cores divided among them
           "lanes 2, cores shared, narrow alone": {"device_solo_intra_op_threads": "0"}}
GROUP = "dev0"


def build(root: Path, work: Path) -> dict[str, Path]:
    """One repository per configuration, the two models' stages and tables built once (``work``)."""
    from lazybatch.repo import add_model
    from lazybatch.shipped import KIND_MAX_BATCH, KIND_SLA_MS, build_default_repository

    scratch = root / "scratch"
    for kind in (SMALL, LARGE):
        build_default_repository(scratch, kind=kind, work=work, policies={"eager": "eager"}, log=lambda *a: None)
    repos = {}
    for k, (name, params) in enumerate(CONFIGS.items()):
        repo = root / f"repo{k}"
        for kind in (SMALL, LARGE):
            mbs = KIND_MAX_BATCH[kind]
            extra = {"device_group": GROUP, **{p: v for p, v in params.items() if p != "intra_op_threads"}}
            add_model(work / f"{kind}.onnx", repo, name=kind, policy="eager", sla_ms=KIND_SLA_MS[kind],
                      max_batch_size=mbs, stages=work / f"{kind}_stages",
                      latency_table=work / f"{kind}_latency_b{mbs}.json",
                      intra_op_threads=int(params.get("intra_op_threads", 0)), parameters=extra)
        repos[name] = repo
    return repos


def served_t1(url: str) -> dict[str, float]:
    from lazybatch.client.api import Client

    with Client(url) as c:
        return {m: c.median_latency(m, c.random_inputs(m, 1, seed=0), 200 if m == SMALL else 40, sla_ms=60_000)
                for m in (SMALL, LARGE)}


def one_run(repo: Path, arbiters: Path, t1: dict[str, float] | None, args: argparse.Namespace,
            log: Path) -> tuple[dict, dict[str, float]]:
    from lazybatch.backend.arbiter import protocol as P
    from lazybatch.backend.arbiter.client import query
    from lazybatch.client.together import run_together
    from lazybatch.shipped import KIND_SLA_MS

    env = {"LAZYBATCH_ARBITER_DIR": str(arbiters)}
    path = arbiters / P.group_paths(repo, GROUP)[0].name
    try:
        with served(repo, log, env=env, timeout=300) as server:
            url = server.endpoints.grpc
            if t1 is None:
                t1 = served_t1(url)
            rates = {SMALL: args.small_load / t1[SMALL], LARGE: args.large_load / t1[LARGE]}
            total = sum(rates.values())
            rows = run_together(url, {m: r / total for m, r in rates.items()}, total, args.duration,
                                sla_ms={m: KIND_SLA_MS[m] for m in rates}, seed=args.seed)
            lanes = query(path)["lanes"]
            time.sleep(P.SIBLING_WINDOW_S + 1.0)  # the small model's last job past the solo lease's window
            alone = run_together(url, {LARGE: 1.0}, rates[LARGE], args.alone_duration,
                                 sla_ms={LARGE: KIND_SLA_MS[LARGE]}, seed=args.seed + 1)
    finally:
        try:
            os.kill(query(path, timeout=2)["pid"], signal.SIGKILL)
        except (OSError, ConnectionError):
            pass
    out = {"lanes": lanes}
    for r in rows:
        out[r.model] = {"avg_ms": r.avg_ms, "p99_ms": r.p99_ms, "throughput": r.throughput,
                        "offered_rate": r.offered_rate, "sent": r.sent, "ok": r.ok, "errors": r.errors,
                        "lost": r.lost, "sla_violation_rate": r.sla_violation_rate}
    r = next(r for r in alone if r.model == LARGE)
    out["alone"] = {LARGE: {"avg_ms": r.avg_ms, "p99_ms": r.p99_ms, "throughput": r.throughput, "sent": r.sent,
                            "ok": r.ok, "errors": r.errors, "lost": r.lost}}
    return out, t1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of load per run")
    ap.add_argument("--alone-duration", type=float, default=10.0, help="seconds of the large model alone per run")
    ap.add_argument("--small-load", type=float, default=0.3, help="the small model's rate x its t1")
    ap.add_argument("--large-load", type=float, default=1.1, help="the large model's rate x its t1")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=None, help="keep the built models here (default: a temporary directory)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    meta = machine_meta()
    runs: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        work = Path(args.work) if args.work else root / "work"
        repos = build(root, work)
        arbiters = root / "arbiters"
        arbiters.mkdir()
        t1 = None
        names = list(CONFIGS)
        for rep in range(args.repetitions):
            for name in names[rep % len(names):] + names[:rep % len(names)]:  # rotated: no fixed predecessor
                t0 = time.monotonic()
                fig, t1 = one_run(repos[name], arbiters, t1, args, root / f"{rep}_{name}.log")
                fig["repetition"] = rep
                runs[name].append(fig)
                print(f"rep {rep} {name}: small {fig[SMALL]['avg_ms']:.2f}/{fig[SMALL]['p99_ms']:.2f} ms, large "
                      f"{fig[LARGE]['avg_ms']:.2f}/{fig[LARGE]['p99_ms']:.2f} ms (avg/p99), throughput "
                      f"{fig['(all)']['throughput']:.1f}/s; large alone {fig['alone'][LARGE]['avg_ms']:.2f}/"
                      f"{fig['alone'][LARGE]['p99_ms']:.2f} ms ({time.monotonic() - t0:.0f} s)", flush=True)
    summary = {}
    for name, rs in runs.items():
        summary[name] = {m: {k: spread([r[m][k] for r in rs]) for k in ("avg_ms", "p99_ms", "throughput")}
                         for m in (SMALL, LARGE, "(all)")}
        summary[name]["alone"] = {k: spread([r["alone"][LARGE][k] for r in rs]) for k in ("avg_ms", "p99_ms")}
    print(f"t1 served alone: {SMALL} {t1[SMALL] * 1e3:.2f} ms, {LARGE} {t1[LARGE] * 1e3:.2f} ms")
    for name, s in summary.items():
        print(f"{name:>18}: small avg {fmt(s[SMALL]['avg_ms'])} p99 {fmt(s[SMALL]['p99_ms'])}; large avg "
              f"{fmt(s[LARGE]['avg_ms'])} p99 {fmt(s[LARGE]['p99_ms'])}; throughput {fmt(s['(all)']['throughput'], 1)}/s; "
              f"large alone avg {fmt(s['alone']['avg_ms'])} p99 {fmt(s['alone']['p99_ms'])}")
    if args.json:
        write_json(args.json, {"meta": {**meta, "command": command_line(), "repetitions": args.repetitions,
                                        "duration_s": args.duration, "alone_duration_s": args.alone_duration,
                                        "small_load": args.small_load,
                                        "large_load": args.large_load, "seed": args.seed,
                                        "t1_ms": {m: v * 1e3 for m, v in t1.items()},
                                        "configs": CONFIGS},
                               "runs": runs, "summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
