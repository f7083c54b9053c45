"""The generic Triton Python-backend model of lazybatch.

A model directory's ``1/model.py`` is one line, ``from lazybatch.backend.model import TritonPythonModel``; everything
model-specific comes from that directory's ``config.pbtxt`` parameters (see ``config.PARAMETERS``).

Two modes:

- a scheduler policy (eager, lazy, oracle, graph, serial): ``execute`` validates and
  enqueues each request and returns ``None``; the scheduler thread answers each request later through its response
  sender with TRITONSERVER_RESPONSE_COMPLETE_FINAL. Triton keeps handing the instance new requests meanwhile, which
  is what lets LazyBatching regroup them at stage boundaries. A seq2seq model may be decoupled
  (``model_transaction_policy { decoupled: true }``): it then streams its tokens as they are made, each part a
  response without the final flag, the last one with it (backend/seq2seq.py).
- ``whole_graph``: no scheduler; the whole ONNX graph runs on whatever Triton's own ``dynamic_batching`` grouped
  into one ``execute`` call (the real-world graph-batching baseline).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from lazybatch.batcher.policies import parse_policy
from lazybatch.batcher.request import Status
from lazybatch.batcher.admission import QueuePolicy

from .settings import BackendSettings, parse_config_json
from .arbiter.sizing import default_device_group, lane_threads, solo_threads, usable_cores
from .request_parsing import parse_request_parameters, validate_request
from .faults import FaultInjector
from .metrics import INVALID, ModelMetrics, TritonMetricsExporter
from .model_kinds import MODEL_KINDS, executor_of, model_kind
from .responder import ResponseThread
from .stages import StageRunner

try:  # only importable inside the Triton Python backend stub
    import triton_python_backend_utils as pb_utils  # type: ignore
except ImportError:  # pragma: no cover - unit tests import this module without Triton
    pb_utils = None


def _error_code(status: Status) -> Any:
    te = pb_utils.TritonError
    name = {Status.CANCELLED: "CANCELLED", Status.UNAVAILABLE: "UNAVAILABLE", Status.ERROR: "INTERNAL"}.get(
        status, "INTERNAL")
    return getattr(te, name, getattr(te, "INTERNAL", None))


def _error_response(message: str, code_name: str = "INVALID_ARG") -> Any:
    te = pb_utils.TritonError
    code = getattr(te, code_name, None)
    err = te(message, code) if code is not None else te(message)
    return pb_utils.InferenceResponse(output_tensors=[], error=err)


def read_log(path: Path) -> list[list[str]]:
    """The comma-separated fields of every complete line of a stats log (``BatchLog``, ``CancelLog``).

    The backend appends while benchmarks and tests read, so the text after the last newline may be a line still
    being written: it is left for the next read. A missing file reads as no lines."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    return [line.split(",") for line in text[:text.rfind("\n") + 1].splitlines() if line]


