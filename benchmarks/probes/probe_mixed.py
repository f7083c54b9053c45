"""Where a served eager model spends its time under mixed traffic: one load, then the backend's statistics (route,
stage runs, onnxruntime time, cancellation asks, batch sizes). docs/data/mixed_probe_resnet50_120pct.txt holds the
runs docs/results/mixed.md quotes.

    python -m benchmarks.probes.probe_mixed resnet50_eager --load 1.2 --t1-ms 22.36
    python -m benchmarks.probes.probe_mixed resnet50_eager --load 1.2 --t1-ms 22.36 --one-class

The repository is the one benchmarks/bench_mixed.py builds (``--repo``); a model's policy is whatever its
config.pbtxt says (eager:urgency=true there).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from benchmarks.harness import served
from lazybatch.client.load import format_table, run_load
from lazybatch.traffic import TrafficClass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--repo", default="lazybatch-results/mixed/repos/resnet50")
    ap.add_argument("--load", type=float, default=1.2, help="fraction of the batch-1 rate")
    ap.add_argument("--t1-ms", type=float, required=True, help="the served batch-1 latency")
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--one-class", action="store_true", help="every request bulk (SLA 20 x t1)")
    args = ap.parse_args(argv)
    t1 = args.t1_ms
    classes = None if args.one_class else [TrafficClass("interactive", 0.2, 2 * t1, 1),
                                            TrafficClass("bulk", 0.8, 20 * t1, 2)]
    stats = Path(tempfile.mkdtemp(prefix="probe_mixed_"))
    with served(Path(args.repo), stats / "tritonserver.log", stats_dir=stats,
                extra_args=["--model-control-mode=explicit", f"--load-model={args.model}"]) as server:
        r = run_load(server.endpoints.grpc, args.model, args.load / (t1 / 1e3), args.duration, classes=classes,
                     sla_ms=20 * t1, seed=0)
        print(format_table([r]))
        time.sleep(2)  # the backend writes its statistics when its scheduler goes idle
    d = json.loads((stats / f"{args.model}.json").read_text())
    print(json.dumps(d, indent=1))
    shutil.rmtree(stats, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
