"""The backend's own cost per request, against the whole graph's batch-1 time measured in the same run.

    python -m benchmarks.bench_overhead                      # the 8-stage MLP (8 x 2048), 7 rounds x 2000 turns
    python -m benchmarks.bench_overhead --json docs/data/overhead_mlp.json     # about 5 minutes on 2 cores

Goal (the backend's own cost, docs/triton.md): on the 8-stage MLP, what lazybatch adds to a request
served alone (its scheduler thread, the hand-off, tensors joined and split, the response) is at most 3% of the whole
graph's batch-1 time t1.

How: one process, no server (the server's gRPC and Python-backend costs are the same for every policy and are not
the scheduler's). t1 is the verified whole-graph session the backend itself holds, run directly; each policy serves
the same requests one at a time through the BackendRuntime (submit -> answer). ``eager`` is the route a request
takes by default when it finds the scheduler idle: the inline pass Triton's ``execute`` runs
(``InlineRoute.run``: the policy's decision, the pass, the statistics and recalibration);
``eager (scheduler)`` is the route through the scheduler thread, which requests take while it holds work. Within a
round the routes take turns request by request (t1 and every policy once per turn, in a new random order each turn),
so the machine's drift over seconds lands on all of them alike, and so does the route run just before (in the
earlier form, blocks of a few seconds per route, one round's t1 could sit 20% off the next's). Every figure is a
median per round, reported as mean [min-max] over rounds. The backend's cost is (median served latency - median t1) / median t1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import numpy as np
from tqdm import tqdm

from benchmarks.harness import command_line, fmt, judge_spread, machine_meta, spread, write_json
from benchmarks.harness.inprocess import Answered, mlp_stages, runtime_latencies, whole_graph_latencies
from lazybatch.backend.fusion import fuse, measure_fused_ratio
from lazybatch.backend.runtime import BackendRuntime
from lazybatch.backend.stages import StageRunner
from lazybatch.backend.stage_profile import profile_batch_sizes
from lazybatch.batcher.policies import parse_policy

# name -> policy spec; "eager" runs inline (InlineRoute.run), the rest through the scheduler thread
POLICIES = {"eager": "eager", "eager (scheduler)": "eager", "eager:spans=false": "eager:spans=false",
            "lazy": "lazy"}
GOAL = 0.03


def one_round(whole, runtimes: dict[str, BackendRuntime], x: np.ndarray, requests: int,
              rng: np.random.Generator) -> dict[str, float]:
    """t1 and every route, taking turns request by request, in a new random order each turn: the route before
    decides how warm onnxruntime's thread pool and the caches are, so a fixed rotation would give each route the
    same predecessor (measured: -2.7% "cost" for a route always run right after t1)."""
    # "t1 again": the same call under a second name, the instrument's noise floor (its ratio to t1 should be 1.00)
    routes: dict[str, Callable[[], float]] = {"t1": lambda: whole_graph_latencies(whole, x, 1)[0],
                                 "t1 again": lambda: whole_graph_latencies(whole, x, 1)[0]}
    for name, rt in runtimes.items():
        routes[name] = lambda rt=rt: runtime_latencies(rt, x, 1)[0]
    names = list(routes)
    times: dict[str, list[float]] = {name: [] for name in names}
    inline_before = {name: rt.settled_stats().inline_requests for name, rt in runtimes.items()}
    for _ in range(requests):
        for j in rng.permutation(len(names)):  # shuffled, so each route follows every other one alike
            times[names[j]].append(routes[names[j]]())
    fig = {"t1_ms": statistics.median(times["t1"]) * 1e3}
    fig["t1_again_cost"] = statistics.median(times["t1 again"]) * 1e3 / fig["t1_ms"] - 1
    for name, rt in runtimes.items():
        fig[f"{name}_ms"] = statistics.median(times[name]) * 1e3
        fig[f"{name}_inline_share"] = (rt.settled_stats().inline_requests - inline_before[name]) / requests
        fig[f"{name}_cost"] = (fig[f"{name}_ms"] - fig["t1_ms"]) / fig["t1_ms"]
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000,
                    help="turns per round: each route serves one request a turn (2000)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", default=None, help="write the raw figures here")
    args = ap.parse_args(argv)
    meta = machine_meta()
    with tempfile.TemporaryDirectory() as tmp:
        model, stages = mlp_stages(Path(tmp))
        runner = StageRunner(stages, execution_provider="cpu")
        table = runner.profile(profile_batch_sizes(16), reps=3)
        whole = fuse(runner, table, model, execution_provider="cpu", intra_op_threads=0, name="mlp")[0]
        x = np.random.default_rng(0).standard_normal((1, 2048)).astype(np.float32)
        runtimes = {}
        for name, spec in POLICIES.items():
            policy = parse_policy(spec).build(max_batch_size=16)
            eager = spec.startswith("eager")
            if eager:  # as the server builds it (backend/model_kinds.py)
                policy.measured_costs(fused_ratio=measure_fused_ratio(runner, whole))
            rt = BackendRuntime(runner, type(table).from_dict(table.to_dict()), policy, Answered(), name=name,
                                whole_runner=whole if eager else None, inline=name == "eager")
            runtime_latencies(rt, x, 20)  # warm-up
            runtimes[name] = rt
        rng = np.random.default_rng(0)
        rounds = [one_round(whole, runtimes, x, args.requests, rng)
                  for _ in tqdm(range(args.rounds), desc="rounds", unit="round")]
        for rt in runtimes.values():
            rt.close()
    summary = {key: spread([r[key] for r in rounds]) for key in rounds[0]}
    print(f"whole graph t1 (the backend's own whole-graph session, run directly): {fmt(summary['t1_ms'], 3, ' ms')}")
    print(f"noise floor, the same call again / t1 - 1: "
          f"{fmt({k: v * 100 for k, v in summary['t1_again_cost'].items()}, 1, '%')}")
    for name in POLICIES:
        print(f"{name:>18}: served alone {fmt(summary[f'{name}_ms'], 3, ' ms')}; backend's own cost / t1 "
              f"{fmt({k: v * 100 for k, v in summary[f'{name}_cost'].items()}, 1, '%')}; inline "
              f"{summary[f'{name}_inline_share']['mean']:.0%} of requests")
    eager = summary["eager_cost"]
    print(f"goal: eager's cost <= {GOAL:.0%} of t1 -> {judge_spread(eager, GOAL, lower_is_better=True)} "
          f"(mean {eager['mean']:.1%}, worst round {eager['max']:.1%}); through the scheduler thread "
          f"{summary['eager (scheduler)_cost']['mean']:.1%}; stage by stage (eager:spans=false) / eager served "
          f"latency: {summary['eager:spans=false_ms']['mean'] / summary['eager_ms']['mean']:.2f}x")
    if args.json:
        write_json(args.json, {"meta": {**meta, "command": command_line(), "requests": args.requests,
                                        "rounds": args.rounds, "goal": GOAL},
                               "rounds": rounds, "summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