class BatchLog:
    """One CSV line per executed batch (unix time at its end, stage, batch size, onnxruntime seconds), appended to
    ``LAZYBATCH_STATS_DIR/<model>.batches.csv``: what benchmarks plot as batch size over time. Best effort."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file: Any = None

    def record(self, stage: int, size: int, seconds: float) -> None:
        self._line(f"{time.time():.6f},{stage},{size},{seconds:.6f}")

    def _line(self, text: str) -> None:
        try:
            with self._lock:
                if self._file is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._file = self.path.open("ab", buffering=0)
                self._file.write((text + "\n").encode())  # one unbuffered append per line: readers see whole lines
        except OSError as e:
            print(f"lazybatch: cannot write {self.path.name}: {e}", file=sys.stderr)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


class CancelLog(BatchLog):
    """One CSV line per CANCELLED answer (unix time as it is sent, the client's request id), appended to
    ``LAZYBATCH_STATS_DIR/<model>.cancels.csv``: a client that cancels gets its own answer at once from its gRPC
    library, so when the server answered is only seen here (benchmarks/bench_cancel.py). Best effort."""

    def record_cancel(self, request_id: str) -> None:
        self._line(f"{time.time():.6f},{request_id.replace(',', ';')}")


class _Latch:
    """Counts the answers still owed to one execute call (``batch_per_execute``)."""

    def __init__(self, n: int) -> None:
        self._left = n
        self._cond = threading.Condition()

    def count_down(self) -> None:
        with self._cond:
            self._left -= 1
            if self._left <= 0:
                self._cond.notify_all()

    def wait(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._left <= 0)


class TritonPythonModel:
    """Serves a staged ONNX model under a batching policy (see the module docstring)."""

    def initialize(self, args: dict[str, Any]) -> None:
        cfg = parse_config_json(args["model_config"])
        version_dir = Path(args["model_repository"]) / str(args["model_version"])
        self.settings = s = BackendSettings.from_config(cfg, version_dir)
        self.metrics: ModelMetrics | None = None
        self.exporter: TritonMetricsExporter | None = None
        self.runtime = None
        self.device_group = ""  # the device group the model is in ("": none; docs/colocation.md)
        self.membership: Any = None  # its place there (backend/arbiter/join.py): solo, or the arbiter's gate
        self.session = None
        self.seq2seq: Any = None  # a seq2seq.Seq2SeqSpec for encoder-decoder models
        self._responder: ResponseThread | None = None  # sends the answers (response_thread, backend/responder.py)
        self._latches: dict[int, _Latch] = {}  # batch_per_execute: request -> its execute call's latch
        self.fused: str | None = None  # why the stages run as one whole-graph pass (fuse_stages), if they do
        self.solo_threads = 0  # a grouped model's whole-graph threads alone on the device (arbiter/sizing.py solo_threads)
        self.whole_wide = False  # its whole graph was made that wide (model_kinds._whole_graph_for_spans)
        self.segment_dir: Path | None = None  # fuse_segments: the merged segment files
        stats_dir = os.environ.get("LAZYBATCH_STATS_DIR")  # where the runtime's own statistics go (benchmarks)
        self._stats_path = Path(stats_dir) / f"{s.name}.json" if stats_dir else None
        self._batch_log = BatchLog(Path(stats_dir) / f"{s.name}.batches.csv") if stats_dir else None
        self._cancel_log = CancelLog(Path(stats_dir) / f"{s.name}.cancels.csv") if stats_dir else None
        # the group first: its lanes size the onnxruntime pool (several lanes: the cores shared among them)
        self.device_group = "" if s.whole_graph else self._device_group(cfg, args)
        if self.device_group:
            cores = usable_cores()
            threads = lane_threads(s.intra_op_threads, s.device_lanes, cores)
            if threads != s.intra_op_threads:
                print(f"lazybatch: {s.name}: intra_op_threads {threads} (device group {self.device_group!r} runs "
                      f"{s.device_lanes} lanes on {cores} cores; set intra_op_threads to choose)",
                      file=sys.stderr)
                s.intra_op_threads = threads
            self.solo_threads = solo_threads(s.device_solo_intra_op_threads, s.intra_op_threads, cores)
            if self.solo_threads:  # the whole graph's own pool beside the stages': pools per session
                s.use_per_session_threads = True
        # Inside Triton a model instance is a stub process of its own: one pool for all its sessions. Outside it
        # (in-process tests, embedding) the process is someone else's, and the switch would refuse their sessions.
        if not s.use_per_session_threads and pb_utils is not None:
            from lazybatch.sessions.threads import use_global_thread_pool

            use_global_thread_pool(s.intra_op_threads)
        if s.use_env_allocators and pb_utils is not None:  # one CPU arena for every session (sessions/arena.py)
            from lazybatch.sessions.arena import use_shared_arena

            use_shared_arena()
        # the options of every request that sends no parameters (most do not): one object, shared and never
        # written, so that such a request skips their parsing on its path (a few us a call, in-process, ad hoc)
        plain, _ = parse_request_parameters("", s.sla_ms)  # no text: the model's SLA, never an error
        self._plain_options = dataclasses.replace(plain, priority=s.request_level(0)[0])
        if s.whole_graph:
            kind, spec, runner = "whole_graph", None, None
        else:
            spec = parse_policy(s.policy)
            if not spec.entry.batches and s.scheduler_max_batch_size != 1:  # one request at a time (serial)
                s.scheduler_max_batch_size = 1
            runner = StageRunner(s.stage_dir, execution_provider=s.execution_provider,
                                 intra_op_threads=s.intra_op_threads, inplace_residuals=s.inplace_residuals)
            kind = model_kind(cfg, runner)
        built = MODEL_KINDS[kind](self, cfg, spec, runner)  # backend/model_kinds.py
        if built is None:  # no scheduler
            return
        runner, table, policy, runtime_cls, whole = built
        self._responder = ResponseThread(self._respond, name=f"{s.name}-responder") if s.response_thread else None
        try:
            self.runtime = runtime_cls(runner, table, policy, self._responder or self._respond,
                                       is_cancelled=self._is_cancelled,
                                       cancel_poll_s=s.cancel_poll_ms / 1e3, name=s.name,
                                       on_idle=self._write_stats,
                                       on_batch=self._batch_log.record if self._batch_log else None)
            inline_ok = False
            if whole is not None:
                self.runtime.whole_runner = whole
                self.runtime.whole_wide = self.whole_wide
                self.runtime.inline = inline_ok = self._inline_allowed(cfg)
            if "boundary_cost_us" in spec.params:  # fixed by the config: not measured
                self.runtime.measure_boundary_cost = False
            self._configure_production(self.runtime)
            if self.device_group:  # co-located models: the device's decisions are the group's arbiter's
                from .arbiter.join import Membership

                metrics = self.metrics

                def on_gate(gate: Any) -> None:  # its device time and wait, read at each push
                    if metrics is not None:
                        metrics.device_source = gate

                self.membership = Membership(self.runtime, self.device_group, Path(args["model_repository"]).parent,
                                             s.name, weight=s.device_weight, priority=s.device_priority_level,
                                             max_queue_size=s.device_max_queue_size, inline_ok=inline_ok,
                                             lanes=s.device_lanes, on_gate=on_gate)
        except BaseException:
            # A bad admission or fault-injection parameter fails the load: stop the scheduler and responder threads
            # started above, so that a model that did not load leaves nothing running in the stub.
            self.finalize()
            raise

    def _inline_allowed(self, cfg: Any) -> bool:
        """Whether whole passes may run in execute (``BackendRuntime.run_inline``): only where Triton's dynamic
        batcher hands execute everything that queued meanwhile (without it, each execute would hold one request
        and inline passes would serve the queue one by one), with no queue delay of its own (a delay would come on
        top of ours), and where nothing needs the scheduler to see every request (REJECT admission, fault
        injection)."""
        s = self.settings
        why = None
        if not cfg.HasField("dynamic_batching"):
            why = "config.pbtxt has no dynamic_batching section"
        elif cfg.dynamic_batching.max_queue_delay_microseconds:
            why = "dynamic_batching has a max_queue_delay_microseconds"
        elif s.timeout_action == "REJECT" or s.max_queue_size:
            why = "admission control (max_queue_size, timeout_action: REJECT) sees every request"
        elif s.fault_injection:
            why = "fault_injection is set"
        elif s.decoupled:
            why = "the model is decoupled (execute may not return responses)"
        if why:
            print(f"lazybatch: {s.name}: whole passes run through the scheduler thread, not inline ({why})",
                  file=sys.stderr)
        return why is None

    @property
    def gate(self) -> Any:
        """The arbiter gate of a grouped model once it joined the arbiter (None: solo, or no group)."""
        return self.membership.gate if self.membership is not None else None

    def _device_group(self, cfg: Any, args: dict[str, Any]) -> str:
        """The device group this instance joins: the config's, or its device's with ``auto`` ("": none, said why)."""
        s = self.settings
        if s.device_group:
            return s.device_group
        if not s.device_group_auto or s.batch_per_execute:  # batch_per_execute: Triton's batcher runs whole executions
            return ""
        group, why = default_device_group(cfg, str(args.get("model_instance_kind", "CPU")),
                                          int(args.get("model_instance_device_id", 0) or 0), executor_of(cfg))
        if why:
            print(f"lazybatch: {s.name}: device_group auto: on no shared device ({why})", file=sys.stderr)
        return group

    def _configure_production(self, runtime: Any) -> None:
        """Admission control, metrics and fault injection (docs/operations.md), set before any request arrives
        (Triton sends none until initialize has returned)."""
        s = self.settings
        runtime.scheduler.set_queue_policy(QueuePolicy(s.max_queue_size, s.timeout_action))
        stage_names = [st.name for st in runtime.runner.manifest.stages]
        runtime.fault = FaultInjector.parse(s.fault_injection, stage_names)
        runtime.memory_release_s = s.memory_release_ms / 1e3
        if s.metrics:
            self.metrics = ModelMetrics(s.name, stage_names, s.scheduler_max_batch_size,
                                        seq2seq=self.seq2seq is not None,  # + the decoder loop's families
                                        device=bool(self.device_group))  # + the shared device's (arbiter gate)
            if pb_utils is not None:  # outside Triton (unit tests) the bookkeeping runs, nothing is exported
                self.exporter = TritonMetricsExporter(self.metrics, pb_utils, s.metrics_interval_ms / 1e3)
            runtime.metrics = self.metrics

    # ------------------------------------------------------------------ Triton calls
    def execute(self, requests: list[Any]) -> list[Any] | None:
        if self.runtime is None:
            return self._execute_whole_graph(requests)
        s = self.settings
        good: list[tuple[Any, dict[str, np.ndarray], int, Any]] = []
        for request in requests:
            tensors = {t.name(): t.as_numpy() for t in request.inputs()}
            batch, err = (self.seq2seq.validate(tensors, s.max_batch_size) if self.seq2seq is not None else
                          validate_request(tensors, s.inputs, s.max_batch_size, s.allow_nan))
            opts = None
            if err is None:
                text = request.parameters()
                if not text or text == "{}":  # no scheduling parameters: the model's defaults, already checked
                    opts = self._plain_options
                else:
                    opts, err = parse_request_parameters(text, s.sla_ms)
                    if err is None:
                        opts.priority, err = s.request_level(opts.priority)
                    if err is None:
                        err = self.runtime.check_deadline(opts)
            if err is None:
                good.append((request, tensors, batch, opts))
                continue
            if self.metrics is not None:
                self.metrics.request_done(INVALID)
            request.get_response_sender().send(_error_response(err),
                                               flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if not good:
            return None
        outputs = None
        if self.runtime.inline:
            def early(i: int, out: Any) -> None:  # a pass before the group's last: its answers go now
                good[i][0].get_response_sender().send(self._response(out),
                                                      flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            outputs = self.runtime.run_inline([(g[1], g[2]) for g in good], early, [g[3] for g in good])
        if outputs is not None:  # the rest answered with the end of execute, one message (as Triton's backends)
            if len(good) == len(requests):  # every request valid: the answers in the requests' order
                return [None if out is None else self._response(out) for out in outputs]
            answers = {id(g[0]): self._response(out) for g, out in zip(good, outputs) if out is not None}
            return [answers.get(id(r)) for r in requests]
        latch = _Latch(len(good)) if s.batch_per_execute else None
        if latch is not None:  # counted down by _respond as each request is answered
            for g in good:
                self._latches[id(g[0])] = latch
        for (request, *_), err in zip(good, self.runtime.submit_group(good)):  # one arrival: seen together
            if err is not None:
                if latch is not None:
                    del self._latches[id(request)]
                    latch.count_down()
                if self.metrics is not None:
                    self.metrics.request_done(INVALID)
                request.get_response_sender().send(_error_response(err),
                                                   flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if latch is not None:
            # batch_per_execute: this group is Triton's batch, served to its end before Triton may call execute
            # again (the whole decode loop in one execute, as a model with its own loop under Triton's batcher)
            latch.wait()
        return None

    def finalize(self) -> None:
        if self.runtime is not None:
            self.runtime.close()  # answers every request it holds (queued to the responder)
        if self.membership is not None:
            self.membership.close()
        if self._responder is not None:
            self._responder.close()  # ... and those answers are sent before the model goes
        if self.exporter is not None:
            self.exporter.close()
        if self._batch_log is not None:
            self._batch_log.close()
        if self._cancel_log is not None:
            self._cancel_log.close()
        if self.segment_dir is not None:
            shutil.rmtree(self.segment_dir, ignore_errors=True)

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _response(out: "dict[str, np.ndarray] | str") -> Any:
        """An inline pass's answer: its outputs, or the error it failed with."""
        if isinstance(out, str):
            return _error_response(f"onnxruntime failed: {out}", "INTERNAL")
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, np.ascontiguousarray(v))
                                                          for k, v in out.items()])

    def _respond(self, request: Any, outputs: dict[str, np.ndarray] | None, status: Status,
                 error: str | None, final: bool = True) -> None:
        """Send an answer; ``final`` False is a streamed part of it (decoupled seq2seq models)."""
        if outputs is not None:
            resp = self._response(outputs)
            if not final:
                request.get_response_sender().send(resp)
                return
        else:
            te = pb_utils.TritonError
            code = _error_code(status)
            err = te(error or status.value, code) if code is not None else te(error or status.value)
            resp = pb_utils.InferenceResponse(output_tensors=[], error=err)
        # the id is read before the final send: after it the server may release the request
        rid = request.request_id() if status is Status.CANCELLED and self._cancel_log is not None else None
        latch = self._latches.pop(id(request), None)
        try:
            request.get_response_sender().send(resp, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        finally:
            if latch is not None:
                latch.count_down()
        if rid is not None:
            self._cancel_log.record_cancel(rid)

    @staticmethod
    def _is_cancelled(request: Any) -> bool:
        return bool(request.is_cancelled())

    def _write_stats(self, runtime: Any) -> None:
        """Statistics for benchmarks (LAZYBATCH_STATS_DIR), written whenever the scheduler goes idle."""
        if self._stats_path is None:
            return
        try:
            self._stats_path.parent.mkdir(parents=True, exist_ok=True)
            data = {"model": self.settings.name, "policy": self.settings.policy,
                    "scheduler": runtime.policy.describe(),  # with what it made of the table, e.g. its batch cap
                    "fused": self.fused,
                    **runtime.stats.as_dict(),
                    # the scheduler's decision counts: dispatch, preempt, merge, split, reject
                    "decisions": dict(runtime.scheduler.log.counts)}
            if hasattr(runtime.runner, "npu_stats"):
                data["npu"] = runtime.runner.npu_stats()
            gate = self.gate
            if gate is not None:  # a grouped model: its use of the shared device (the metrics' device families)
                data["device"] = {"device_s": gate.device_s, "wait_s": gate.wait_s, "grants": gate.grants,
                                  "leased": bool(gate.leased)}
            tmp = self._stats_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1))
            tmp.replace(self._stats_path)
        except OSError as e:  # statistics are best effort
            print(f"lazybatch: cannot write stats: {e}", file=sys.stderr)

    def _execute_whole_graph(self, requests: list[Any]) -> list[Any]:
        s = self.settings
        responses: list[Any] = [None] * len(requests)
        good: list[tuple[int, dict[str, np.ndarray], int]] = []
        for i, request in enumerate(requests):
            tensors = {t.name(): t.as_numpy() for t in request.inputs()}
            batch, err = validate_request(tensors, s.inputs, s.max_batch_size, s.allow_nan)
            if err is not None:
                responses[i] = _error_response(err)
            else:
                good.append((i, tensors, batch))
        if good:
            feeds = {t.name: np.concatenate([g[1][t.name] for g in good], axis=0) if len(good) > 1
                     else good[0][1][t.name] for t in s.inputs}
            try:
                t0 = time.perf_counter()
                outs = dict(zip(self.output_names, self.session.run(self.output_names, feeds)))
                if self._batch_log is not None:
                    self._batch_log.record(0, sum(g[2] for g in good), time.perf_counter() - t0)
            except Exception as e:
                for i, _, _ in good:
                    responses[i] = _error_response(f"onnxruntime failed: {e}", "INTERNAL")
            else:
                row = 0
                for i, _, b in good:
                    responses[i] = pb_utils.InferenceResponse(output_tensors=[
                        pb_utils.Tensor(k, np.ascontiguousarray(v[row:row + b])) for k, v in outs.items()])
                    row += b
        return responses
