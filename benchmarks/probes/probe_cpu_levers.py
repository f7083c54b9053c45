"""Which setting of the CPU share serves the quickstart's pair best (docs/colocation.md, "The CPU through the
operating system"): the nice a lowered model takes, and the shape of its onnxruntime pools.

    python -m benchmarks.probes.probe_cpu_levers                    # 3 x 4 s per configuration, the pair's loads
    python -m benchmarks.probes.probe_cpu_levers --reps 5 --json docs/data/cpu_levers.json

The pair (benchmarks/colocation/pair.py, the same arrivals, loads and turns) on one tritonserver, lazybatch's default
policy with the CPU share on in each variant of VARIANTS (its model directories hard-linked from the pair's
``<kind>_eager_shared`` with the variant's parameters), beside Triton 0 ms and 5 ms, each model alone under each
variant and under Triton 0 ms (what a variant costs a model with nothing to yield to). Per configuration and model it prints the average and p99 (mean [min-max] over the
repetitions), and the requests held on average by both models together (Little's law: a work-conserving reordering
keeps it about equal, so a variant above Triton's is wasting cores). A probe, not a results page: it prints and
writes its raw data to ``--json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

# suffix -> the CPU share's parameters beside cpu_share: auto (every variant lowers the large model beside the
# small), for both models, and each role's own on top ("small", "large": key=value)
VARIANTS: dict[str, dict[str, str]] = {
    # the shipped pair: nice 10, one pool per process, its workers parked in SCHED_IDLE while the model holds nothing
    "eager_shared": {},
    "eager_unparked": {"cpu_share_park": "false"},  # the process pool spinning at the model's weight
    "eager_per_session": {"use_per_session_threads": "true"},  # a pool per stage session, spinning off
    "eager_n5": {"cpu_share_nice": "5"},
    "eager_n19": {"cpu_share_nice": "19"},
    # the large model's parallel ops narrowed to one thread: a preempted thread stalls no sibling at a barrier
    "eager_n5_narrow": {"cpu_share_nice": "5", "large": "intra_op_threads=1"},
}
TRITON = ("triton_0us", "triton_5000us")


def add_variant(repository: Path, kind: str, suffix: str, parameters: dict[str, str]) -> None:
    """``<kind>_<suffix>``: the pair's shared model with ``parameters`` set (weights hard-linked, not copied)."""
    from lazybatch.backend.config_pbtxt import config_to_text, load_config

    src, dest = repository / f"{kind}_eager_shared", repository / f"{kind}_{suffix}"
    if suffix == "eager_shared":
        return
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, copy_function=lambda s, d: os.link(s, d))
    (dest / "config.pbtxt").unlink()  # a link: write a file of its own
    cfg = load_config(src / "config.pbtxt")
    cfg.name = dest.name
    from lazybatch.shipped import PAIR_KINDS

    for key, value in parameters.items():
        if key in PAIR_KINDS:  # one role's own, key=value
            if kind == PAIR_KINDS[key]:
                k, _, v = value.partition("=")
                cfg.parameters[k].string_value = v
            continue
        cfg.parameters[key].string_value = value
    (dest / "config.pbtxt").write_text(config_to_text(cfg))


def main(argv: list[str] | None = None) -> int:
    from benchmarks.colocation.pair import ROLES, pooled, measure
    from benchmarks.harness import command_line, machine_meta, served, write_json
    from benchmarks.harness.stats import fmt, spread
    from lazybatch.batcher.cpu_rank import NICE_STEPS
    from lazybatch.shipped import PAIR_KINDS, build_pair_repository

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repository", default="model_repository", help="the pair's repository (built where absent)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--duration", type=float, default=4.0, help="seconds per configuration and repetition")
    ap.add_argument("--json", default="lazybatch-results/probe_cpu_levers.json")
    args = ap.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}: choose from {', '.join(VARIANTS)}")
    repo = build_pair_repository(args.repository)
    for v in variants:
        for kind in PAIR_KINDS.values():
            add_variant(repo, kind, v, VARIANTS[v])
    log = Path(args.json).with_suffix(".tritonserver.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    prefixes = {role: PAIR_KINDS[role] for role in ROLES}
    with served(repo, log) as server:
        data = measure(server.endpoints.grpc, prefixes, duration_s=args.duration, reps=args.reps,
                       configs=(variants[0], *variants[1:], *TRITON), alone=(*variants, "triton_0us"),
                       server_pid=server.proc.pid, hand_nice=NICE_STEPS[1])
    meta = data["meta"]
    meta.update(machine_meta(), command=command_line(), variants={v: VARIANTS[v] for v in variants})
    print("| configuration | model | avg ms | p99 ms | requests held |")
    print("| --- | --- | --- | --- | --- |")
    for cfg in meta["configs"]:
        runs = [r for r in data["runs"] if r["mode"] == "together" and r["config"] == cfg]
        held = spread([sum(meta["rates"][r["role"]] * r["avg_ms"] / 1e3 for r in runs if r["rep"] == k)
                       for k in range(args.reps)])
        for role in ROLES:
            mine = [r for r in runs if r["role"] == role]
            print(f"| {cfg} | {role} | {fmt(spread([r['avg_ms'] for r in mine]), 1)} | "
                  f"{fmt(spread([r['p99_ms'] for r in mine]), 1)} | {fmt(held, 1)} |")
    for cfg in meta["alone"]:
        for role in ROLES:
            p = pooled([r for r in data["runs"] if r["mode"] == "alone" and r["config"] == cfg and r["role"] == role])
            print(f"| {cfg} alone | {role} | {p['avg_ms']:.1f} | {p['p99_ms']:.1f} | - |")
    write_json(args.json, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
