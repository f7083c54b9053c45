"""How much of a CUDA stage chain's time is host<->device copies, and whether its answers match the whole graph.

    python scripts/gpu_stage_copies.py STAGE_DIR [--out FILE]

The backend hands every stage numpy arrays (``StageRunner.run``): on the CUDA provider each stage then copies its
inputs to the device and its outputs back. This times, per batch size, the whole graph, that chain, and the same
chain with every tensor left on the device between stages (onnxruntime IO binding), and reports the largest error
of each chain against the whole graph on CUDA and against the CPU provider, with TF32 on (onnxruntime's default) and
off. Needs onnxruntime-gpu.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort


def sessions(d: Path, manifest: dict, tf32: bool) -> tuple[ort.InferenceSession, list[ort.InferenceSession]]:
    prov = [("CUDAExecutionProvider", {"use_tf32": "1" if tf32 else "0"}), "CPUExecutionProvider"]
    whole = ort.InferenceSession(str(d / manifest["whole_model"]), providers=prov)
    return whole, [ort.InferenceSession(str(d / s["file"]), providers=prov) for s in manifest["stages"]]


def chain_host(stages: list, manifest: dict, x: dict) -> dict:
    env = dict(x)
    for spec, s in zip(manifest["stages"], stages):
        names = [o.name for o in s.get_outputs()]
        env.update(zip(names, s.run(names, {i.name: env[i.name] for i in s.get_inputs()})))
    return env


def chain_device(stages: list, manifest: dict, x: dict, outputs: list[str]) -> dict:
    env: dict = dict(x)
    for s in stages:
        io = s.io_binding()
        for i in s.get_inputs():
            v = env[i.name]
            io.bind_cpu_input(i.name, v) if isinstance(v, np.ndarray) else io.bind_ortvalue_input(i.name, v)
        names = [o.name for o in s.get_outputs()]
        for n in names:
            io.bind_output(n, "cuda", 0)
        s.run_with_iobinding(io)
        env.update(zip(names, io.get_outputs()))
    return {o: env[o].numpy() for o in outputs}


def timed(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("stage_dir", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--batch-sizes", default="1,8,32,64")
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    d = a.stage_dir
    manifest = json.loads((d / "manifest.json").read_text())
    cpu = ort.InferenceSession(str(d / manifest["whole_model"]), providers=["CPUExecutionProvider"])
    outputs = [o.name for o in cpu.get_outputs()]
    rng = np.random.default_rng(0)
    report: dict = {"onnxruntime": ort.__version__, "rows": []}
    for tf32 in (True, False):
        whole, stages = sessions(d, manifest, tf32)
        for b in [int(v) for v in a.batch_sizes.split(",")]:
            x = {i.name: rng.standard_normal([b, *i.shape[1:]]).astype(np.float32) for i in cpu.get_inputs()}
            ref = dict(zip(outputs, cpu.run(None, x)))
            w = dict(zip(outputs, whole.run(None, x)))
            h = chain_host(stages, manifest, x)
            dv = chain_device(stages, manifest, x, outputs)

            def err(got: dict, want: dict) -> float:
                return max(float(np.max(np.abs(got[o] - want[o])) / (np.max(np.abs(want[o])) + 1e-12))
                           for o in outputs)

            row = {"tf32": tf32, "batch": b,
                   "whole_ms": timed(lambda: whole.run(None, x), a.reps) * 1e3,
                   "chain_host_ms": timed(lambda: chain_host(stages, manifest, x), a.reps) * 1e3,
                   "chain_device_ms": timed(lambda: chain_device(stages, manifest, x, outputs), a.reps) * 1e3,
                   "err_whole_vs_cpu": err(w, ref), "err_chain_vs_whole": err(h, w),
                   "err_device_chain_vs_whole": err(dv, w), "err_chain_vs_cpu": err(h, ref)}
            report["rows"].append(row)
            print(f"tf32={int(tf32)} b{b:<3} whole {row['whole_ms']:8.3f} ms  chain (numpy between stages) "
                  f"{row['chain_host_ms']:8.3f} ms ({row['chain_host_ms'] / row['whole_ms']:.2f}x)  chain on device "
                  f"{row['chain_device_ms']:8.3f} ms ({row['chain_device_ms'] / row['whole_ms']:.2f}x)  "
                  f"rel.err chain/whole {row['err_chain_vs_whole']:.1e} whole/cpu {row['err_whole_vs_cpu']:.1e} "
                  f"chain/cpu {row['err_chain_vs_cpu']:.1e}", flush=True)
    if a.out:
        a.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
