#!/usr/bin/env python
"""Splitting overhead and split time (not a test: timings depend on the machine and on who else uses it).

For each model: export (or take the onnx package's light_* graph), split (once per variant), then time the whole
graph and every stage on onnxruntime at each batch size, alternating whole-graph and chained runs so that
background load hits both alike. Variants (--variants): how the model is split and how stages hand over tensors;
all are timed in the same rounds against the same whole-graph session. Overhead ratio = sum of per-stage median latencies / whole-graph median latency (what the latency
table's sum-of-stages would charge against the unsplit model). Also reports the time `lazybatch split` takes.

    .venv/bin/python -m benchmarks.bench_split                       # default model set, batch 1, 8, 32
    .venv/bin/python -m benchmarks.bench_split --models resnet50 light_resnet50 --repeat 20
    .venv/bin/python -m benchmarks.bench_split --models resnet50 --batch-sizes 1 --variants plain,ortvalue,ort-extended,ort-all
    .venv/bin/python -m benchmarks.bench_split --models resnet50 --variants plain,ort-all,ort-all-noinplace --repeat 15 \
        --json docs/data/bench_split_resnet50_run1.json          # the figures docs/onnx.md and README quote
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


from benchmarks.harness import command_line, git_commit, machine_meta
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


VARIANTS = {  # name -> (graph_optimization_level of the split, hand-off)
    "plain": (None, "numpy"),            # the model as given, numpy arrays between stages
    "ortvalue": (None, "ortvalue"),      # same stages, OrtValues between stages through IOBinding
    "device": (None, "device"),          # same stages, the backend's device_tensors path (sessions/device_tensors.py)
    "ort-extended": ("extended", "numpy"),  # cut after onnxruntime's portable optimisations
    "ort-all": ("all", "numpy"),         # cut after all optimisations (NCHWc layout; this CPU only)
    "ort-all-noinplace": ("all", "numpy-plain"),  # same, residual stages not in place (inplace_residuals false)
}


class Timer:
    """One chain of stage sessions, timed stage by stage on a real chained pass (each stage on the outputs the
    previous stages just produced); a stage's time includes its hand-off (gathering its feeds, binding). The numpy
    hand-off runs StageChain.run_stage, in-place residual stages included unless the variant says otherwise."""

    def __init__(self, chain: Any, handoff: str, clock: Any) -> None:
        self.chain, self.handoff, self.clock = chain, handoff, clock
        man = chain.manifest
        self.ins = [[i["name"] for i in st["inputs"]] for st in man["stages"]]
        self.outs = [[o["name"] for o in st["outputs"]] for st in man["stages"]]
        self.model_outputs = {o["name"] for o in man["graph_outputs"]}

    def run(self, feeds: dict[str, np.ndarray]) -> tuple[list[float], dict[str, Any]]:
        import onnxruntime as ort

        clock, times = self.clock, []
        env: dict[str, Any] = dict(feeds)
        if self.handoff == "ortvalue":
            env = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in feeds.items()}
        for k, sess in enumerate(self.chain.stages):
            t = clock()
            if self.handoff.startswith("numpy"):  # StageChain.run_stage: what --verify, profile and the backend run
                self.chain.run_stage(k, env, inplace=self.handoff == "numpy")
            elif self.handoff == "device":  # tensors stay on the device; the answers come back to host numpy
                self.chain.run_stage(k, env)
                env.update((n, self.chain.tensors.host(env[n])) for n in self.outs[k] if n in self.model_outputs)
            else:
                io = sess.io_binding()
                for n in self.ins[k]:
                    io.bind_ortvalue_input(n, env[n])
                for n in self.outs[k]:
                    io.bind_output(n, "cpu")
                sess.run_with_iobinding(io)
                res = io.get_outputs()
                env.update((n, v.numpy() if n in self.model_outputs else v) for n, v in zip(self.outs[k], res))
            times.append(clock() - t)
        return times, env


def bench_model(spec: str, work: Path, sizes: list[int], warmup: int, repeat: int, threads: int,
                spinning: bool, variants: list[str], clock: Any) -> dict[str, Any]:
    from lazybatch.sessions.chain import StageChain, random_feeds
    from lazybatch.onnx_tools.split import split_model

    base, _, k = spec.partition("@")
    src = work / f"{base.replace(':', '_')}.onnx"
    if not src.exists():
        src = model_file(base, work)
    splits: dict[str | None, Any] = {}
    timers: dict[str, Timer] = {}
    whole = None
    for v in variants:
        level, handoff = VARIANTS[v]
        if level not in splits:
            t0 = time.perf_counter()
            res = split_model(src, work / f"{spec.replace(':', '_').replace('@', '_k')}_{level or 'plain'}",
                              max_stages=int(k) if k else None, graph_optimization_level=level)
            splits[level] = (res, time.perf_counter() - t0,
                             StageChain(res.out, res.manifest, threads=threads, spinning=spinning, whole=False))
            if whole is None:  # the unoptimised model.onnx (the same file in every split directory)
                whole = StageChain(res.out, res.manifest, threads=threads, spinning=spinning).whole
        chain = splits[level][2]
        if handoff == "device":
            chain = StageChain(splits[level][0].out, splits[level][0].manifest, threads=threads,
                               spinning=spinning, whole=False, device_tensors=True)
        timers[v] = Timer(chain, handoff, clock)
    man = next(iter(splits.values()))[0].manifest
    rng = np.random.default_rng(0)
    rows = []
    for b in sizes:
        feeds = random_feeds(man["graph_inputs"], b, rng)
        ref = whole.run(None, feeds)
        for v, tm in timers.items():  # the benchmark's own check that every variant computes the same thing
            _, env = tm.run(feeds)
            for o, r in zip(whole.get_outputs(), ref):
                err = float(np.max(np.abs(np.asarray(env[o.name], dtype=np.float64) - r))) if r.size else 0.0
                scale = float(np.max(np.abs(r))) if r.size else 0.0
                assert err <= 1e-5 * max(scale, 1e-30), f"{spec} {v}: output {o.name} off by {err} (scale {scale})"
        whole_t: dict[str, list[float]] = {v: [] for v in timers}
        stage_t: dict[str, list[list[float]]] = {v: [] for v in timers}
        order = list(timers)
        for r in range(warmup + repeat):
            order = order[1:] + order[:1]  # rotate, so that no variant always runs right after the same one
            for v in order:  # alternate: whole graph, then this variant's chain
                t = clock()
                whole.run(None, feeds)
                w = clock() - t
                per, _ = timers[v].run(feeds)
                if r >= warmup:
                    whole_t[v].append(w)
                    stage_t[v].append(per)
        all_whole = [w for v in timers for w in whole_t[v]]
        whole_med = statistics.median(all_whole)
        row: dict[str, Any] = {"batch": b, "whole_ms": whole_med * 1e3, "variants": {}}
        for v in timers:
            stage_sum = sum(statistics.median(col) for col in zip(*stage_t[v]))
            # paired: each chain pass against the whole-graph run right before it (robust to load drifts)
            paired = statistics.median(sum(p) / w for p, w in zip(stage_t[v], whole_t[v]))
            # best: the fastest chain pass over the fastest whole-graph run (the least disturbed runs of each)
            best = min(sum(p) for p in stage_t[v]) / min(all_whole)
            row["variants"][v] = {"stages_sum_ms": stage_sum * 1e3, "ratio": stage_sum / whole_med,
                                  "paired_ratio": paired, "best_ratio": best}
        rows.append(row)
    return {"model": spec, "stages": {v: len(splits[VARIANTS[v][0]][0].manifest["stages"]) for v in timers},
            "split_s": {v: splits[VARIANTS[v][0]][1] for v in timers}, "rows": rows,
            "inplace_stages": {v: sorted(tm.chain.inplace) if tm.handoff in ("numpy", "device") else []
                               for v, tm in timers.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    ap.add_argument("--batch-sizes", default="1,8,32")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0 = its default)")
    ap.add_argument("--use-per-session-threads", action="store_true",
                    help="every session (whole graph and stages) gets its own intra-op pool, spinning off; default: "
                         "one pool shared by all sessions of the process, as the Triton backend runs them")
    ap.add_argument("--spin", action="store_true",
                    help="per-session pools with spinning on (with --use-per-session-threads)")
    ap.add_argument("--variants", default="plain,ort-all",
                    help=f"comma list of {', '.join(VARIANTS)} (all measured against the same whole-graph runs)")
    ap.add_argument("--clock", choices=["wall", "thread"], default="wall",
                    help="wall: elapsed time (the goal's measure); thread: CPU time of the calling thread, which "
                         "only counts all the work with --threads 1, and shrugs off other processes on the machine")
    ap.add_argument("--out", "--json", dest="out", type=Path, default=Path("lazybatch-results/bench_split.json"),
                    help="where the JSON results go (default %(default)s; docs/data/bench_split_*.json are such files)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.batch_sizes.split(",")]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"unknown variant(s) {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
    if args.clock == "thread" and args.threads != 1:
        ap.error("--clock thread measures only the calling thread: use it with --threads 1")
    if args.spin and not args.use_per_session_threads:
        ap.error("--spin applies to per-session pools: add --use-per-session-threads")
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    if not args.use_per_session_threads:
        from lazybatch.sessions.threads import use_global_thread_pool

        use_global_thread_pool(args.threads)  # as the Triton backend runs a model's stages
    import onnxruntime as ort

    load_before = os.getloadavg()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_split_") as tmp:
        for spec in args.models:
            r = bench_model(spec, Path(tmp), sizes, args.warmup, args.repeat, args.threads, args.spin, variants,
                            clock)
            results.append(r)
            for v in variants:
                print(f"{spec:16s} {v:12s} {r['stages'][v]:3d} stages ({len(r['inplace_stages'][v])} in place), "
                      f"split {r['split_s'][v]:6.2f} s | " + " | ".join(
                    f"b{x['batch']}: whole {x['whole_ms']:8.2f} ms, stages {x['variants'][v]['stages_sum_ms']:8.2f} "
                    f"ms, ratio {x['variants'][v]['ratio']:.3f} (paired {x['variants'][v]['paired_ratio']:.3f}, "
                    f"best {x['variants'][v]['best_ratio']:.3f})"
                    for x in r["rows"]), flush=True)
    info = {**machine_meta(), "command": command_line(),  # the CPU among them: ratios differ by machine
            "onnxruntime": ort.__version__, "cpus": os.cpu_count(), "machine": platform.machine(),
            "commit": git_commit(), "python": platform.python_version(),
            "load_before": load_before, "load_after": os.getloadavg(), "warmup": args.warmup, "repeat": args.repeat,
            "threads": args.threads, "spinning": args.spin, "clock": args.clock, "variants": variants,
            "thread_pool": "per session" if args.use_per_session_threads else "global"}
    print(f"\nloadavg before {load_before[0]:.2f}, after {info['load_after'][0]:.2f} ({os.cpu_count()} CPUs)")
    print("\n| model | variant | stages | split (s) | " + " | ".join(f"ratio b{b} (paired, best)" for b in sizes) + " | "
          + " | ".join(f"whole b{b} (ms)" for b in sizes) + " |")
    print("|---|---|---|---|" + "---|" * (2 * len(sizes)))
    for r in results:
        for v in variants:
            print(f"| {r['model']} | {v} | {r['stages'][v]} | {r['split_s'][v]:.2f} | "
                  + " | ".join(f"{x['variants'][v]['ratio']:.3f} ({x['variants'][v]['paired_ratio']:.3f}, "
                               f"{x['variants'][v]['best_ratio']:.3f})"
                               for x in r["rows"]) + " | " + " | ".join(f"{x['whole_ms']:.1f}" for x in r["rows"]) + " |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"info": info, "results": results}, indent=1) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
