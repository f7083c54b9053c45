"""Median onnxruntime time per pass, by batch size, from the batch logs a benchmark's server wrote.

    python -m benchmarks.probes.probe_pass_times docs/data/default_restart_batches --batches 1,8

Every benchmark sets ``LAZYBATCH_STATS_DIR``; each model's stub then appends one line per pass to
``<model>.batches.csv`` (time, stage, batch size, seconds: backend/model.py ``BatchLog``). Eager's inline passes and
Triton 0 ms's are both one whole-graph onnxruntime call, so their medians at one batch size compare the passes
themselves, apart from the queueing that the latency tables compound them into. Per file, per batch size: passes and
the median in ms; per batch size, each file's median over the first file's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from lazybatch.backend.model import read_log


def medians(path: Path) -> dict[int, tuple[int, float]]:
    by: dict[int, list[float]] = defaultdict(list)
    for row in read_log(path):
        if len(row) == 4 and row[1] == "0":  # stage 0: a whole-graph pass (its only stage)
            by[int(row[2])].append(float(row[3]) * 1e3)
    return {b: (len(v), statistics.median(v)) for b, v in sorted(by.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="a folder of <model>.batches.csv files (LAZYBATCH_STATS_DIR)")
    ap.add_argument("--batches", default="1,8", help="batch sizes to show")
    args = ap.parse_args(argv)
    want = [int(b) for b in args.batches.split(",")]
    files = sorted(Path(args.folder).glob("*.batches.csv"))
    if not files:
        ap.error(f"no *.batches.csv in {args.folder}")
    groups: dict[str, list[Path]] = defaultdict(list)
    for p in files:  # one group per model: <kind>_<policy>.batches.csv
        groups[p.name.split("_")[0]].append(p)
    for kind, paths in groups.items():
        paths.sort(key=lambda p: (not p.name.startswith(f"{kind}_eager"), p.name))
        rows = {p.name.removesuffix(".batches.csv"): medians(p) for p in paths}
        first = next(iter(rows.values()))
        for b in want:
            if b not in first:
                continue
            cells = [f"{name} {m[b][1]:.3f} ms ({m[b][0]} passes, {m[b][1] / first[b][1]:.3f}x)"
                     for name, m in rows.items() if b in m]
            print(f"{kind} batch {b}: " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
