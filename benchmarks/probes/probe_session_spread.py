"""How far apart identical onnxruntime sessions of one model run: a diagnostic, not a benchmark.

    python -m benchmarks.probes.probe_session_spread --models mlp,mobilenet,resnet50 --json docs/data/session_spread.json

A served comparison loads each policy's model once, in its own stub process, and measures it for minutes: if two
sessions of the same file on the same machine ran at different speeds, each model's figures would carry one draw of
that difference however many repetitions it had. This probe makes ``--sessions`` identical sessions of each model in
one process (the backend's own ``make_session``, one shared thread pool as in a stub) and runs them in turn, a block
of ``--block`` batch-1 runs each (the first 3 of a block not timed), blocks in alternating order, so that the
machine's drift lands on all alike. Per model and session: the median run time in the first and the second half of
the rounds (a session's speed is a property of the session if the halves agree), and the slowest session's median
over the fastest's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

import numpy as np
from benchmarks.harness import command_line, machine_meta, write_json
from tqdm import tqdm

from lazybatch import repo as repo_mod
from lazybatch.backend.stages import make_session
from lazybatch.sessions.threads import use_global_thread_pool

ROUNDS = {"mlp": 30, "mobilenet": 20, "resnet50": 4, "bert": 4, "tiny": 60}


def spread_of(path: Path, sessions: int, block: int, rounds: int) -> dict:
    ss = [make_session(path, ["CPUExecutionProvider"]) for _ in range(sessions)]
    feeds = {}
    rng = np.random.default_rng(0)
    for i in ss[0].get_inputs():
        shape = [1] + [d if isinstance(d, int) and d > 0 else 1 for d in i.shape[1:]]
        dtype = np.float32 if "float" in i.type else np.int64
        feeds[i.name] = (rng.standard_normal(shape) if dtype is np.float32 else np.zeros(shape)).astype(dtype)
    times: list[list[float]] = [[] for _ in ss]
    for k in tqdm(range(rounds), desc=path.stem, unit="round", leave=False):
        for i in (range(sessions) if k % 2 == 0 else reversed(range(sessions))):
            for j in range(block):
                t0 = time.perf_counter()
                ss[i].run(None, feeds)
                if j >= 3:
                    times[i].append(time.perf_counter() - t0)
    half = len(times[0]) // 2
    first = [statistics.median(t[:half]) * 1e3 for t in times]
    second = [statistics.median(t[half:]) * 1e3 for t in times]
    return {"first_half_ms": first, "second_half_ms": second,
            "slowest_over_fastest": [max(first) / min(first), max(second) / min(second)]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,mobilenet,resnet50")
    ap.add_argument("--sessions", type=int, default=6)
    ap.add_argument("--block", type=int, default=20, help="runs of one session in a row (the first 3 not timed)")
    ap.add_argument("--out", default="lazybatch-results/session-spread")
    ap.add_argument("--json", default=None, help="also write the medians here (raw data for the docs)")
    args = ap.parse_args(argv)
    kinds = args.models.split(",")
    bad = [k for k in kinds if k not in ROUNDS]
    if bad:
        ap.error(f"--models: unknown {', '.join(bad)}; choose from {', '.join(ROUNDS)}")
    use_global_thread_pool(0)  # as in a stub (backend/model.py)
    results = {}
    for kind in kinds:
        path = Path(args.out) / f"{kind}.onnx"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            repo_mod.build_onnx(kind, path)
        results[kind] = r = spread_of(path, args.sessions, args.block, ROUNDS[kind])
        print(f"{kind}: median batch-1 run per session (ms), first half / second half of the rounds:")
        print("   " + "  ".join(f"{a:.3f}/{b:.3f}" for a, b in zip(r["first_half_ms"], r["second_half_ms"])))
        print(f"   slowest / fastest session: {r['slowest_over_fastest'][0]:.3f} (first half), "
              f"{r['slowest_over_fastest'][1]:.3f} (second half)")
    if args.json:
        write_json(args.json, {"meta": {**machine_meta(), "command": command_line()}, "sessions": args.sessions,
                               "block": args.block, "rounds": {k: ROUNDS[k] for k in kinds}, "models": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
