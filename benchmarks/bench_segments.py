"""What merging stages into segments (config ``fuse_segments``) saves: one pass over a model stage by stage, over N
merged segments, and as the whole graph, at one batch size, in one process (no server).

    python -m benchmarks.bench_segments                                   # ResNet-50 (20 stages), 2/4/8 segments
    python -m benchmarks.bench_segments --segments 4 --batch 8 --json docs/data/segments_resnet50.json

How: the default repository's ResNet-50 (lazybatch/repo.py: split into at most 20 stages, profiled) is built once
under --work; the stages, each segment count, and the whole graph run in turns, --rounds rounds of --reps passes
each, the order rotating every round, on one shared onnxruntime pool (as a Triton model instance runs them). Every
figure is a median per round, reported as mean [min-max] over rounds, and as a ratio to the stage-by-stage pass of
the same round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from tqdm import tqdm

from benchmarks.harness import command_line, fmt, machine_meta, spread, write_json


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--segments", default="2,4,8", help="comma list of segment counts (default 2,4,8)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10, help="passes per runner per round")
    ap.add_argument("--work", default="lazybatch-results/segments", help="where the model is built (kept)")
    ap.add_argument("--json", default=None, help="also write the raw figures here")
    args = ap.parse_args(argv)

    from lazybatch.sessions.threads import use_global_thread_pool

    use_global_thread_pool(0)  # one pool for every session, as in a Triton model instance
    from lazybatch.backend.fusion import fuse, segment
    from lazybatch.backend.stages import StageRunner
    from lazybatch.batcher.latency_table import LatencyTable
    from lazybatch.shipped import build_default_repository

    work = Path(args.work)
    build_default_repository(work / "repo", kind="resnet50", work=work / "build", policies={"eager": "eager"},
                             log=lambda *a: None)
    build = work / "build"
    stages = StageRunner(build / "resnet50_stages")
    table = LatencyTable.load(build / "resnet50_latency_b8.json")
    runners = {"stages": stages}
    tmp = Path(tempfile.mkdtemp(prefix="bench_segments_"))
    for k in (int(x) for x in args.segments.split(",")):
        done = segment(stages, table, k, tmp / f"seg{k}", execution_provider="cpu", intra_op_threads=0,
                       name=f"resnet50_seg{k}")
        if done is None:
            raise SystemExit(f"the stages could not be merged into {k} segments (see the log above)")
        runners[f"{k} segments"] = done[0]
    whole = fuse(stages, table, build / "resnet50_stages" / "model.onnx", execution_provider="cpu",
                 intra_op_threads=0, name="resnet50")
    if whole is not None:
        runners["whole graph"] = whole[0]
    x = stages.sample_inputs(args.batch)
    for r in runners.values():
        r.run_all(x)  # warm-up
    names = list(runners)
    rounds: list[dict[str, float]] = []
    for rnd in tqdm(range(args.rounds), desc="rounds", unit="round"):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        row = {}
        for name in order:
            times = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                runners[name].run_all(x)
                times.append(time.perf_counter() - t0)
            row[name] = statistics.median(times) * 1e3
        rounds.append(row)
    print(f"ResNet-50 ({stages.n_stages} stages), batch {args.batch}: median pass per round, mean [min-max] over "
          f"{args.rounds} rounds of {args.reps}")
    summary = {}
    for name in names:
        ms = spread([r[name] for r in rounds])
        ratio = spread([r[name] / r["stages"] for r in rounds])
        summary[name] = {"ms": ms, "vs_stages": ratio}
        print(f"  {name:>12}: {fmt(ms)} ms, {fmt(ratio)}x the stage-by-stage pass")
    if args.json:
        write_json(args.json, {"meta": {**machine_meta(), "command": command_line(), "batch": args.batch,
                                        "rounds": args.rounds, "reps": args.reps, "stages": stages.n_stages},
                               "rounds": rounds, "summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
