"""The quickstart's co-located pair on its own (docs/colocation.md): a small model beside a large one on one
tritonserver, both driven at once, under lazybatch's defaults (the CPU share on) and under Triton's batcher.

    python -m benchmarks.pair                     # serves model_repository (built with `lazybatch repo default --pair`)
    python -m benchmarks.bench_triton ... --pair  # the same after the single-model table, on that run's server

What it measures and how it is judged: benchmarks/colocation/pair.py.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from benchmarks.colocation.pair import add_args, build_twins, pinning_args, report, run_args


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
    args = ap.parse_args(argv)
    repo = build_pair_repository(args.repository)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    twins = Path(args.twin_repository)
    shutil.rmtree(twins, ignore_errors=True)
    build_twins(twins, repo)
    with served(repo, out / "tritonserver.log",
                extra_args=[f"--model-repository={twins.resolve()}", *pinning_args()]) as server:
        data = run_args(server.endpoints.grpc, args, server_pid=server.proc.pid, twin=True, pinned=True)
    data["meta"].update(machine_meta(), command=command_line())
    report(data, out, args.page)
    return 0



if __name__ == "__main__":
    sys.exit(main())
