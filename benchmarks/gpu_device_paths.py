"""The GPU check's fourth phase (``benchmarks/gpu_check.py``): the device path with CUDA graphs and with one shared
CUDA stream, each against the device path without, and the raw captures and stream probes behind them; and the
timing helpers every phase uses. Split from gpu_check.py by job: it runs on a lent GPU and rehearses on the CPU.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable


def timed(fns: dict[str, Callable[[], Any]], warmup: int, reps: int) -> dict[str, dict[str, float]]:
    """Median and 10th/90th percentile ms of each function, the functions interleaved run by run (a burst of
    other load touches them alike)."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[k].append((time.perf_counter() - t0) * 1e3)
    out = {}
    for k, xs in samples.items():
        xs = sorted(xs)
        out[k] = {"median_ms": statistics.median(xs), "p10_ms": xs[len(xs) // 10],
                  "p90_ms": xs[min(len(xs) - 1, (9 * len(xs)) // 10)]}
    return out


def rel_err(a: Any, b: Any) -> float:
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / (np.max(np.abs(b)) + 1e-12)) if b.size else 0.0


class DevicePathPhases:
    """Phase 4 of ``Check`` (graphs, streams): reads ``self.b`` (the bundle), ``self.args``, ``self.cuda``,
    ``self.provider``, ``self.providers`` and ``self.models`` as ``Check`` builds them."""

    # -- 4 ------------------------------------------------------------------------------------------------------------
    def graphs(self) -> dict:
        out: dict[str, Any] = {"backend": {kind: self._backend_graphs(d) for kind, d in self.models.items()}}
        if not self.cuda:
            out["capture"] = {"skipped": "CUDA graph capture needs CUDAExecutionProvider; the rehearsal runs the "
                                         "backend's buckets, padding and copies on the CPU provider, uncaptured"}
        else:
            out["capture"] = {kind: self._graph_probe(d) for kind, d in self.models.items()}
        return out

    def _backend_graphs(self, d: Path) -> dict:
        """The backend's ``cuda_graphs`` path (sessions/cuda_graphs.py: a graph per bucket, padded, outputs copied
        out) against the device path without graphs, at each batch size (each one a bucket)."""
        from lazybatch.backend.stages import StageRunner

        t0 = time.monotonic()
        plain = StageRunner(d, execution_provider=self.provider, device_tensors=True)
        g = StageRunner(d, execution_provider=self.provider, device_tensors=True,
                        graph_buckets=self.args.batch_sizes)
        out: dict[str, Any] = {"graph_stages": len(g.graphs), "stages": g.n_stages, "refused": g.graphs_refused,
                               "build_s": round(time.monotonic() - t0, 1), "rows": []}
        for batch in self.args.batch_sizes:
            x = plain.sample_inputs(batch, seed=batch)
            t = timed({"device": lambda: plain.run_all_resident(x), "graphs": lambda: g.run_all_resident(x)}, 2,
                      self.args.reps)
            same = all(a.tobytes() == b.tobytes()
                       for a, b in zip(plain.run_all_resident(x).values(), g.run_all_resident(x).values()))
            out["rows"].append({"batch": batch, "times": t, "equal": same,
                                "graphs_over_device": t["graphs"]["median_ms"] / t["device"]["median_ms"]})
        self.b.log(f"{d.name}: backend graphs on {len(g.graphs)}/{g.n_stages} stages; " + "; ".join(
            f"b{r['batch']} {r['graphs_over_device']:.2f}x of the device path, equal {r['equal']}"
            for r in out["rows"]))
        return out

    def _graph_probe(self, d: Path) -> dict:
        import numpy as np
        import onnxruntime as ort

        from lazybatch.sessions.chain import StageChain, random_feeds

        man = json.loads((d / "manifest.json").read_text())
        prov = [("CUDAExecutionProvider", {"enable_cuda_graph": "1"})]
        plain = StageChain(d, man, self.providers)
        sessions = []  # the whole graph, then each stage: the first that cannot be captured is named
        files = [("the whole graph", man["whole_model"]), *((st["name"], st["file"]) for st in man["stages"])]
        for where, file in files:
            try:
                sessions.append(ort.InferenceSession(str(d / file), providers=prov))
            except Exception as e:  # noqa: BLE001 - a graph that cannot be captured is a finding, not a failure
                return {"refused": f"{where}: {type(e).__name__}: {str(e)[:400]}"}
        whole, stages = sessions[0], sessions[1:]
        out = {}
        rng = np.random.default_rng(0)
        for gid, batch in enumerate(self.args.batch_sizes):
            x = random_feeds(man["graph_inputs"], batch, rng)
            env = plain.run_chain(x, keep_all=True)  # every tensor's shape and the plain run's values
            ref_whole = plain.run_whole(x)
            buf = {k: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v), "cuda", 0) for k, v in env.items()}
            wout = {k: ort.OrtValue.ortvalue_from_numpy(np.zeros_like(v), "cuda", 0) for k, v in ref_whole.items()}
            ro = ort.RunOptions()
            ro.add_run_config_entry("gpu_graph_id", str(gid + 1))
            bindings = []
            for st, sess in zip(man["stages"], stages):
                iob = sess.io_binding()
                for i in st["inputs"]:
                    iob.bind_ortvalue_input(i["name"], buf[i["name"]])
                for o in st["outputs"]:
                    iob.bind_ortvalue_output(o["name"], buf[o["name"]])
                bindings.append((sess, iob))
            wb = whole.io_binding()
            for i in man["graph_inputs"]:
                wb.bind_ortvalue_input(i["name"], buf[i["name"]])
            for k, v in wout.items():
                wb.bind_ortvalue_output(k, v)

            def chain() -> None:
                for sess, iob in bindings:
                    sess.run_with_iobinding(iob, ro)

            try:
                t = timed({"whole_graph": lambda: whole.run_with_iobinding(wb, ro), "chain_graph": chain}, 3,
                          self.args.reps)
            except Exception as e:  # noqa: BLE001
                out[f"b{batch}"] = {"refused": f"{type(e).__name__}: {str(e)[:400]}"}
                continue
            outs = [o["name"] for o in man["graph_outputs"]]
            same_chain = all(buf[o].numpy().tobytes() == env[o].tobytes() for o in outs)
            same_whole = all(wout[o].numpy().tobytes() == ref_whole[o].tobytes() for o in outs)
            out[f"b{batch}"] = {"times": t, "chain_replay_equals_plain": same_chain,
                                "whole_replay_equals_plain": same_whole,
                                "chain_over_whole": t["chain_graph"]["median_ms"] / t["whole_graph"]["median_ms"]}
            self.b.log(f"{d.name} b{batch}: CUDA graphs whole {t['whole_graph']['median_ms']:.3f} ms, chain "
                       f"{out[f'b{batch}']['chain_over_whole']:.2f}x, replays equal plain: {same_chain}/{same_whole}")
        return out

    # -- 4b -----------------------------------------------------------------------------------------------------------
    def streams(self) -> dict:
        if not self.cuda:
            return {"skipped": "one CUDA stream for every stage needs CUDAExecutionProvider"}
        try:
            import cupy
        except ImportError:
            return {"skipped": "needs cupy to make the CUDA stream the sessions share (the lent image has cupy)"}
        return {kind: {"probe": self._stream_probe(d, cupy), "backend": self._backend_stream(d)}
                for kind, d in self.models.items()}

    def _backend_stream(self, d: Path) -> dict:
        """The backend's ``shared_cuda_stream`` path (sessions/cuda_stream.py: one stream, one run in flight)
        against the device path whose every run synchronises, at each batch size."""
        from lazybatch.backend.stages import StageRunner
        from lazybatch.sessions.cuda_stream import open_stream

        plain = StageRunner(d, execution_provider=self.provider, device_tensors=True)
        shared = StageRunner(d, execution_provider=self.provider, device_tensors=True,
                             stream=open_stream(self.providers))
        rows = []
        for batch in self.args.batch_sizes:
            x = plain.sample_inputs(batch, seed=batch)
            t = timed({"device": lambda: plain.run_all_resident(x), "stream": lambda: shared.run_all_resident(x)},
                      2, self.args.reps)
            same = all(a.tobytes() == b.tobytes()
                       for a, b in zip(plain.run_all_resident(x).values(), shared.run_all_resident(x).values()))
            rows.append({"batch": batch, "times": t, "equal": same,
                         "stream_over_device": t["stream"]["median_ms"] / t["device"]["median_ms"],
                         "saved_per_boundary_us": (t["device"]["median_ms"] - t["stream"]["median_ms"])
                         / max(1, plain.n_stages - 1) * 1e3})
        self.b.log(f"{d.name}: backend shared stream " + "; ".join(
            f"b{r['batch']} {r['stream_over_device']:.2f}x of the device path, equal {r['equal']}" for r in rows))
        return {"stream_present": shared.stream is not None, "rows": rows}

    def _stream_probe(self, d: Path, cupy: Any) -> dict:
        """Every stage session on one CUDA stream of ours (``user_compute_stream``), the host synchronised once per
        chain (``disable_synchronize_execution_providers`` on every run, then the stream) against a
        synchronisation after every stage: what the end-of-run synchronisations cost."""
        import numpy as np
        import onnxruntime as ort

        from lazybatch.sessions.chain import random_feeds
        from lazybatch.sessions.device_tensors import DeviceTensors

        man = json.loads((d / "manifest.json").read_text())
        stream = cupy.cuda.Stream(non_blocking=True)
        prov = [("CUDAExecutionProvider", {"user_compute_stream": str(stream.ptr), "has_user_compute_stream": "1"}),
                "CPUExecutionProvider"]
        stages = [ort.InferenceSession(str(d / st["file"]), providers=prov) for st in man["stages"]]
        whole = ort.InferenceSession(str(d / man["whole_model"]), providers=prov)
        tensors = DeviceTensors(self.providers)
        nosync = ort.RunOptions()
        nosync.add_run_config_entry("disable_synchronize_execution_providers", "1")
        outs = [o["name"] for o in man["graph_outputs"]]
        rng = np.random.default_rng(0)
        out = {}
        for batch in self.args.batch_sizes:
            x = {k: tensors.value(v) for k, v in random_feeds(man["graph_inputs"], batch, rng).items()}

            def chain(sync_each: bool) -> dict:
                env: dict[str, Any] = dict(x)
                for st, sess in zip(man["stages"], stages):
                    names = [o["name"] for o in st["outputs"]]
                    feeds = {i["name"]: env[i["name"]] for i in st["inputs"]}
                    env.update(zip(names, tensors.run(sess, feeds, names, options=None if sync_each else nosync)))
                stream.synchronize()
                return env

            def whole_once() -> None:
                tensors.run(whole, dict(x), outs, options=nosync)
                stream.synchronize()

            try:
                t = timed({"whole": whole_once, "chain_sync_each_stage": lambda: chain(True),
                           "chain_one_sync": lambda: chain(False)}, 3, self.args.reps)
                a, b = chain(True), chain(False)
                same = all(tensors.host(a[o]).tobytes() == tensors.host(b[o]).tobytes() for o in outs)
            except Exception as e:  # noqa: BLE001 - a finding, recorded
                out[f"b{batch}"] = {"refused": f"{type(e).__name__}: {str(e)[:400]}"}
                continue
            med = {k: v["median_ms"] for k, v in t.items()}
            n = max(1, len(stages) - 1)
            out[f"b{batch}"] = {"times": t, "one_sync_equals_sync_each": same,
                                "sync_cost_per_boundary_us": (med["chain_sync_each_stage"] - med["chain_one_sync"])
                                / n * 1e3,
                                "chain_one_sync_over_whole": med["chain_one_sync"] / med["whole"]}
            self.b.log(f"{d.name} b{batch}: one stream, chain synchronised once {med['chain_one_sync']:.3f} ms "
                       f"({out[f'b{batch}']['chain_one_sync_over_whole']:.2f}x whole), every stage "
                       f"{med['chain_sync_each_stage']:.3f} ms; equal: {same}")
        return out

    # -- 5 ------------------------------------------------------------------------------------------------------------
