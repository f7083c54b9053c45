"""One CPU arena per process or one per session: memory and run time of a split model. A diagnostic, not a benchmark.

    python -m benchmarks.probes.probe_shared_arena --model-dirs mobilenet=DIR,bert=DIR --draws 6 \\
        --json lazybatch-results/shared_arena.json

A served model instance holds the whole graph (eager's fused passes) and one session per stage; with onnxruntime's
default each has its own CPU arena, with ``use_env_allocators`` (the default since this probe) they share one
(sessions/arena.py). Each draw is a fresh process set up as a stub is (one global thread pool), taking turns between
the two settings, so that session draws and the machine's drift land on both alike. In each process: the resident
memory once loaded; the stages chained, then the whole graph, at each batch size (the first run of the largest
batch timed apart: every arena grows at once there); the resident memory after it (the high-water mark a burst
leaves); then again after one shrinking run (what backend/memory.py's release leaves). Per model and setting: the
median over draws of each figure, and shared / per session.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.harness import command_line, machine_meta, write_json
from lazybatch.client.soak import process_rss
from tqdm import tqdm

SETTINGS = ("per_session", "shared")


def _rss_mib() -> float:
    return process_rss(os.getpid()) / 2**20


def child(setting: str, model_dir: str, batches: list[int], runs: int) -> dict:
    """One draw, in this process: the figures of one setting."""
    from lazybatch.backend.fusion import fused_manifest
    from lazybatch.backend.stages import StageRunner
    from lazybatch.formats.stage_manifest import load_manifest
    from lazybatch.sessions.arena import use_shared_arena
    from lazybatch.sessions.threads import use_global_thread_pool

    use_global_thread_pool(0)  # as in a stub (backend/model.py)
    if setting == "shared":
        use_shared_arena()
    d = Path(model_dir)
    manifest = load_manifest(d / "stages")
    stages = StageRunner(d / "stages", execution_provider="cpu", manifest=manifest)
    whole = StageRunner(d / "stages", execution_provider="cpu", inplace_residuals=False,
                        manifest=fused_manifest(manifest, d / "model.onnx"))
    out: dict = {"loaded_mib": _rss_mib()}
    for name, runner in (("stages", stages), ("whole", whole)):
        for b in batches:
            x = runner.sample_inputs(b, seed=1)
            t = time.perf_counter()
            runner.run_all(x)
            first = (time.perf_counter() - t) * 1000
            times = []
            for _ in range(runs):
                t = time.perf_counter()
                runner.run_all(x)
                times.append((time.perf_counter() - t) * 1000)
            out[f"{name}_b{b}_first_ms"] = first
            out[f"{name}_b{b}_ms"] = statistics.median(times)
    out["peak_mib"] = _rss_mib()
    for runner in (stages, whole):
        runner.release_arenas()
        runner.run_all(runner.sample_inputs(1, seed=1))
    from lazybatch.backend.memory import malloc_trim

    malloc_trim()
    out["released_mib"] = _rss_mib()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dirs", required=True, help="name=DIR,...: served models' version folders (model.onnx and "
                    "stages/), e.g. lazybatch-results/colocation/repo/mobilenet_lazybatch/1")
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--draws", type=int, default=6, help="processes per setting (taking turns)")
    ap.add_argument("--runs", type=int, default=10, help="timed runs per batch size after the first")
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument("--child", nargs=2, metavar=("SETTING", "DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], batches, args.runs)))
        return 0
    dirs = dict(kv.split("=", 1) for kv in args.model_dirs.split(","))
    for name, d in dirs.items():
        if not (Path(d) / "stages" / "manifest.json").exists() or not (Path(d) / "model.onnx").exists():
            ap.error(f"{name}: {d} needs model.onnx and stages/manifest.json (a lazybatch repository's version "
                     "folder)")
    draws: dict[str, dict[str, list[dict]]] = {n: {s: [] for s in SETTINGS} for n in dirs}
    steps = [(n, i, s if i % 2 == 0 else SETTINGS[1 - SETTINGS.index(s)])
             for n in dirs for i in range(args.draws) for s in SETTINGS]
    for name, _, setting in tqdm(steps, desc="draws", unit="process"):
        cmd = [sys.executable, "-m", "benchmarks.probes.probe_shared_arena", "--batches", args.batches, "--runs",
               str(args.runs), "--model-dirs", args.model_dirs, "--child", setting, dirs[name]]
        res = subprocess.run(cmd, capture_output=True, text=True, check=True)
        draws[name][setting].append(json.loads(res.stdout.strip().splitlines()[-1]))
    summary: dict[str, dict] = {}
    for name, by in draws.items():
        keys = list(by[SETTINGS[0]][0])
        med = {s: {k: statistics.median(d[k] for d in by[s]) for k in keys} for s in SETTINGS}
        summary[name] = {k: {**{s: med[s][k] for s in SETTINGS}, "shared_over_per_session":
                             med["shared"][k] / med["per_session"][k]} for k in keys}
        print(f"\n{name} (median over {args.draws} processes each)")
        print(f"{'figure':<22}{'per session':>12}{'shared':>10}{'ratio':>8}")
        for k, v in summary[name].items():
            print(f"{k:<22}{v['per_session']:>12.1f}{v['shared']:>10.1f}{v['shared_over_per_session']:>8.3f}")
    if args.json:
        write_json(args.json, {"meta": {**machine_meta(), "command": command_line()}, "model_dirs": dirs,
                               "batches": batches, "runs": args.runs, "draws": draws, "summary": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())
