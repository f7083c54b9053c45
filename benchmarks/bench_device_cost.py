"""The device scheduler's own cost per stage job (its goal: <= 2% of t1 on the 8-stage MLP, docs/colocation.md).

    python -m benchmarks.bench_device_cost                      # 7 rounds x 400 turns, about 2 minutes on 2 cores
    python -m benchmarks.bench_device_cost --json docs/data/device_cost_mlp.json

Measured as the backend's own cost is (benchmarks/bench_overhead.py): one process, no server, requests sent one at
a time through a ``BackendRuntime``'s scheduler thread, the routes taking turns request by request in a new random
order each turn, a median per route and round, reported as mean [min-max] over rounds. Routes:

- ``t1``: the whole graph's batch-1 time (the backend's own fused session, run directly); ``t1 again`` the same
  call under a second name, the instrument's noise floor.
- ``none``: the model with ``device_group: "none"`` through the scheduler thread (eager, its spans: one job).
- ``none, stage jobs``: the same with ``eager:spans=false``: one job per stage, as a grouped model runs while
  another member is joined (the device cuts spans, ``SharedDevice.shared``). The baseline of the per-job cost.
- ``group, idle member``: a grouped model beside a second member that joined and never asks: the arbiter gives
  the model the solo lease (backend/arbiter/protocol.py), so it sends nothing per job and keeps its spans; its
  cost is measured per request against ``none`` (one job, the span, per request).
- ``group, active member``: beside a second member that asks for the device about once a millisecond (a raw
  protocol member at a less urgent priority level, whose jobs run 0 s): while the model runs, both wait at each
  boundary, so every grant is a contended decision (logged), the per-job path whatever lease rule applies to an
  uncontended member. It is granted in the model's idle gaps; a request that arrives while it holds its grant waits
  for its round trip (part of the cost, as beside any active neighbour).

Cost per stage job = (median grouped latency - median ``none, stage jobs`` latency) / stage jobs per request (the
gate's grants per request, 8), per round; as a share of t1 of the same round. Under the lease (no grant from the
arbiter in a round) the job is the whole span and the baseline ``none``. The verdict against 2% is
``harness.verdict`` on the range over rounds. The cost of cutting spans (``none, stage jobs`` against ``none``) is
reported beside it: it is what any shared device pays for its boundaries, not the arbiter's.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from benchmarks.harness import command_line, fmt, judge_spread, machine_meta, spread, write_json
from benchmarks.harness.inprocess import Answered, mlp_stages, runtime_latencies, whole_graph_latencies
from lazybatch.backend.arbiter import protocol as P
from lazybatch.backend.arbiter.client import attach, query
from lazybatch.backend.fusion import fuse, measure_fused_ratio
from lazybatch.batcher.policies.backend_hooks import serving_costs
from lazybatch.backend.runtime import BackendRuntime
from lazybatch.backend.stages import StageRunner
from lazybatch.backend.stage_profile import profile_batch_sizes
from lazybatch.batcher.policies import parse_policy

GOAL = 0.02  # of t1, per stage job
ROUTES = ("none", "none, stage jobs", "group, idle member", "group, active member")
GROUPED = ("group, idle member", "group, active member")

# the active neighbour: joins at a less urgent level, asks about once a millisecond, gives each grant back at once
ACTIVE = r"""
import socket, sys, time
from lazybatch.backend.arbiter import protocol as P
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
def reply():  # the arbiter's next message: its code (W and G carry flags and instants, G a budget too; V nothing)
    code = s.recv(1)
    body = P.REPLY_SIZES.get(code, 1) - 1
    while body:
        body -= len(s.recv(body))
    return code
s.sendall(P.join_message("neighbour", 1.0, 1))
reply()  # W
period = float(sys.argv[2])
while True:
    time.sleep(period)
    s.sendall(P.acquire_message(time.monotonic() + 1.0, 1))
    code = reply()
    while code == P.REVOKE:  # a lease from an earlier grant goes back: F and the A above are on their way
        code = reply()
    if code != P.GRANT:
        break
    s.sendall(P.FINISHED + P.F64.pack(0.0) + P.NOTHING)  # any F ends a lease granted with G
