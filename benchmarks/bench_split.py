#!/usr/bin/env python
"""Splitting overhead and split time (not a test: timings depend on the machine and on who else uses it).

For each model: export (or take the onnx package's light_* graph), split, then time the whole graph and every
stage on onnxruntime at each batch size, interleaving whole-graph and chained runs so that background load hits
both alike. Overhead ratio = sum of per-stage median latencies / whole-graph median latency (what the latency
table's sum-of-stages would charge against the unsplit model). Also reports the time `lazybatch split` takes.

    .venv/bin/python benchmarks/bench_split.py                       # default model set, batch 1, 8, 32
    .venv/bin/python benchmarks/bench_split.py --models resnet50 light_resnet50 --repeat 20
Model names: a zoo name (full size), NAME:small, or light_NAME (from onnx/backend/test/data/light/); append @K
to split into K stages (--max-stages K), e.g. resnet50@6.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_MODELS = ["resnet50", "light_resnet50", "mobilenet_v1", "vgg16:small", "bert:small", "gnmt", "transformer"]


def model_file(spec: str, work: Path) -> Path:
    import onnx

    from lazybatch.onnx_tools.zoo import export_model

    if spec.startswith("light_"):
        return Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light" / f"{spec}.onnx"
    name, _, variant = spec.partition(":")
    out = work / f"{name}{'_small' if variant else ''}.onnx"
    export_model(name, out, small=variant == "small", seed=0)
    return out


def bench_model(spec: str, work: Path, sizes: list[int], warmup: int, repeat: int, threads: int,
                spinning: bool) -> dict[str, Any]:
    from lazybatch.onnx_tools.runtime import StageChain, random_feeds
    from lazybatch.onnx_tools.split import split_model

    base, _, k = spec.partition("@")
    src = work / f"{base.replace(':', '_')}.onnx"
    if not src.exists():
        src = model_file(base, work)
    t0 = time.perf_counter()
    res = split_model(src, work / f"{spec.replace(':', '_').replace('@', '_k')}_stages",
                      max_stages=int(k) if k else None)
    split_s = time.perf_counter() - t0
    man = res.manifest
    chain = StageChain(res.out, man, threads=threads, spinning=spinning)
    rng = np.random.default_rng(0)
    rows = []
    for b in sizes:
        feeds = random_feeds(man["graph_inputs"], b, rng)
        env = dict(feeds)
        stage_in = []
        for k in range(len(chain.stages)):  # one untimed pass gives every stage its real inputs
            stage_in.append(chain.stage_feeds(k, env))
            chain.run_stage(k, env)
        names = [[o["name"] for o in st["outputs"]] for st in man["stages"]]
        whole_t: list[float] = []
        stage_t: list[list[float]] = [[] for _ in chain.stages]
        for r in range(warmup + repeat):
            t = time.perf_counter()
            chain.whole.run(None, feeds)
            w = time.perf_counter() - t
            per = []
            for k, s in enumerate(chain.stages):
                t = time.perf_counter()
                s.run(names[k], stage_in[k])
                per.append(time.perf_counter() - t)
            if r >= warmup:
                whole_t.append(w)
                for k, v in enumerate(per):
                    stage_t[k].append(v)
        whole_med = statistics.median(whole_t)
        stage_sum = sum(statistics.median(v) for v in stage_t)
        # paired: each round's chain against the whole-graph run right before it (robust to slow load drifts)
        paired = statistics.median(sum(v[r] for v in stage_t) / whole_t[r] for r in range(len(whole_t)))
        rows.append({"batch": b, "whole_ms": whole_med * 1e3, "stages_sum_ms": stage_sum * 1e3,
                     "ratio": stage_sum / whole_med, "paired_ratio": paired})
    return {"model": spec, "stages": len(man["stages"]), "split_s": split_s, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0 = its default)")
    ap.add_argument("--spin", action="store_true", help="enable intra-op thread spinning in all sessions")
    ap.add_argument("--out", type=Path, default=Path("lazybatch-results/bench_split.json"))
    args = ap.parse_args()
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    import onnxruntime as ort

    load_before = os.getloadavg()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_split_") as tmp:
        for spec in args.models:
            r = bench_model(spec, Path(tmp), sizes, args.warmup, args.repeat, args.threads, args.spin)
            results.append(r)
            print(f"{spec:18s} {r['stages']:3d} stages, split {r['split_s']:6.2f} s | " + " | ".join(
                f"b{x['batch']}: whole {x['whole_ms']:9.2f} ms, stages {x['stages_sum_ms']:9.2f} ms, "
                f"ratio {x['ratio']:.3f} (paired {x['paired_ratio']:.3f})" for x in r["rows"]), flush=True)
    info = {"onnxruntime": ort.__version__, "cpus": os.cpu_count(), "machine": platform.machine(),
            "load_before": load_before, "load_after": os.getloadavg(), "warmup": args.warmup, "repeat": args.repeat,
            "threads": args.threads, "spinning": args.spin}
    print(f"\nloadavg before {load_before[0]:.2f}, after {info['load_after'][0]:.2f} ({os.cpu_count()} CPUs)")
    print("\n| model | stages | split (s) | " + " | ".join(f"ratio b{b} (paired)" for b in sizes) + " | "
          + " | ".join(f"whole b{b} (ms)" for b in sizes) + " |")
    print("|---|---|---|" + "---|" * (2 * len(sizes)))
    for r in results:
        print(f"| {r['model']} | {r['stages']} | {r['split_s']:.2f} | "
              + " | ".join(f"{x['ratio']:.3f} ({x['paired_ratio']:.3f})" for x in r["rows"]) + " | "
              + " | ".join(f"{x['whole_ms']:.1f}" for x in r["rows"]) + " |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"info": info, "results": results}, indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
