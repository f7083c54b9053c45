"""The drop-in repository's co-located pair on its own (docs/colocation.md): a small model beside a large one on one
tritonserver, both driven at once, under lazybatch's defaults (the CPU share on) and under Triton's batcher.

    python -m benchmarks.pair                     # serves model_repository (built with `lazybatch repo default --pair`)
    python -m benchmarks.pair --capacity --kinds small=tiny,large=mlp \
        --out lazybatch-results/capacity --repository lazybatch-results/capacity_repository \
        --json docs/data/colocation_capacity_tiny_mlp.json --page docs/results/colocation_capacity.md
    python -m benchmarks.pair --from-data docs/data/colocation_capacity_tiny_mlp.json \
        --page docs/results/colocation_capacity.md           # its page again from the raw data

What it measures and how it is judged: benchmarks/colocation/pair.py; with ``--capacity``, how much best-effort
traffic each configuration carries while the small model keeps its p99 within an SLA fixed before the searches
(benchmarks/colocation/capacity.py).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from benchmarks.colocation.pair import add_args, build_twins, pair_slas, pinning_args, report, run_args


def main(argv: list[str] | None = None) -> int:
    from benchmarks.harness import command_line, served
    from benchmarks.harness.meta import machine_meta
    from lazybatch.shipped import build_pair_repository

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(ap)
    ap.add_argument("--repository", default="model_repository")
    ap.add_argument("--out", default="lazybatch-results/pair", help="raw data (pair.json) and the server's log")
    ap.add_argument("--page", default=None, help="the markdown page (default <out>/pair.md)")
    ap.add_argument("--twin-repository", default="lazybatch-results/pair_twin_repository",
                    help="where the noise floor's and the pinned baseline's models are built (replaced on every run)")
    ap.add_argument("--kinds", default=None, metavar="small=KIND,large=KIND",
                    help="the pair's shipped models (default the drop-in repository's, `repo default --pair`: "
                         "small=mlp,large=resnet50)")
    capacity_args(ap)
    args = ap.parse_args(argv)
    if args.from_data:  # the page again from its raw data, no server
        import json

        from benchmarks.colocation import capacity

        data = json.loads(Path(args.from_data).read_text())
        print(capacity.page(data, Path(args.page or Path(args.out) / "capacity.md"), json_path=Path(args.from_data)))
        return 0
    kinds = parse_kinds(args.kinds)
    repo = build_pair_repository(args.repository, kinds=kinds, sla_ms=pair_slas(kinds))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    twins = Path(args.twin_repository)
    shutil.rmtree(twins, ignore_errors=True)
    build_twins(twins, repo, pair=kinds)
    with served(repo, out / "tritonserver.log",
                extra_args=[f"--model-repository={twins.resolve()}", *pinning_args()]) as server:
        if args.capacity:
            return run_capacity(server, kinds, args)
        data = run_args(server.endpoints.grpc, args, server_pid=server.proc.pid, twin=True, pinned=True,
                        kinds=kinds)
    data["meta"].update(machine_meta(), command=command_line())
    report(data, out, args.page)
    return 0


def parse_kinds(text: str | None) -> dict[str, str]:
    """``small=KIND,large=KIND`` -> role -> kind (default the drop-in repository's pair, PAIR_KINDS)."""
    from lazybatch.shipped import PAIR_KINDS, SHIPPED_MODELS

    if not text:
        return dict(PAIR_KINDS)
    kinds = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
    if set(kinds) != set(PAIR_KINDS) or any(k not in SHIPPED_MODELS for k in kinds.values()) \
            or kinds["small"] == kinds["large"]:
        raise SystemExit(f"--kinds: give small=KIND,large=KIND, two different kinds of {', '.join(SHIPPED_MODELS)}; "
                         f"got {text!r}")
    return kinds


def capacity_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--capacity", action="store_true", help="search the best-effort capacity per configuration "
                    "while the small model keeps its p99 within an SLA fixed first (benchmarks/colocation/capacity.py)")
    ap.add_argument("--window", type=float, default=5.0, help="--capacity: seconds per window (5)")
    ap.add_argument("--steps", type=int, default=5, help="--capacity: bisections per search (5)")
    ap.add_argument("--start-load", type=float, default=0.3,
                    help="--capacity: the first rate, a fraction of the large model's batch-1 rate (0.3)")
    ap.add_argument("--json", default=None, help="--capacity: also write the raw data here (docs/data/...)")
    ap.add_argument("--from-data", default=None, metavar="JSON",
                    help="--capacity's page (--page) again from its raw data, no server")


def run_capacity(server, kinds: dict[str, str], args: argparse.Namespace) -> int:
    """``--capacity`` on the started server: every configuration of the pair, the noise floor, pinning and the
    hand-set nice line where they can run; the page and its plot."""
    from benchmarks.colocation import capacity
    from benchmarks.colocation.pair import HAND_NICE, PINNED, TRITON, TWIN, can_pin
    from benchmarks.harness import command_line
    from benchmarks.harness.meta import machine_meta, write_json
    from lazybatch.backend.os_weights import Privileges
    from lazybatch.batcher.cpu_rank import NICE_STEPS
    from lazybatch.shipped import PAIR_OURS

    configs = [PAIR_OURS, *TRITON, TWIN, *([PINNED] if can_pin() else [])]
    hand = (HAND_NICE, NICE_STEPS[1]) if Privileges.probe().cap_sys_nice else None
    if hand is None:
        print("capacity: no hand-set nice line: raising its threads back needs CAP_SYS_NICE (run as root)")
    else:
        configs.append(HAND_NICE)
    names = {(role, cfg): f"{kind}_{capacity.BASE if cfg == HAND_NICE else cfg}"
             for role, kind in kinds.items() for cfg in [*configs, capacity.BASE]}
    data = capacity.measure(server.endpoints.grpc, names, configs, small_load=args.small_load,
                            start_load=args.start_load, window_s=args.window, steps=args.steps, reps=args.pair_reps,
                            seed=0, server_pid=server.proc.pid, hand=hand)
    data["meta"].update(machine_meta(), command=command_line(), kinds=kinds,
                        date=time.strftime("%Y-%m-%d %H:%M:%S"))
    out = Path(args.out)
    raw = write_json(Path(args.json) if args.json else out / "capacity.json", data)
    print(capacity.page(data, Path(args.page) if args.page else out / "capacity.md", json_path=raw))
    return 0



if __name__ == "__main__":
    sys.exit(main())
