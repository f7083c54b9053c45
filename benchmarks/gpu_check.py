#!/usr/bin/env python
"""The prepared GPU check: one measurement call on a lent GPU, phase by phase, each phase's results written into
one bundle as it finishes (so that a call cut short still brings back what it measured).

    python -m benchmarks.gpu_check OUT --commit SHA          # on the GPU (scripts/gpu_check.sh runs this)
    python -m benchmarks.gpu_check OUT --cpu                 # the rehearsal: the same phases on the CPU provider

Phases (docs/deploy.md, "The GPU check"):

1. ``build``: the shipped models (ResNet-50, BERT, the 8 x 2048 MLP; --cpu: the tiny MLP and the MLP), split
   as ``lazybatch repo add`` splits them (at most 20 stages) and verified on the provider.
2. ``correct``: the backend's StageRunner on the provider, host path against device-resident path (bit for bit),
   the chain against the whole graph on the provider and against the CPU provider; the load-time device check.
3. ``timing``: at each batch size, the whole graph (IO binding, outputs on the device), the stage chain on the
   device path, the same chain through host numpy, what the scheduler dispatches for a job with no boundary (a
   whole-graph span through the served path, host answers) against the whole graph with host answers, and the cost
   per stage boundary beside its floor (one run of an empty graph).
4. ``graphs``: the backend's ``cuda_graphs`` path (a graph per stage and batch bucket, padded, outputs copied out;
   uncaptured on the CPU provider) against the device path without graphs, at each batch size; on CUDA also raw
   capture (onnxruntime's ``enable_cuda_graph``, one graph per batch size through ``gpu_graph_id``, fixed bound
   buffers): whole graph and stage chain, replay time and whether the replay equals the plain run; a stage that
   cannot be captured is named.
   ``streams``: every stage session on one CUDA stream of ours (``user_compute_stream``, made with cupy), the host
   synchronised once per chain (``disable_synchronize_execution_providers``) against once per stage: what the
   end-of-run synchronisations cost per boundary, and whether the answers stay the same; then the backend's own
   ``shared_cuda_stream`` path (one run in flight) against its device path. Skipped off CUDA.
5. ``profile``: ``lazybatch profile`` on the device path: the latency tables (``table_<model>.json``) and the sum
   of stages against the whole graph.
6. ``simulate``: the default policy against Triton's batcher (graph:0) on the first model's table.

OUT holds at most 8 files (the device tool brings back no more): check.json, log.txt, table_<model>.json per model,
simulate.txt. ``--budget-s`` bounds the call: a phase that would start past it is recorded as skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from benchmarks.gpu_device_paths import DevicePathPhases, rel_err, timed

ROOT = Path(__file__).resolve().parents[1]


def importable_from_source() -> None:
    """lazybatch's modules from this checkout when it is not installed (a bare lent machine): the repository's
    top-level folders are the package's subpackages (pyproject's package-dir)."""
    try:
        import lazybatch.backend  # noqa: F401 - installed, or an editable install
    except ImportError:
        import lazybatch

        lazybatch.__path__.append(str(ROOT))


class Bundle:
    """check.json rewritten after every phase, and log.txt, in OUT."""

    def __init__(self, out: Path, meta: dict, deadline: float) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out, self.deadline = out, deadline
        self.data: dict[str, Any] = {"meta": meta, "phases": {}}
        self._log = (out / "log.txt").open("a")

    def log(self, msg: str) -> None:
        print(msg, flush=True)
        self._log.write(msg + "\n")
        self._log.flush()

    def save(self) -> None:
        tmp = self.out / ".check.json.tmp"
        tmp.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        os.replace(tmp, self.out / "check.json")

    def phase(self, name: str, fn: Callable[[], dict]) -> dict | None:
        entry: dict[str, Any] = {}
        self.data["phases"][name] = entry
        if time.monotonic() > self.deadline:
            entry["status"] = "skipped: the call's time budget (--budget-s) was spent"
            self.log(f"== {name}: skipped (time budget)")
            self.save()
            return None
        self.log(f"== {name}")
        t0 = time.monotonic()
        try:
            entry["result"] = fn()
            entry["status"] = "ok"
        except Exception as e:  # noqa: BLE001 - a phase that breaks is recorded; the later ones still run
            entry["status"] = f"error: {type(e).__name__}: {e}"
            entry["traceback"] = traceback.format_exc()[-3000:]
            self.log(entry["status"])
        entry["seconds"] = round(time.monotonic() - t0, 2)
        self.save()
        return entry.get("result")


class Check(DevicePathPhases):
    """The phases, on one provider (4, the device paths' graphs and streams: gpu_device_paths.py)."""

    def __init__(self, bundle: Bundle, args: argparse.Namespace) -> None:
        self.b, self.args = bundle, args
        self.cuda = not args.cpu
        self.provider = "cuda" if self.cuda else "cpu"
        self.providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if self.cuda else ["CPUExecutionProvider"]
        self.work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
        self.models: dict[str, Path] = {}

    # -- 1 ------------------------------------------------------------------------------------------------------------
    def build(self) -> dict:
        from lazybatch.onnx_tools.manifest import load_manifest
        from lazybatch.onnx_tools.verify import verify_dir
        from lazybatch.repo import split_into
        from lazybatch.shipped import build_onnx

        out = {}
        for kind in self.args.models:
            t0 = time.monotonic()
            onnx_path = self.work / f"{kind}.onnx"
            build_onnx(kind, onnx_path)
            stages = split_into(onnx_path, self.work / f"{kind}_stages", max_stages=20, name=kind)  # as `repo add`
            man = load_manifest(stages)
            report = verify_dir(stages, man, batch_sizes=(1, 2), providers=self.providers)
            if not report["passed"]:
                raise RuntimeError(f"{kind}: the stage chain does not equal the whole graph: {report}")
            self.models[kind] = stages
            out[kind] = {"stages": len(man["stages"]), "verify": report,
                         "seconds": round(time.monotonic() - t0, 1)}
            self.b.log(f"{kind}: {out[kind]['stages']} stages, verified, {out[kind]['seconds']} s")
        return out

    # -- 2 ------------------------------------------------------------------------------------------------------------
    def correct(self) -> dict:
        import onnxruntime as ort

        from lazybatch.backend.stages import StageRunner

        out = {}
        for kind, d in self.models.items():
            host = StageRunner(d, execution_provider=self.provider)
            dev = StageRunner(d, execution_provider=self.provider, device_tensors=True)
            whole = ort.InferenceSession(str(d / host.manifest.raw["whole_model"]), providers=self.providers)
            cpu = ort.InferenceSession(str(d / host.manifest.raw["whole_model"]), providers=["CPUExecutionProvider"])
            rows = []
            for batch in (1, 3, 8):
                x = host.sample_inputs(batch, seed=batch)
                h = host.run_all(x)
                g = dev.run_all_resident(x) if dev.resident is not None else h
                names = [o.name for o in whole.get_outputs()]
                w = dict(zip(names, whole.run(names, x)))
                c = dict(zip(names, cpu.run(names, x)))
                rows.append({"batch": batch,
                             "device_equals_host": all(g[n].tobytes() == h[n].tobytes() for n in h),
                             "chain_vs_whole": max(rel_err(h[n], w[n]) for n in h),
                             "chain_vs_cpu": max(rel_err(h[n], c[n]) for n in h)})
            on = sorted({s.get_providers()[0] for s in dev.sessions})
            ok = (dev.resident is not None and all(r["device_equals_host"] for r in rows)
                  and max(r["chain_vs_cpu"] for r in rows) < 1e-2  # TF32, onnxruntime's CUDA default
                  and on == [self.providers[0]])
            out[kind] = {"ok": ok, "sessions_on": on, "device_path_refused": dev.resident_refused, "batches": rows}
            self.b.log(f"{kind}: {'ok' if ok else 'FAILED'}; device path "
                       f"{dev.resident_refused or 'on'}; " + "; ".join(
                           f"b{r['batch']} dev==host {r['device_equals_host']} chain/whole {r['chain_vs_whole']:.1e}"
                           f" chain/cpu {r['chain_vs_cpu']:.1e}" for r in rows))
        return out

    # -- 3 ------------------------------------------------------------------------------------------------------------
    def timing(self) -> dict:
        import numpy as np
        from onnx import TensorProto, helper

        from lazybatch.backend.fusion import fused_manifest
        from lazybatch.backend.stages import StageRunner
        from lazybatch.sessions.chain import StageChain
        from lazybatch.sessions.device_tensors import DeviceTensors

        tensors = DeviceTensors(self.providers)  # the floor: one run of an empty (Identity) graph on the device
        g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "floor",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        m.ir_version = 8
        import onnxruntime as ort

        empty = ort.InferenceSession(m.SerializeToString(), providers=self.providers)
        x0 = tensors.value(np.zeros(1, np.float32))
        floor = timed({"empty": lambda: tensors.run(empty, {"x": x0}, ["y"])}, 5, self.args.reps)["empty"]
        out: dict[str, Any] = {"empty_run_ms": floor}
        self.b.log(f"floor: one run of an empty graph {floor['median_ms']:.4f} ms")
        for kind, d in self.models.items():
            man = json.loads((d / "manifest.json").read_text())
            dev = StageChain(d, man, self.providers, device_tensors=True)
            host = StageChain(d, man, self.providers, whole=False)
            runner = StageRunner(d, execution_provider=self.provider, device_tensors=True)
            span = StageRunner(d, manifest=fused_manifest(runner.manifest, d / man["whole_model"]),
                               execution_provider=self.provider, inplace_residuals=False, device_tensors=True)
            n = len(man["stages"])
            rows = []
            for batch in self.args.batch_sizes:
                x = runner.sample_inputs(batch, seed=batch)

                def chain_device() -> None:
                    env = dict(x)
                    for k in range(n):
                        dev.run_stage(k, env)

                t = timed({"whole": lambda: dev.run_whole_resident(x), "chain_device": chain_device,
                           "chain_host": lambda: host.run_chain(x), "whole_host": lambda: dev.run_whole(x),
                           "span_served": lambda: span.run_all_resident(x),
                           "chain_served": lambda: runner.run_all_resident(x)}, 3, self.args.reps)
                med = {k: v["median_ms"] for k, v in t.items()}
                row = {"batch": batch, "times": t,
                       "chain_device_over_whole": med["chain_device"] / med["whole"],
                       "chain_host_over_whole": med["chain_host"] / med["whole"],
                       "span_served_over_whole_host": med["span_served"] / med["whole_host"],
                       "chain_served_over_whole_host": med["chain_served"] / med["whole_host"],
                       "per_boundary_us": (med["chain_device"] - med["whole"]) / max(1, n - 1) * 1e3}
                rows.append(row)
                self.b.log(f"{kind} b{batch}: whole {med['whole']:.3f} ms, chain on device "
                           f"{row['chain_device_over_whole']:.2f}x, through numpy {row['chain_host_over_whole']:.2f}x"
                           f", served span {row['span_served_over_whole_host']:.2f}x, served chain "
                           f"{row['chain_served_over_whole_host']:.2f}x, {row['per_boundary_us']:.1f} us per "
                           f"boundary (floor {floor['median_ms'] * 1e3:.1f} us)")
            out[kind] = {"stages": n, "rows": rows}
        return out

    # -- 5 ------------------------------------------------------------------------------------------------------------
    def profile(self) -> dict:
        from lazybatch.onnx_tools.profile import profile_dir

        out = {}
        for kind, d in self.models.items():
            table = profile_dir(d, batch_sizes=self.args.profile_batch_sizes, provider=self.providers[0],
                                warmup=3, repeat=self.args.profile_repeat, progress=False, device_tensors=True)
            table.save(self.b.out / f"table_{kind}.json")
            ratios = dict(zip(table.batch_sizes, table.meta["overhead_ratio"]))
            out[kind] = {"sum_of_stages_over_whole": ratios, "t1_ms": sum(
                table.latency(s, 1) for s in range(table.graph.n)) * 1e3}
            self.b.log(f"{kind}: sum of stages / whole graph " + ", ".join(f"b{b} {r:.3f}" for b, r in ratios.items()))
        return out

    # -- 6 ------------------------------------------------------------------------------------------------------------
    def simulate(self) -> dict:
        from lazybatch.batcher.latency_table import LatencyTable
        from lazybatch.cli import main as lazybatch

        kind = next(iter(self.models))
        path = self.b.out / f"table_{kind}.json"
        table = LatencyTable.load(path)
        t1 = sum(table.latency(s, 1) for s in range(table.graph.n))
        rates = ",".join(f"{f / t1:.0f}" for f in (0.1, 0.7, 1.2, 3.0))
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            rc = lazybatch(["simulate", "--model", str(path), "--policy", "eager", "--policy", "graph:0", "--rate",
                            rates, "--sla-ms", str(round(t1 * 1e3 * 10, 3)), "--seeds", "2", "--max-batch-size",
                            str(max(table.batch_sizes)), "--requests",
                            str(self.args.sim_requests), "--out", str(self.work / "sim"), "--no-plots", "--quiet"])
        (self.b.out / "simulate.txt").write_text(text.getvalue())
        self.b.log(text.getvalue())
        if rc:
            raise RuntimeError(f"lazybatch simulate exited {rc}")
        return {"model": kind, "rates": rates, "t1_ms": t1 * 1e3}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="the bundle's folder ($OUT on the lent machine)")
    ap.add_argument("--cpu", action="store_true", help="the rehearsal: CPU provider, small models, fewer runs")
    ap.add_argument("--commit", help="the commit measured (default: git's HEAD, where git and .git are there)")
    ap.add_argument("--models", help="comma list of shipped models (default: resnet50,bert,mlp; --cpu: tiny,mlp)")
    ap.add_argument("--budget-s", type=float, default=220.0, help="no phase starts after this many seconds")
    args = ap.parse_args(argv)
    args.models = (args.models or ("tiny,mlp" if args.cpu else "resnet50,bert,mlp")).split(",")
    args.batch_sizes = (1, 8) if args.cpu else (1, 8, 32, 64)
    args.profile_batch_sizes = (1, 2, 4, 8) if args.cpu else (1, 2, 4, 8, 16, 32, 64)
    args.reps = 5 if args.cpu else 30
    args.profile_repeat = 2 if args.cpu else 10
    args.sim_requests = 300 if args.cpu else 1000
    deadline = time.monotonic() + args.budget_s
    importable_from_source()
    import onnxruntime as ort

    from benchmarks.harness.meta import git_commit

    if not args.cpu and "CUDAExecutionProvider" not in ort.get_available_providers():
        raise SystemExit(f"no CUDAExecutionProvider in onnxruntime {ort.__version__} ({ort.__file__}): carry and "
                         "install onnxruntime-gpu first (scripts/gpu_carry.py), or run the rehearsal with --cpu")
    meta = {"commit": args.commit or git_commit() or "?", "provider": "cpu" if args.cpu else "cuda",
            "onnxruntime": ort.__version__, "providers": ort.get_available_providers(),
            "python": platform.python_version(), "host": platform.node(), "cores": os.cpu_count(),
            "models": args.models, "command": " ".join(["python -m benchmarks.gpu_check", *(argv or sys.argv[1:])])}
    with contextlib.suppress(Exception):
        import subprocess

        meta["gpu"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout.strip()
    bundle = Bundle(args.out, meta, deadline)
    bundle.log(json.dumps(meta))
    check = Check(bundle, args)
    try:
        bundle.phase("build", check.build)
        for name in ("correct", "timing", "graphs", "streams", "profile", "simulate"):
            if not check.models:
                break
            bundle.phase(name, getattr(check, name))
    finally:
        import shutil

        shutil.rmtree(check.work, ignore_errors=True)
    phases = bundle.data["phases"]
    correct = (phases.get("correct") or {}).get("result") or {}
    ok = bool(correct) and all(v["ok"] for v in correct.values()) and all(
        p["status"] == "ok" for p in phases.values())
    bundle.data["ok"] = ok
    bundle.save()
    bundle.log(f"GPU check {'passed' if ok else 'FAILED'}: {args.out}/check.json")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
