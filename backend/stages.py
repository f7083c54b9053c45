"""A stage directory (``manifest.json`` + one ONNX file per stage) loaded into onnxruntime sessions.

The backend runs a model stage by stage so that the scheduler can regroup requests at every stage boundary; this
module owns the sessions: one per stage, running a stage on the concatenation of several requests' tensors, on the
host or resident on the provider's device. The folder's manifest is read by ``lazybatch.formats.stage_manifest``,
the one loader the offline tools share.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from lazybatch.batcher.errors import ConfigError
from lazybatch.batcher.latency_table import LatencyTable
from lazybatch.formats.example_dims import feed_shape
from lazybatch.formats.stage_manifest import Manifest, load_manifest
from lazybatch.sessions.cuda_graphs import StageGraphs, build_graphs
from lazybatch.sessions.cuda_stream import SharedStream, StreamRefused, open_stream
from lazybatch.sessions.device_tensors import DeviceTensors, provider_list, rows_of
from lazybatch.sessions.inplace import InPlaceRunError, run_inplace, usable

from .rows import join_rows


def available_providers(preference: str = "auto") -> list[str]:
    """CUDA where onnxruntime offers it (unless told ``cpu``), else CPU."""
    import onnxruntime as ort

    have = ort.get_available_providers()
    pref = preference.lower()
    if pref == "cpu":
        return ["CPUExecutionProvider"]
    if pref == "cuda":
        if "CUDAExecutionProvider" not in have:
            raise ConfigError(f"execution_provider is cuda but onnxruntime offers only {have}",
                              field="execution_provider")
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    if pref != "auto":
        raise ConfigError(f"execution_provider must be auto, cpu or cuda, got {preference!r}",
                          field="execution_provider")
    return (["CUDAExecutionProvider"] if "CUDAExecutionProvider" in have else []) + ["CPUExecutionProvider"]


def wants_device_tensors(settings: Any) -> bool:
    """``device_tensors``: auto keeps tensors on the device where the provider is not the CPU: there every stage's
    copies through host numpy cost most (docs/deploy.md); on the CPU provider host numpy stays the default, the
    device path not yet benchmarked against it."""
    mode = settings.device_tensors
    if mode == "auto":
        return available_providers(settings.execution_provider)[0] != "CPUExecutionProvider"
    return mode == "true"


def cuda_graph_buckets(settings: Any, kind: str) -> tuple[tuple[int, ...], str | None]:
    """``cuda_graphs``: the batch buckets to capture, or none and why not (a log line) where it was asked for."""
    if not settings.cuda_graphs:
        return (), None
    if kind != "stages":
        return (), f"static stage models only; this {kind} model runs without"
    provider = available_providers(settings.execution_provider)[0]
    if provider != "CUDAExecutionProvider":
        return (), f"it needs the CUDA execution provider, and onnxruntime serves this model on {provider}"
    from lazybatch.sessions.cuda_graphs import graph_buckets

    return graph_buckets(settings.scheduler_max_batch_size), None


def shared_stream(settings: Any, device_tensors: bool, device_id: int) -> tuple[SharedStream | None, str | None]:
    """``shared_cuda_stream``: the stream every stage session of the instance shares, or none and why not (a log
    line) where it was asked for."""
    if not settings.shared_cuda_stream:
        return None, None
    if not device_tensors:
        return None, "it runs on the device path, and device_tensors is off"
    try:
        return open_stream(available_providers(settings.execution_provider), device_id), None
    except StreamRefused as e:
        return None, str(e)


def make_session(path: str | Path, providers: Sequence[str], intra_op_threads: int = 0, device_id: int = 0, *,
                 cuda_graph: bool = False, stream: SharedStream | None = None) -> Any:
    """One onnxruntime session. A model instance (a process of its own) normally shares one intra-op pool among all
    its stages (model.py switches the process to it; sessions/threads.py says why). Otherwise each
    session has its own pool with spinning off: idle per-stage pools would spin on the cores the running stage
    needs (measured: 8x slower ResNet-50 on 2 cores)."""
    import onnxruntime as ort

    from lazybatch.sessions.threads import session_options

    so = session_options(intra_op_threads)
    try:
        return ort.InferenceSession(str(path), sess_options=so,
                                    providers=provider_list(providers, device_id, cuda_graph=cuda_graph,
                                                            stream=stream))
    except Exception as e:  # onnxruntime raises its own exception types
        if cuda_graph:  # the refusal is the finding (sessions/cuda_graphs.py): its own words
            raise
        raise ConfigError(f"onnxruntime cannot load it: {e}", source=str(path)) from None


class StageRunner:
    """One onnxruntime session per stage, and the bookkeeping to run any stage on any group of requests.

    Tensors live per request between stages; ``last_use`` says after which stage a tensor is no longer needed, so
    that a request holds only what later stages (or the model outputs) still read.

    ``inplace_residuals``: residual stages write their output over their shortcut input when the caller owns it
    (``run(..., owned=True)``); sessions/inplace.py says which stages and why it is safe.

    ``device_tensors``: the served path (``join`` / ``run_resident`` / ``to_host``) keeps stage tensors on the
    provider's device (sessions/device_tensors.py) instead of host numpy, once a load-time check has found its
    answers bit-identical to the host path's; ``run`` and ``run_all`` stay host in, host out for every caller.

    ``graph_buckets``: on the device path, each stage that captures and passes the load-time check replays a CUDA
    graph per batch bucket, a sub-batch padded to its bucket (sessions/cuda_graphs.py); on the CPU provider the same
    static buffers and padding run without capture (the mechanism's CPU check). ``graphs_refused`` names each
    stage left without one and why.

    ``stream``: on the device path, every session of the instance runs on this one CUDA stream, each run queued
    without its end-of-run synchronisation and at most one in flight (sessions/cuda_stream.py); ``profile`` then
    times stages with CUDA events. Runners that hand tensors to this one (fusion.py) take the same stream.
    """

    def __init__(self, stage_dir: str | Path, *, execution_provider: str = "auto", intra_op_threads: int = 0,
                 inplace_residuals: bool = True, manifest: Manifest | None = None, device_tensors: bool = False,
                 device_id: int = 0, graph_buckets: Sequence[int] = (),
                 stream: SharedStream | None = None) -> None:
        self.dir = Path(stage_dir)
        self.manifest = manifest if manifest is not None else load_manifest(self.dir)  # given: fusion.py
        from lazybatch.sessions.ort_optimize import check_host  # stages split for another CPU: refuse, not misrun
        check_host(self.manifest.raw, f"the stages in {self.dir}")
        self.providers = available_providers(execution_provider)
        self.device_id = device_id
        self.graph_buckets = tuple(graph_buckets)  # as asked: fusion.py builds its runners alike
        self.stream = stream if device_tensors else None  # the host path's runs synchronise as they return
        self.sessions = [make_session(self.dir / s.file, self.providers, intra_op_threads, device_id,
                                      stream=self.stream) for s in self.manifest.stages]
        for spec, sess in zip(self.manifest.stages, self.sessions):
            names_in = {i.name for i in sess.get_inputs()}
            names_out = {o.name for o in sess.get_outputs()}
            want_in = {i.name for i in spec.inputs}
            if names_in != want_in or not set(spec.outputs) <= names_out:
                raise ConfigError(f"stage {spec.name}: the ONNX file has inputs {sorted(names_in)} and outputs "
                                  f"{sorted(names_out)}, the manifest says {sorted(want_in)} -> {spec.outputs}",
                                  source=str(self.dir / spec.file))
        from lazybatch.sessions.inplace import InPlace, verified_plan

        self.inplace: dict[int, InPlace] = (verified_plan(self.dir, self.manifest.raw, self.sessions)
                                            if inplace_residuals else {})
        self._shrink_pending: set[int] = set()  # stages whose next run shrinks their arenas (release_arenas)
        self._shrink_options = None  # onnxruntime RunOptions, made on first use
        n = len(self.manifest.stages)
        self.input_names = [t.name for t in self.manifest.inputs]  # the model's, as a whole-graph pass feeds them
        self.output_names = [o.name for o in self.manifest.outputs]
        self.last_use: dict[str, int] = {}
        for spec in self.manifest.stages:
            for i in spec.inputs:
                self.last_use[i.name] = max(self.last_use.get(i.name, -1), spec.index)
        for o in self.output_names:
            self.last_use[o] = n  # kept to the end
        # tensors to drop from a request once stage s has run
        self.drop_after: list[list[str]] = [[] for _ in range(n)]
        for name, s in self.last_use.items():
            if s < n:
                self.drop_after[s].append(name)
        # the device path, or None (host numpy between stages); why it is off, when it was asked for and is not
        self.resident: DeviceTensors | None = None
        self.resident_refused: str | None = None
        self.graphs: dict[int, StageGraphs] = {}  # stage -> its CUDA graphs (graph_buckets), built below
        self.graphs_refused: list[str] = []
        if device_tensors:
            tensors = DeviceTensors(self.providers, device_id, stream=self.stream)
            self.resident_refused = self._check_resident(tensors)
            self.resident = tensors if self.resident_refused is None else None
            if self.resident is None:
                self.stream = None
        if graph_buckets and self.resident is not None:
            self._build_graphs(tuple(graph_buckets), intra_op_threads)
        elif graph_buckets:
            self.graphs_refused.append("every stage: CUDA graphs run on the device path, and device_tensors is off"
                                       + (f" ({self.resident_refused})" if self.resident_refused else ""))

    @property
    def n_stages(self) -> int:
        return len(self.sessions)

    def run(self, stage: int, feeds: Mapping[str, np.ndarray], *, owned: bool = False) -> dict[str, np.ndarray]:
        """Run one stage on already-batched inputs; returns only the outputs the manifest names.

        ``owned``: the caller made the non-model input arrays for this run (join_rows: a fresh concatenation, or
        contiguous rows of an earlier stage's output that only this batch's requests read) and reads them no more
        after this stage, so an in-place stage may write its output over its input when that array is writable
        and C-contiguous. Model inputs are never overwritten (not eligible)."""
        spec = self.manifest.stages[stage]
        options = self._run_options(stage) if self._shrink_pending else None
        step = self.inplace.get(stage) if owned else None
        if step is not None and usable(feeds[step.input], step):
            return {step.output: run_inplace(self.sessions[stage], step, feeds, options)}
        res = self.sessions[stage].run(spec.outputs, feeds if type(feeds) is dict else dict(feeds), options)
        return dict(zip(spec.outputs, res))

    def _run_options(self, stage: int) -> Any:
        if stage not in self._shrink_pending:
            return None
        self._shrink_pending.discard(stage)
        if self._shrink_options is None:
            from .memory import shrinking_run_options

            self._shrink_options = shrinking_run_options(self.providers)
        return self._shrink_options

    # -- the served path: host numpy, or device tensors (sessions/device_tensors.py) ------------------------------
    def join(self, parts: list[tuple[Any, int]]) -> Any:
        """Samples' rows (tensor, row) as one stage input: ``join_rows`` on the host path, a device batch else."""
        return join_rows(parts) if self.resident is None else self.resident.join(parts)

    def to_host(self, parts: list[tuple[Any, int]]) -> np.ndarray:
        """Samples' rows of a model output as the host array an answer carries."""
        return join_rows(parts) if self.resident is None else self.resident.to_host(parts)

    def run_resident(self, stage: int, feeds: Mapping[str, Any], *, owned: bool = False) -> dict[str, Any]:
        """``run`` on the served path: outputs stay on the device (OrtValues, or ``Rows`` where an in-place stage
        wrote over its input) when the device path is on. ``owned`` as in ``run``."""
        dev = self.resident
        if dev is None:
            return self.run(stage, feeds, owned=owned)
        graph = self.graphs.get(stage)
        if graph is not None and graph.covers(rows_of(next(iter(feeds.values())))):
            return graph.run(feeds)  # its outputs are copies: nothing is written over an input
        spec = self.manifest.stages[stage]
        step = self.inplace.get(stage) if owned else None
        over = feeds.get(step.input) if step is not None else None
        if over is not None and not isinstance(over, np.ndarray):  # a device tensor this batch owns
            try:
                out = dev.run(self.sessions[stage], dict(feeds), spec.outputs, over=(step.output, over),
                              options=self._run_options(stage))
            except Exception as e:
                raise InPlaceRunError(f"{type(e).__name__}: {e} (in-place stage: its input buffer was consumed)") \
                    from e
            return {step.output: out[0]}
        return dict(zip(spec.outputs, dev.run(self.sessions[stage], dict(feeds), spec.outputs,
                                              options=self._run_options(stage))))

    def run_all_resident(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``run_all`` through the served path (host answers): the load-time check and device profiling."""
        tensors: dict[str, Any] = dict(inputs)
        for spec in self.manifest.stages:
            tensors.update(self.run_resident(spec.index, {i.name: tensors[i.name] for i in spec.inputs}, owned=True))
        return {o: self.to_host([(tensors[o], k) for k in range(rows_of(tensors[o]))]) for o in self.output_names}

    def _build_graphs(self, buckets: tuple[int, ...], intra_op_threads: int) -> None:
        """Graphs for the stages that capture and answer as their plain runs (sessions/cuda_graphs.py), checked on
        a warm-up batch whose every stage input is recorded once on the host path."""
        dev = self.resident
        assert dev is not None
        capture = self.providers[0] == "CUDAExecutionProvider"
        tensors: dict[str, np.ndarray] = dict(self._valid_inputs(max(buckets), seed=5))
        for spec in self.manifest.stages:
            tensors.update(self.run(spec.index, {i.name: tensors[i.name] for i in spec.inputs}))
        specs = self.manifest.stages

        def open_session(index: int) -> Any:
            if not capture:
                return self.sessions[index]
            return make_session(self.dir / specs[index].file, self.providers, intra_op_threads, self.device_id,
                                cuda_graph=True, stream=self.stream)

        def warm_feeds(index: int, n: int) -> dict[str, Any]:
            return {i.name: dev.value(np.ascontiguousarray(tensors[i.name][:n])) for i in specs[index].inputs}

        def plain_run(index: int, feeds: dict[str, Any]) -> dict[str, Any]:
            return dict(zip(specs[index].outputs, dev.run(self.sessions[index], feeds, specs[index].outputs)))

        self.graphs, self.graphs_refused = build_graphs(
            [(s.index, s.name) for s in specs], open_session, dev, lambda i: specs[i].outputs, buckets,
            capture=capture, warm_feeds=warm_feeds, plain_run=plain_run)

    def fresh_copy(self, t: Any) -> Any:
        return t.copy() if self.resident is None else self.resident.fresh(t)

    def _check_resident(self, tensors: DeviceTensors) -> str | None:
        """None where the device path answers a warm-up batch bit for bit as the host path does, else why not.

        The batch is two samples from two arrays, so that the first stage joins them on the device (Concat) and
        later stages pass consecutive rows by pointer, as served. Integer inputs take the ranges split recorded
        (token ids, positions: a seq2seq step indexes tables with them), where it recorded them."""
        ref_in = self._valid_inputs(2, seed=7)
        try:
            want = self.run_all({k: v.copy() for k, v in ref_in.items()})
            self.resident = tensors
            parts = {k: [v[0:1].copy(), v[1:2].copy()] for k, v in ref_in.items()}
            first = {i.name: tensors.join([(parts[i.name][0], 0), (parts[i.name][1], 0)])
                     for i in self.manifest.stages[0].inputs if i.source is None}
            feeds = {**{k: v.copy() for k, v in ref_in.items()}, **first}
            got = self.run_all_resident(feeds)
        except Exception as e:  # noqa: BLE001 - any failure means: serve through host numpy
            return f"the device path failed on a warm-up batch ({type(e).__name__}: {e})"
        finally:
            self.resident = None
        for name, w in want.items():
            g = got[name]
            if g.shape != w.shape or g.dtype != w.dtype or g.tobytes() != w.tobytes():
                diff = (float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64))))
                        if g.shape == w.shape else float("nan"))
                return f"the device path's {name!r} differs from the host path's on a warm-up batch " \
                       f"(largest difference {diff:.3g})"
        return None

    def _valid_inputs(self, batch: int, seed: int) -> dict[str, np.ndarray]:
        """Random model inputs within the manifest's recorded ranges (``graph_inputs``), else ``sample_inputs``."""
        specs = self.manifest.raw.get("graph_inputs")
        if specs:
            from lazybatch.sessions.chain import random_feeds

            try:
                return random_feeds(specs, batch, np.random.default_rng(seed))
            except ConfigError:  # a type random_feeds cannot make: the plain samples
                pass
        return self.sample_inputs(batch, seed=seed)

    def timed(self, fn: Any) -> tuple[Any, float]:
        """``fn()`` and its time: device time from CUDA events on a shared stream (what the host measures there is
        the enqueue), wall time else."""
        if self.stream is not None:
            return self.stream.timed(fn)
        t0 = time.perf_counter()
        out = fn()
        return out, time.perf_counter() - t0

    def device_path_lines(self, no_graphs: str | None = None, no_stream: str | None = None) -> list[str]:
        """What the load log says of the device path, a line each: where stage tensors live between stages, which
        stages replay CUDA graphs, which stream they run on (``no_*``: why a path asked for was refused)."""
        lines = []
        if self.resident is not None:
            lines.append(f"stage tensors stay on the {self.resident.device} device between stages (device_tensors)")
        if self.resident_refused:
            lines.append(f"device_tensors off, serving through host numpy: {self.resident_refused}")
        if no_graphs:
            lines.append(f"cuda_graphs off: {no_graphs}")
        if self.graphs:
            lines.append(f"CUDA graphs for {len(self.graphs)} of {self.n_stages} stages, batch buckets "
                         f"{list(self.graph_buckets)} (cuda_graphs)")
        lines += [f"no CUDA graph for {why}" for why in self.graphs_refused]
        if no_stream:
            lines.append(f"shared_cuda_stream off: {no_stream}")
        if self.stream is not None:
            lines.append("every stage session on one CUDA stream, one run in flight (shared_cuda_stream)")
        return lines

    def release_arenas(self) -> None:
        """Make each stage's next run give back the arena memory it does not use (backend/memory.py): onnxruntime
        shrinks an arena only at the end of a run that asks it to."""
        self._shrink_pending = set(range(len(self.sessions)))

    def run_all(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The whole model, stage after stage, on one batch (reference and profiling)."""
        tensors: dict[str, np.ndarray] = dict(inputs)
        for spec in self.manifest.stages:  # owned: every non-model tensor here came from an earlier stage
            tensors.update(self.run(spec.index, {i.name: tensors[i.name] for i in spec.inputs}, owned=True))
        return {o: tensors[o] for o in self.output_names}

    def sample_inputs(self, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
        """Random model inputs of a batch (wildcard dims take the manifest's example_dims, else 1), for profiling
        and warm-up."""
        rng = np.random.default_rng(seed)
        out = {}
        for t in self.manifest.inputs:
            shape = (batch, *feed_shape(t.dims, t.example))
            if t.dtype.kind == "f":
                out[t.name] = rng.standard_normal(shape).astype(t.dtype)
            elif t.dtype.kind == "b":
                out[t.name] = rng.integers(0, 2, shape).astype(t.dtype)
            else:
                out[t.name] = rng.integers(0, 10, shape).astype(t.dtype)
        return out

    def profile(self, batch_sizes: Sequence[int], *, reps: int = 3, warmup: int = 1,
                provenance: str = "", rounds: int = 3) -> LatencyTable:
        """Every stage timed at every batch size, as a latency table (``stage_profile.profile_stages``)."""
        from .stage_profile import profile_stages

        return profile_stages(self, batch_sizes, reps=reps, warmup=warmup, provenance=provenance, rounds=rounds)