"""


def _runtime(runner, table, whole, spec: str, name: str) -> BackendRuntime:
    policy = parse_policy(spec).build(max_batch_size=16)
    costs = serving_costs(policy)
    if costs is not None:  # as the server builds eager (backend/model_kinds.py)
        costs.measured_costs(fused_ratio=measure_fused_ratio(runner, whole))
    # a grouped model never runs inline; the baselines take the same route
    return BackendRuntime(runner, type(table).from_dict(table.to_dict()), policy, Answered(), name=name,
                          whole_runner=whole, inline=False)


def one_round(whole, runtimes: dict[str, BackendRuntime], gates: dict, x: np.ndarray, requests: int,
              rng: np.random.Generator) -> dict[str, float]:
    routes: dict[str, Callable[[], float]] = {"t1": lambda: whole_graph_latencies(whole, x, 1)[0],
                                              "t1 again": lambda: whole_graph_latencies(whole, x, 1)[0]}
    for name, rt in runtimes.items():
        routes[name] = lambda rt=rt: runtime_latencies(rt, x, 1)[0]
    names = list(routes)
    times: dict[str, list[float]] = {n: [] for n in names}
    grants_before = {n: g.grants for n, g in gates.items()}
    for _ in range(requests):
        for j in rng.permutation(len(names)):
            times[names[j]].append(routes[names[j]]())
    fig = {"t1_ms": statistics.median(times["t1"]) * 1e3}
    fig["t1_again_cost"] = statistics.median(times["t1 again"]) * 1e3 / fig["t1_ms"] - 1
    for name in runtimes:
        fig[f"{name}_ms"] = statistics.median(times[name]) * 1e3
    fig["cut_spans_us"] = (fig["none, stage jobs_ms"] - fig["none_ms"]) * 1e3
    for name, g in gates.items():
        grants = (g.grants - grants_before[name]) / requests
        leased = grants == 0  # the solo lease: granted locally, one job (the span) per request
        fig[f"{name}_grants"] = grants
        fig[f"{name}_leased"] = float(leased)
        fig[f"{name}_jobs"] = jobs = 1.0 if leased else grants
        baseline = fig["none_ms"] if leased else fig["none, stage jobs_ms"]
        per_job_ms = (fig[f"{name}_ms"] - baseline) / jobs
        fig[f"{name}_per_job_us"] = per_job_ms * 1e3
        fig[f"{name}_per_job_of_t1"] = per_job_ms / fig["t1_ms"]
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=400, help="turns per round: each route serves one request a turn")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--period-ms", type=float, default=1.0, help="the active neighbour asks this often")
    ap.add_argument("--json", default=None, help="write the raw figures here")
    args = ap.parse_args(argv)
    meta = machine_meta()
    procs: list[subprocess.Popen] = []
    socks: list[socket.socket] = []
    runtimes: dict[str, BackendRuntime] = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["LAZYBATCH_ARBITER_DIR"] = tmp  # this run's own arbiters
        model, stages = mlp_stages(Path(tmp))
        runner = StageRunner(stages, execution_provider="cpu")
        table = runner.profile(profile_batch_sizes(16), reps=3)
        whole = fuse(runner, table, model, execution_provider="cpu", intra_op_threads=0, name="mlp")[0]
        x = np.random.default_rng(0).standard_normal((1, 2048)).astype(np.float32)
        gates = {}
        decisions: dict[str, int] = {}
        try:
            runtimes["none"] = _runtime(runner, table, whole, "eager", "none")
            runtimes["none, stage jobs"] = _runtime(runner, table, whole, "eager:spans=false", "stagejobs")
            for name, group in (("group, idle member", "idle"), ("group, active member", "active")):
                rt = _runtime(runner, table, whole, "eager", group)
                gates[name] = attach(rt, group, tmp, group)
                path = P.group_paths(tmp, group)[0]
                if group == "idle":
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.connect(str(path))
                    s.sendall(P.join_message("neighbour", 1.0, 1))
                    socks.append(s)
                else:
                    procs.append(subprocess.Popen([sys.executable, "-c", ACTIVE, str(path),
                                                   str(args.period_ms / 1e3)]))
                runtimes[name] = rt
            time.sleep(0.5)  # both neighbours joined
            for rt in runtimes.values():
                runtime_latencies(rt, x, 50)  # warm-up
            rng = np.random.default_rng(0)
            rounds = [one_round(whole, runtimes, gates, x, args.requests, rng)
                      for _ in tqdm(range(args.rounds), desc="rounds", unit="round")]
            for name, group in (("group, idle member", "idle"), ("group, active member", "active")):
                stats = query(P.group_paths(tmp, group)[0])
                decisions[name] = sum(m["decisions"] for m in stats["members"])
                assert len(stats["members"]) == 2, stats
        finally:
            for rt in runtimes.values():
                rt.close()
            for p in procs:
                p.kill()
                p.wait()
            for s in socks:
                s.close()
            for group in ("idle", "active"):
                try:
                    os.kill(query(P.group_paths(tmp, group)[0], timeout=2)["pid"], 9)
                except (OSError, ConnectionError):
                    pass
    summary = {key: spread([r[key] for r in rounds]) for key in rounds[0]}
    pct = lambda s: {k: (v * 100 if k != "n" else v) for k, v in s.items()}  # noqa: E731
    print(f"t1 (whole graph, batch 1): {fmt(summary['t1_ms'], 3, ' ms')}; noise floor (t1 again / t1 - 1) "
          f"{fmt(pct(summary['t1_again_cost']), 1, '%')}")
    for name in ROUTES:
        print(f"{name:>22}: {fmt(summary[f'{name}_ms'], 3, ' ms')} per request")
    print(f"cutting spans (stage jobs - one job): {fmt(summary['cut_spans_us'], 0, ' us')} per request")
    verdicts = {}
    for name in GROUPED:
        share = summary[f"{name}_per_job_of_t1"]
        verdicts[name] = judge_spread(share, GOAL, lower_is_better=True)
        how = ("the solo lease: no grant from the arbiter, one job (the span) per request, against none"
               if summary[f"{name}_leased"]["min"] == 1 else f"{summary[f'{name}_grants']['mean']:.2f} grants/request")
        print(f"{name:>22}: {how}; cost per job "
              f"{fmt(summary[f'{name}_per_job_us'], 1, ' us')} = {fmt(pct(share), 2, '% of t1')} -> "
              f"{verdicts[name]} (goal <= {GOAL:.0%}); contended decisions {decisions[name]}")
    if args.json:
        write_json(args.json, {"meta": {**meta, "command": command_line(), "requests": args.requests,
                                        "rounds": args.rounds, "period_ms": args.period_ms, "goal": GOAL},
                               "rounds": rounds, "summary": summary, "verdicts": verdicts,
                               "decisions": decisions})
    return 0


if __name__ == "__main__":
    sys.exit(main())
